package main

import (
	"bytes"
	"encoding/xml"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// svgText is a text element of an SVG document from plotSVG.
type svgText struct {
	text    string
	x, size float64 // start and font size, in points
	rotated bool    // inside a rotated group
}

var fontSizeRe = regexp.MustCompile(`font-size:([0-9.]+)px`)

// svgTextLayout returns the text elements of doc with where they start.
func svgTextLayout(t *testing.T, doc []byte) []svgText {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(doc))
	var (
		out     []svgText
		rotated []bool // per open g element
		cur     *svgText
	)
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("not valid XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			attr := func(name string) string {
				for _, a := range tok.Attr {
					if a.Name.Local == name {
						return a.Value
					}
				}
				return ""
			}
			switch tok.Name.Local {
			case "g":
				rotated = append(rotated, strings.Contains(attr("transform"), "rotate"))
			case "text":
				cur = &svgText{}
				cur.x, _ = strconv.ParseFloat(attr("x"), 64)
				if m := fontSizeRe.FindStringSubmatch(attr("style")); m != nil {
					cur.size, _ = strconv.ParseFloat(m[1], 64)
				}
				for _, r := range rotated {
					cur.rotated = cur.rotated || r
				}
			}
		case xml.CharData:
			if cur != nil {
				cur.text += string(tok)
			}
		case xml.EndElement:
			switch tok.Name.Local {
			case "g":
				rotated = rotated[:len(rotated)-1]
			case "text":
				out = append(out, *cur)
				cur = nil
			}
		}
	}
}

// TestPlotTextRoom: with a title longer than the figure, long legend
// entries and faults 100 ms apart, no horizontal text would run past the
// figure's right edge even in a fallback font fontSlack times wider than
// the metrics gonum measures with, the title shrank to fit, and the fault
// labels run vertically along their lines (so close ones do not collide).
func TestPlotTextRoom(t *testing.T) {
	tl := timeline{
		End:    3 * time.Second,
		Faults: []faultMark{{Kind: "redis-down", At: 1500 * time.Millisecond}, {Kind: "redis-up", At: 1600 * time.Millisecond}},
		Tenants: []tenantTimeline{
			{Tenant: "acme", Rate: mustRate(t, "5/1s"), Bound: 10, Admits: []event{{lo: 0, hi: time.Millisecond, n: 5}}},
			{Tenant: "globex", Rate: mustRate(t, "200000/1h"), Bound: 400000},
		},
	}
	title := "queuethrottle worker: " + strings.Repeat("a long description of the run, ", 4)
	doc, err := plotSVG(title, nil, tl)
	if err != nil {
		t.Fatal(err)
	}
	width := float64(figWidth / vg.Points(1))
	faultLabels := 0
	for _, tx := range svgTextLayout(t, doc) {
		if tx.rotated {
			if tx.text == "redis-down" || tx.text == "redis-up" {
				faultLabels++
			}
			continue
		}
		sty := draw.TextStyle{Font: font.From(plot.DefaultFont, vg.Length(tx.size)), Handler: plot.DefaultTextHandler}
		if end := tx.x + float64(sty.Width(tx.text))*fontSlack; end > width {
			t.Errorf("%q (%gpt) starts at %.1f and may end at %.1f, past the figure's %.0f", tx.text, tx.size, tx.x, end, width)
		}
		if tx.text == title && tx.size >= 14 {
			t.Errorf("the long title kept its size %gpt", tx.size)
		}
	}
	if want := len(tl.Faults) * len(tl.Tenants); faultLabels != want {
		t.Errorf("%d fault labels run vertically, want %d", faultLabels, want)
	}
}

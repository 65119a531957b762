package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// svgTexts parses an SVG document with encoding/xml and returns the
// character data of its text elements.
func svgTexts(t *testing.T, doc []byte) []string {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(doc))
	var texts []string
	inText, root := 0, ""
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not valid XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
			if tok.Name.Local == "text" {
				inText++
			}
		case xml.EndElement:
			if tok.Name.Local == "text" {
				inText--
			}
		case xml.CharData:
			if inText > 0 {
				texts = append(texts, string(tok))
			}
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return texts
}

// TestPlotSVG draws a made-up timeline of two tenants with a fault mark:
// the SVG is valid XML, names both tenants, the series of the legend, the
// units, and the fault's kind.
func TestPlotSVG(t *testing.T) {
	tl := timeline{
		End:    3 * time.Second,
		Faults: []faultMark{{Kind: "redis-down", At: 1500 * time.Millisecond}},
		Tenants: []tenantTimeline{
			{
				Tenant: "acme", Rate: mustRate(t, "5/1s"), Bound: 10,
				Admits:  []event{{lo: 0, hi: time.Millisecond, n: 5}, {lo: time.Second, hi: time.Second, n: 3}},
				Naks:    []returned{{at: 10 * time.Millisecond}, {at: 20 * time.Millisecond, reserved: true}},
				Holds:   []time.Duration{2 * time.Second},
				WaitP50: 12 * time.Millisecond, WaitP99: 340 * time.Millisecond,
			},
			{Tenant: "globex", Rate: mustRate(t, "20/1s"), Bound: 20},
		},
	}
	doc, err := plotSVG("a test run", nil, tl)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(svgTexts(t, doc), "\n")
	for _, want := range []string{"a test run", "acme: rate 5/1s (bound 10 cost units in any 1s); wait p50 12ms, p99 340ms", "globex: rate 20/1s (limit 20 cost units in any 1s)", "redis-down", "fault injected",
		"admitted per 100 ms", "admitted in the last 1s", "limit 5", "bucket bound 10", "NAKs/rejections per 100 ms",
		"that reserved a slot", "held on last delivery", "cost units", "time since the start of the run (s)"} {
		if !strings.Contains(all, want) {
			t.Errorf("the SVG has no text %q; texts:\n%s", want, all)
		}
	}
	if bytes.Contains(doc, []byte("font-family:Liberation Sans;")) {
		t.Error("a font without fallbacks")
	}
}

// TestPlotCompactPanels: a tenant without NAKs or holds gets a lower
// chart of compactHeight, not downHeight: the SVG is that much shorter.
func TestPlotCompactPanels(t *testing.T) {
	height := func(tt tenantTimeline) string {
		doc, err := plotSVG("t", nil, timeline{End: time.Second, Tenants: []tenantTimeline{tt}})
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`<svg[^>]* height="([0-9.]+)pt"`).FindSubmatch(doc)
		if m == nil {
			t.Fatalf("no height in %.200s", doc)
		}
		return string(m[1])
	}
	busy := tenantTimeline{Tenant: "a", Rate: mustRate(t, "5/1s"), Bound: 5, Naks: []returned{{at: time.Millisecond}}}
	quiet := tenantTimeline{Tenant: "a", Rate: mustRate(t, "5/1s"), Bound: 5}
	hb, hq := height(busy), height(quiet)
	want := fmt.Sprintf("%g", float64(figHeader+upHeight+compactHeight+panelGap))
	if hq != want || hb == hq {
		t.Errorf("heights %spt with NAKs, %spt without; want %spt without, and less than with", hb, hq, want)
	}
}

// TestTimelineBins: admissions, NAKs, reservations and holds land in the
// bins of their instants.
func TestTimelineBins(t *testing.T) {
	tt := tenantTimeline{
		Rate:   mustRate(t, "4/200ms"),
		Admits: []event{{lo: 0, hi: 0, n: 2}, {lo: 150 * time.Millisecond, hi: 150 * time.Millisecond, n: 1}, {lo: 250 * time.Millisecond, hi: 250 * time.Millisecond, n: 1}},
		Naks:   []returned{{at: 50 * time.Millisecond, reserved: true}, {at: 60 * time.Millisecond}, {at: 320 * time.Millisecond}},
		Holds:  []time.Duration{310 * time.Millisecond},
	}
	end := 350 * time.Millisecond
	for _, tc := range []struct {
		name string
		got  []float64
		want string
	}{
		{"admitted", tt.admittedPer(100*time.Millisecond, end), "[2 1 1 0]"},
		{"in window", tt.inWindow(100*time.Millisecond, end), "[2 3 2 1]"},
		{"naks", tt.naksPer(100*time.Millisecond, end, false), "[2 0 0 1]"},
		{"reserved", tt.naksPer(100*time.Millisecond, end, true), "[1 0 0 0]"},
		{"holds", tt.holdsPer(100*time.Millisecond, end), "[0 0 0 1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := strings.Join(strings.Fields(strings.Trim(strings.TrimSpace(fmtFloats(tc.got)), "[]")), " "); "["+got+"]" != tc.want {
				t.Errorf("got [%s], want %s", got, tc.want)
			}
		})
	}
}

func fmtFloats(vs []float64) string {
	b, _ := json.Marshal(vs)
	return strings.ReplaceAll(string(b), ",", " ")
}

func TestSparkline(t *testing.T) {
	tests := []struct {
		name   string
		values []float64
		top    float64
		want   string
	}{
		{"levels", []float64{0, 1, 10, 20, 40}, 20, " ▁▄██"},
		{"no top", []float64{0, 3}, 0, "  "},
		{"empty", nil, 20, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sparkline(tt.values, tt.top); got != tt.want {
				t.Errorf("sparkline(%v, %v) = %q, want %q", tt.values, tt.top, got, tt.want)
			}
		})
	}
}

// TestRunPlot: a short run with -plot writes a valid SVG naming every
// tenant, and a self-contained HTML page; the summary has a sparkline per
// tenant and the progress a line per tenant against its limit.
func TestRunPlot(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"run.svg", "run.html"} {
		t.Run(name, func(t *testing.T) {
			cfg := defaultConfig()
			cfg.JobsPath = writeJobs(t, 12, "5/200ms", 4)
			cfg.Rate = "3/200ms"
			cfg.Timeout = 20 * time.Second
			cfg.Progress = 100 * time.Millisecond
			cfg.Plot = filepath.Join(dir, name)
			var out bytes.Buffer
			if err := run(t.Context(), cfg, &out); err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			doc, err := os.ReadFile(cfg.Plot)
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasSuffix(name, ".html") {
				if !bytes.HasPrefix(doc, []byte("<!DOCTYPE html>")) {
					t.Errorf("not an HTML page: %.40q", doc)
				}
				if m := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?https?://`).Find(doc); m != nil {
					t.Errorf("the page loads %q from the network", m)
				}
				if bytes.Contains(doc, []byte("<script")) {
					t.Error("the page has a script")
				}
				i, j := bytes.Index(doc, []byte("<svg")), bytes.LastIndex(doc, []byte("</svg>"))
				if i < 0 || j < i {
					t.Fatal("no inline SVG")
				}
				doc = doc[i : j+len("</svg>")]
			}
			all := strings.Join(svgTexts(t, doc), "\n")
			for _, tenant := range []string{"burst", "light"} {
				if !regexp.MustCompile(tenant + `: rate .*; wait p50 \S+, p99 \S+`).MatchString(all) {
					t.Errorf("the plot does not name tenant %s with its waits", tenant)
				}
			}
			if !regexp.MustCompile(`-reservations 1m0s: OK: all 16 jobs handled exactly once`).MatchString(all) {
				t.Errorf("the plot's title has no verdict:\n%s", all)
			}
			s := out.String()
			for _, want := range []string{"plot written to " + cfg.Plot, "admissions per second over the run", "  burst |", "  light |", "handled/s in the last window, of the limit: burst "} {
				if !strings.Contains(s, want) {
					t.Errorf("output lacks %q:\n%s", want, s)
				}
			}
		})
	}
}

func TestPlotPath(t *testing.T) {
	cfg := defaultConfig()
	cfg.Plot = "run.png"
	if err := run(t.Context(), cfg, io.Discard); err == nil || !strings.Contains(err.Error(), ".svg or .html") {
		t.Errorf("run with -plot run.png: %v", err)
	}
}

// TestRecorderTimeline: what the recorder gets (admissions, NAKs reserved
// or not, holds once per message, a fault) comes out in its timeline at
// the offsets from the start, and in the plot.
func TestRecorderTimeline(t *testing.T) {
	start := time.Now()
	rec := newRecorder(start, 2)
	rec.published("a", "a1", 1)
	rec.admitted("a", "", 1, start.Add(10*time.Millisecond), start.Add(12*time.Millisecond))
	rec.nak("a", start.Add(20*time.Millisecond), true)
	rec.rejected("a", "a1", start.Add(30*time.Millisecond), false)
	rec.hold("a", 1, start.Add(40*time.Millisecond))
	rec.hold("a", 1, start.Add(50*time.Millisecond)) // a heartbeat of the same message
	rec.fault("nats-restart", start.Add(60*time.Millisecond))
	tl := rec.timeline(func(string) throttle.Rate { return mustRate(t, "5/1s") }, limiterSpec{})
	if len(tl.Tenants) != 1 {
		t.Fatalf("tenants %+v", tl.Tenants)
	}
	a := tl.Tenants[0]
	if len(a.Admits) != 1 || a.Admits[0].lo != 10*time.Millisecond || a.Admits[0].hi != 12*time.Millisecond {
		t.Errorf("admits %+v", a.Admits)
	}
	if want := []returned{{20 * time.Millisecond, true}, {30 * time.Millisecond, false}}; !slices.Equal(a.Naks, want) {
		t.Errorf("naks %+v, want %+v", a.Naks, want)
	}
	if !slices.Equal(a.Holds, []time.Duration{40 * time.Millisecond}) {
		t.Errorf("holds %v", a.Holds)
	}
	if !slices.Equal(tl.Faults, []faultMark{{Kind: "nats-restart", At: 60 * time.Millisecond}}) {
		t.Errorf("faults %+v", tl.Faults)
	}
	rep := rec.summarize([]job{{ID: "a1", Tenant: "a"}}, func(string) throttle.Rate { return mustRate(t, "5/1s") }, limiterSpec{})
	if ts := byTenant(rep)["a"]; ts.Naks != 2 || ts.Reserved != 1 || ts.Holds != 1 {
		t.Errorf("tenant a: %d naks, %d reserved, %d holds; want 2, 1, 1", ts.Naks, ts.Reserved, ts.Holds)
	}
	doc, err := plotSVG("recorded", nil, tl)
	if err != nil {
		t.Fatal(err)
	}
	if all := strings.Join(svgTexts(t, doc), "\n"); !strings.Contains(all, "nats-restart") {
		t.Error("the plot does not mark the fault")
	}
}

// TestRecordCompat: records of a worker process with and without the
// newer fields (at, reserved) apply; an old one is timed on arrival.
func TestRecordCompat(t *testing.T) {
	start := time.Now()
	rec := newRecorder(start, 1)
	ps := &processes{rec: rec, out: io.Discard}
	p := &process{id: 1}
	var buf bytes.Buffer
	rw := newRecordWriter(&buf)
	rw.nak("a", start.Add(5*time.Millisecond), true)
	rw.hold("a", 7, start.Add(6*time.Millisecond))
	lines := append(strings.Split(strings.TrimSpace(buf.String()), "\n"), `{"kind":"nak","tenant":"a"}`)
	for _, l := range lines {
		var r record
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		ps.apply(p, r)
	}
	a := rec.timeline(func(string) throttle.Rate { return mustRate(t, "5/1s") }, limiterSpec{}).Tenants[0]
	if len(a.Naks) != 2 || a.Naks[0] != (returned{5 * time.Millisecond, true}) || a.Naks[1].reserved || a.Naks[1].at <= 0 {
		t.Errorf("naks %+v", a.Naks)
	}
	if !slices.Equal(a.Holds, []time.Duration{6 * time.Millisecond}) {
		t.Errorf("holds %v", a.Holds)
	}
}

// TestGrafanaDashboard: the dashboard is JSON and queries the metrics by
// the names Prometheus shows, the Hybrid's too.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("../grafana/queuethrottle.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	all := strings.Join(exprs, "\n")
	for _, m := range []string{"throttle_decisions_total", "throttle_decision_duration_seconds_bucket", "throttle_store_errors_total", "throttle_outcome", "throttle_source", "throttle_key",
		"throttle_hybrid_decisions_total", "throttle_hybrid_redis_duration_seconds_bucket", "throttle_hybrid_redis_errors_total"} {
		if !strings.Contains(all, m) {
			t.Errorf("no panel queries %s", m)
		}
	}
}

// TestPlotPartner: with a partner, the last panel has its calls accepted
// in the last window (counted right, bin by bin), its quota as it
// changed, -partner's limit over time, and its 429s.
func TestPlotPartner(t *testing.T) {
	ms := time.Millisecond
	r := &partnerReport{
		Quota: mustRate(t, "25/1s"), Budget: mustRate(t, "100/1s"),
		After:  []quotaChange{{At: time.Second, Rate: mustRate(t, "10/1s")}},
		Limits: []int{100, 100, 23, 23, 23, 23, 23, 23, 23, 23, 23, 24},
		calls:  []partnerCall{{at: 0, ok: true}, {at: 50 * ms, ok: true}, {at: 150 * ms}, {at: 1050 * ms, ok: true}},
	}
	accepted, rejected, inWin, quota := partnerSeries(r, 12)
	for name, got := range map[string][]float64{"accepted": accepted, "rejected": rejected, "in the window": inWin, "quota": quota} {
		want := map[string][]float64{
			"accepted":      {2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0},
			"rejected":      {0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
			"in the window": {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1},
			"quota":         {25, 25, 25, 25, 25, 25, 25, 25, 25, 25, 10, 10},
		}[name]
		if !slices.Equal(got, want) {
			t.Errorf("%s per 100 ms: %v, want %v", name, got, want)
		}
	}
	doc, err := plotSVG("with a partner", r, timeline{End: 1200 * ms, Tenants: []tenantTimeline{{Tenant: "acme", Rate: mustRate(t, "5/1s"), Bound: 5}}})
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(svgTexts(t, doc), "\n")
	for _, want := range []string{"partner: quota 25/1s, 10/1s from t=1s; -partner 100/1s", "accepted in the last 1s", "the partner's quota", "-partner limit", "accepted per 100 ms", "answered 429 per 100 ms"} {
		if !strings.Contains(all, want) {
			t.Errorf("the SVG has no text %q; texts:\n%s", want, all)
		}
	}
}

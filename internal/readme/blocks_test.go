package readme

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
)

// block is a fenced code block of a Markdown file.
type block struct {
	line int    // 1-based line in the file of the block's first line of code
	info string // what follows the opening fence: "go", "output pkg.ExampleName", ""
	code string // the lines between the fences, each ending in "\n"
}

// lang returns the first word of the block's info string: "go", "output".
func (b block) lang() string {
	lang, _, _ := strings.Cut(b.info, " ")
	return lang
}

// arg returns what follows the first word of the info string, trimmed:
// the Example an output block names.
func (b block) arg() string {
	_, arg, _ := strings.Cut(b.info, " ")
	return strings.TrimSpace(arg)
}

// fencedBlocks returns the blocks of md fenced by "```" lines (indented or
// not, as in list items), in order. An unterminated block runs to the end
// of md.
func fencedBlocks(md []byte) []block {
	var (
		blocks []block
		cur    *block
		code   strings.Builder
	)
	sc := bufio.NewScanner(bytes.NewReader(md))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		fence := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(fence, "```"):
			cur = &block{line: n + 1, info: strings.TrimSpace(strings.TrimPrefix(fence, "```"))}
			code.Reset()
		case cur != nil && fence == "```":
			cur.code = code.String()
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			code.WriteString(line)
			code.WriteByte('\n')
		}
	}
	if cur != nil {
		cur.code = code.String()
		blocks = append(blocks, *cur)
	}
	return blocks
}

// goBlocks returns the blocks of md fenced by "```go" and "```", in order.
func goBlocks(md []byte) []block {
	var gos []block
	for _, b := range fencedBlocks(md) {
		if b.info == "go" {
			gos = append(gos, b)
		}
	}
	return gos
}

func TestGoBlocks(t *testing.T) {
	md := "# t\n```go\npackage a\n```\ntext\n```\nnot go\n```\n  ```go\nx\n\ny\n  ```\n```go\nz\n"
	got := goBlocks([]byte(md))
	want := []block{{3, "go", "package a\n"}, {10, "go", "x\n\ny\n"}, {15, "go", "z\n"}}
	if len(got) != len(want) {
		t.Fatalf("got %d blocks %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("block %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestFencedBlocks(t *testing.T) {
	md := "```go\npackage main\n```\nIt prints:\n```output\nhi\n```\n```output throttle.ExampleGate\nt=0s\n```\n```\ngo run .\n```\n"
	got := fencedBlocks([]byte(md))
	want := []block{
		{2, "go", "package main\n"},
		{6, "output", "hi\n"},
		{9, "output throttle.ExampleGate", "t=0s\n"},
		{12, "", "go run .\n"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d blocks %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("block %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if l, a := got[2].lang(), got[2].arg(); l != "output" || a != "throttle.ExampleGate" {
		t.Errorf("lang, arg = %q, %q; want output, throttle.ExampleGate", l, a)
	}
}

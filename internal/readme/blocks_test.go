package readme

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
)

// block is a fenced Go code block of a Markdown file.
type block struct {
	line int    // 1-based line in the file of the block's first line of code
	code string // the lines between the fences, each ending in "\n"
}

// goBlocks returns the blocks of md fenced by "```go" and "```", in order.
// An unterminated block runs to the end of md.
func goBlocks(md []byte) []block {
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
		case cur == nil && fence == "```go":
			cur = &block{line: n + 1}
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

func TestGoBlocks(t *testing.T) {
	md := "# t\n```go\npackage a\n```\ntext\n```\nnot go\n```\n  ```go\nx\n\ny\n  ```\n```go\nz\n"
	got := goBlocks([]byte(md))
	want := []block{{3, "package a\n"}, {10, "x\n\ny\n"}, {15, "z\n"}}
	if len(got) != len(want) {
		t.Fatalf("got %d blocks %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("block %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

package readme

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"go/doc"
	"go/format"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
)

const modulePath = "github.com/queuethrottle/queuethrottle"

// maxReadmeLines is the most lines README.md may have: it is the landing
// page, and the guides under docs/ carry the rest.
const maxReadmeLines = 320

// redisAddr is the address the programs of the guides dial. A program whose
// output a guide shows runs against a redis-server of its own instead.
const redisAddr = "localhost:6379"

func TestMain(m *testing.M) {
	code := m.Run()
	if mod.dir != "" {
		_ = os.RemoveAll(mod.dir)
	}
	os.Exit(code)
}

// root returns the directory of this module's go.mod.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil || !bytes.HasPrefix(gomod, []byte("module "+modulePath+"\n")) {
		t.Fatalf("%s is not the root of module %s: %v", dir, modulePath, err)
	}
	return dir
}

// docFile is a Markdown file whose Go blocks are compiled: README.md or a
// guide under docs/.
type docFile struct {
	name string // slash-separated, relative to the module root
	md   []byte
}

// docFiles returns README.md and docs/*.md, in that order.
func docFiles(t *testing.T) []docFile {
	t.Helper()
	dir := root(t)
	guides, err := filepath.Glob(filepath.Join(dir, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(guides)
	names := []string{"README.md"}
	for _, g := range guides {
		names = append(names, "docs/"+filepath.Base(g))
	}
	var files []docFile
	for _, name := range names {
		md, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, docFile{name, md})
	}
	return files
}

// goTool returns the go command: go test puts the one that runs this
// test first on PATH.
func goTool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command: %v", err)
	}
	return p
}

// snippet is a Go block of a Markdown file, with the output block that
// shows what it prints, if any.
type snippet struct {
	file string // README.md, docs/scheduling.md
	block
	output *block // a plain ```output block after it: what the program prints
}

// pos returns FILE:LINE of the snippet's first line of code.
func (s snippet) pos() string { return fmt.Sprintf("%s:%d", s.file, s.line) }

// dir returns the snippet's package directory in the snippet module.
func (s snippet) dir() string {
	name := strings.NewReplacer("/", "_", ".", "_", "-", "_").Replace(strings.ToLower(s.file))
	return fmt.Sprintf("%s_%04d", name, s.line)
}

// snippets returns the Go blocks of files, each with the plain output
// block that follows it (the next fenced block, with only prose between).
// An output block that names no Example and follows no Go block is an
// error at its line.
func snippets(files []docFile) ([]snippet, []string) {
	var (
		all  []snippet
		errs []string
	)
	for _, f := range files {
		var prev *block
		for _, b := range fencedBlocks(f.md) {
			switch {
			case b.info == "go":
				all = append(all, snippet{file: f.name, block: b})
			case b.lang() == "output" && b.arg() == "":
				if prev == nil || prev.info != "go" {
					errs = append(errs, fmt.Sprintf("%s:%d: an output block names no Example (```output pkg.ExampleName) and follows no Go block: nothing checks it", f.name, b.line))
					break
				}
				out := b
				all[len(all)-1].output = &out
			}
			prev = &b
		}
	}
	return all, errs
}

// mod is the module of every snippet, built once for the tests that need
// it.
var mod struct {
	once     sync.Once
	dir      string // temporary: the snippet module is dir/app, this checkout dir/queuethrottle
	snippets []snippet
	errs     []string // FILE:LINE errors of the blocks; the module is not built then
	err      error    // the module could not be set up or built
}

// snippetModule writes every Go block of README.md and docs/*.md as a
// program of its own in a new module (each file starts with a //line
// directive, so that compiler and vet errors name FILE:LINE), makes the
// module depend on this checkout with the go commands of README.md's
// block that says how (run as written, with this checkout linked as
// ../queuethrottle), and builds every program into dir/bin and vets them.
func snippetModule(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the programs of README.md and docs/; skipped with -short")
	}
	dir, files, goCmd := root(t), docFiles(t), goTool(t)
	mod.once.Do(func() { mod.err = buildSnippets(dir, files, goCmd) })
	for _, e := range mod.errs {
		t.Error(e)
	}
	if mod.err != nil {
		t.Fatal(mod.err)
	}
	if len(mod.errs) > 0 {
		t.FailNow()
	}
}

func buildSnippets(dir string, files []docFile, goCmd string) error {
	mod.snippets, mod.errs = snippets(files)
	if len(mod.snippets) == 0 {
		return fmt.Errorf("README.md and docs/*.md have no ```go blocks")
	}
	tmp, err := os.MkdirTemp("", "readmesnippets-")
	if err != nil {
		return err
	}
	mod.dir = tmp
	app := filepath.Join(tmp, "app")
	if err := os.Symlink(dir, filepath.Join(tmp, "queuethrottle")); err != nil {
		return err
	}
	fset := token.NewFileSet()
	for _, s := range mod.snippets {
		if _, err := parser.ParseFile(fset, "", s.code, parser.PackageClauseOnly); err != nil {
			mod.errs = append(mod.errs, fmt.Sprintf("%s: the Go block is not a complete file (a reader cannot compile it as written): %v", s.pos(), err))
			continue
		}
		if formatted, err := format.Source([]byte(s.code)); err == nil && string(formatted) != s.code {
			mod.errs = append(mod.errs, fmt.Sprintf("%s: the Go block is not gofmt-formatted; gofmt gives:\n%s", s.pos(), formatted))
		}
		src := fmt.Sprintf("//line %s\n%s", s.pos(), s.code)
		if err := writeFile(filepath.Join(app, s.dir(), "main.go"), []byte(src)); err != nil {
			return err
		}
	}
	if len(mod.errs) > 0 {
		return nil
	}

	// The module: go mod init, this checkout's go.sum (the checksums it
	// already trusts, so that no checksum database is asked), then the
	// README's own steps.
	steps, err := checkoutSteps(files[0].md)
	if err != nil {
		return err
	}
	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(app, "go.sum"), sum); err != nil {
		return err
	}
	run := func(args ...string) error {
		cmd := exec.Command(goCmd, args...)
		cmd.Dir = app
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s (in the module of the %d Go blocks of README.md and docs/): %v\n%s", strings.Join(args, " "), len(mod.snippets), err, out)
		}
		return nil
	}
	if err := run("mod", "init", "readmesnippets"); err != nil {
		return err
	}
	for _, args := range steps {
		if err := run(args...); err != nil {
			return fmt.Errorf("README.md's step to use the module from a checkout: %w", err)
		}
	}
	if err := run("build", "-o", filepath.Join(tmp, "bin")+string(filepath.Separator), "./..."); err != nil {
		return err
	}
	return run("vet", "./...")
}

// checkoutSteps returns the go commands of README.md's fenced block that
// makes a module use this one from a checkout (the block with "go mod
// edit -require=<this module>"), one argument list each, without the
// leading "go". Lines may continue with a trailing backslash; other lines
// and comments are not run.
func checkoutSteps(readme []byte) ([][]string, error) {
	for _, b := range fencedBlocks(readme) {
		if !strings.Contains(b.code, "go mod edit -require="+modulePath) {
			continue
		}
		var steps [][]string
		joined := strings.ReplaceAll(b.code, "\\\n", " ")
		for _, line := range strings.Split(joined, "\n") {
			line, _, _ = strings.Cut(line, "#")
			fields := strings.Fields(line)
			if len(fields) > 1 && fields[0] == "go" {
				steps = append(steps, fields[1:])
			}
		}
		return steps, nil
	}
	return nil, fmt.Errorf("README.md has no block with \"go mod edit -require=%s\": it must say how to use the module from a checkout", modulePath)
}

func writeFile(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// TestSnippetsCompile checks that every Go block of README.md and
// docs/*.md is a complete gofmt-formatted program that builds and passes
// go vet in a module set up as README.md tells a reader to (see
// snippetModule). Failures name FILE:LINE.
func TestSnippetsCompile(t *testing.T) {
	snippetModule(t)
	t.Logf("%d Go blocks built and vetted", len(mod.snippets))
}

// TestSnippetsPrint runs each program that a plain ```output block follows
// and checks that it prints that block (surrounding space trimmed). A
// program that dials localhost:6379 runs against a redis-server of its own
// (skipped without one on PATH, failed under CI=true).
func TestSnippetsPrint(t *testing.T) {
	snippetModule(t)
	ran := 0
	for _, s := range mod.snippets {
		if s.output == nil {
			continue
		}
		ran++
		t.Run(s.pos(), func(t *testing.T) {
			bin := filepath.Join(mod.dir, "bin", s.dir())
			if strings.Contains(s.code, `"`+redisAddr+`"`) {
				bin = buildWithRedis(t, s)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var stdout, stderr bytes.Buffer
			cmd := exec.CommandContext(ctx, bin)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("%s: the program failed: %v\n%s", s.pos(), err, stderr.Bytes())
			}
			if got, want := strings.TrimSpace(stdout.String()), strings.TrimSpace(s.output.code); got != want {
				t.Errorf("%s: the program prints\n%s\nbut %s:%d shows\n%s", s.pos(), got, s.file, s.output.line, want)
			}
		})
	}
	if ran == 0 {
		t.Fatal("no Go block of README.md or docs/ is followed by an ```output block")
	}
}

// buildWithRedis builds s with localhost:6379 replaced by the address of
// a redis-server of its own, started for t, and returns the program.
func buildWithRedis(t *testing.T, s snippet) string {
	t.Helper()
	srv := redistest.Start(t)
	dir := filepath.Join(mod.dir, "app", s.dir()+"_redis")
	src := fmt.Sprintf("//line %s\n%s", s.pos(), strings.ReplaceAll(s.code, `"`+redisAddr+`"`, `"`+srv.Addr()+`"`))
	if err := writeFile(filepath.Join(dir, "main.go"), []byte(src)); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "prog")
	cmd := exec.Command(goTool(t), "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: go build against %s: %v\n%s", s.pos(), srv.Addr(), err, out)
	}
	return bin
}

// example is an Example function of this module's tests.
type example struct {
	pos string // FILE:LINE of the function
	*doc.Example
}

// examples returns every Example of this module's tests by the name the
// docs give it: pkg.ExampleName, pkg the package name without _test.
func examples(t *testing.T) map[string]example {
	t.Helper()
	dir := root(t)
	have := map[string]example{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != dir && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := strings.TrimSuffix(f.Name.Name, "_test")
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		for _, ex := range doc.Examples(f) {
			pos := fmt.Sprintf("%s:%d", filepath.ToSlash(rel), fset.Position(ex.Code.Pos()).Line)
			have[pkg+".Example"+ex.Name] = example{pos, ex}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return have
}

// exampleRef is how the docs name an Example in prose: `pkg.ExampleName`.
var exampleRef = regexp.MustCompile("`([a-z][a-z0-9]*)\\.(Example[A-Za-z0-9_]*)`")

// TestExamplesNamed checks that every Example README.md or a guide names
// in prose (as `pkg.ExampleName`, pkg the package name) is a function of
// that package's tests.
func TestExamplesNamed(t *testing.T) {
	have := examples(t)
	n := 0
	for _, f := range docFiles(t) {
		for _, loc := range exampleRef.FindAllSubmatchIndex(f.md, -1) {
			n++
			ref := string(f.md[loc[2]:loc[3]]) + "." + string(f.md[loc[4]:loc[5]])
			if _, ok := have[ref]; !ok {
				t.Errorf("%s:%d names %s, which is not an Example of this module", f.name, lineAt(f.md, loc[0]), ref)
			}
		}
	}
	if n == 0 {
		t.Fatal("README.md and docs/ name no Example")
	}
}

// TestExampleOutputs checks each ```output pkg.ExampleName block of
// README.md and the guides against that Example's Output comment, which
// go test of its package checks against what the Example prints: the same
// text, surrounding space trimmed (for an "Unordered output", the same
// lines in any order).
func TestExampleOutputs(t *testing.T) {
	have := examples(t)
	n := 0
	for _, f := range docFiles(t) {
		for _, b := range fencedBlocks(f.md) {
			if b.lang() != "output" || b.arg() == "" {
				continue
			}
			n++
			ex, ok := have[b.arg()]
			switch {
			case !ok:
				t.Errorf("%s:%d: the output block names %s, which is not an Example of this module", f.name, b.line, b.arg())
			case ex.Output == "" && !ex.EmptyOutput:
				t.Errorf("%s:%d: %s (%s) has no Output comment, so go test does not check what it prints", f.name, b.line, b.arg(), ex.pos)
			case !sameOutput(b.code, ex.Output, ex.Unordered):
				t.Errorf("%s:%d shows\n%s\nbut %s (%s) prints\n%s", f.name, b.line, strings.TrimSpace(b.code), b.arg(), ex.pos, strings.TrimSpace(ex.Output))
			}
		}
	}
	if n == 0 {
		t.Fatal("README.md and docs/ have no ```output pkg.ExampleName block")
	}
}

// sameOutput reports whether got and want are the same output as go test
// compares an Example's.
func sameOutput(got, want string, unordered bool) bool {
	got, want = strings.TrimSpace(got), strings.TrimSpace(want)
	if !unordered {
		return got == want
	}
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	slices.Sort(g)
	slices.Sort(w)
	return slices.Equal(g, w)
}

func lineAt(md []byte, offset int) int { return bytes.Count(md[:offset], []byte("\n")) + 1 }

// TestReadmeLength keeps README.md a landing page.
func TestReadmeLength(t *testing.T) {
	md := docFiles(t)[0].md
	if n := bytes.Count(md, []byte("\n")); n > maxReadmeLines {
		t.Errorf("README.md has %d lines, more than %d: move the detail to a guide under docs/", n, maxReadmeLines)
	}
}

// linkTarget is the target of a Markdown link or image: ](target).
var linkTarget = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestLinks checks every relative link of the module's Markdown files:
// the file it points at exists, and so does the heading its #anchor names
// (GitHub's anchors: see anchors).
func TestLinks(t *testing.T) {
	dir := root(t)
	var mds []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != dir && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			mds = append(mds, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	anchorsOf := map[string]map[string]bool{}
	anchorsIn := func(name string) map[string]bool {
		if a, ok := anchorsOf[name]; ok {
			return a
		}
		md, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
		if err != nil {
			t.Fatal(err)
		}
		anchorsOf[name] = anchors(md)
		return anchorsOf[name]
	}
	checked := 0
	for _, name := range mds {
		md, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links(md) {
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				continue
			}
			checked++
			file, anchor, _ := strings.Cut(l.target, "#")
			target := name
			if file != "" {
				target = path.Join(path.Dir(name), file)
				if _, err := os.Stat(filepath.Join(dir, filepath.FromSlash(target))); err != nil {
					t.Errorf("%s:%d: the link to %s points at no file (%s)", name, l.line, l.target, target)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(target, ".md") && !anchorsIn(target)[anchor] {
				t.Errorf("%s:%d: the link to %s names no heading of %s", name, l.line, l.target, target)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link in the module's Markdown files")
	}
}

type link struct {
	line   int
	target string
}

// inlineCode is a code span on one line.
var inlineCode = regexp.MustCompile("`[^`]*`")

// links returns the link targets of md outside code blocks and code
// spans.
func links(md []byte) []link {
	var out []link
	fenced := false
	sc := bufio.NewScanner(bytes.NewReader(md))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range linkTarget.FindAllStringSubmatch(inlineCode.ReplaceAllString(line, ""), -1) {
			out = append(out, link{n, m[1]})
		}
	}
	return out
}

// anchors returns the anchors GitHub gives the headings of md: the
// heading's text in lower case, spaces as hyphens, without punctuation
// other than hyphens and underscores; a repeated one gets -1, -2, ...
func anchors(md []byte) map[string]bool {
	have := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	sc := bufio.NewScanner(bytes.NewReader(md))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case unicode.IsLetter(r) || unicode.IsNumber(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		a := b.String()
		if k := seen[a]; k > 0 {
			have[fmt.Sprintf("%s-%d", a, k)] = true
		} else {
			have[a] = true
		}
		seen[a]++
	}
	return have
}

func TestAnchors(t *testing.T) {
	md := "# Quick start: JetStream\n## `-report` JSON\n```\n# not a heading\n```\n## Faults\n## Faults\n"
	got := anchors([]byte(md))
	for _, a := range []string{"quick-start-jetstream", "-report-json", "faults", "faults-1"} {
		if !got[a] {
			t.Errorf("no anchor %q in %v", a, got)
		}
	}
	if got["not-a-heading"] {
		t.Errorf("a line in a code block made an anchor: %v", got)
	}
}

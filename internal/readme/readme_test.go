package readme

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const modulePath = "github.com/queuethrottle/queuethrottle"

// root returns the directory of this module's go.mod.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil || !bytes.HasPrefix(mod, []byte("module "+modulePath+"\n")) {
		t.Fatalf("%s is not the root of module %s: %v", dir, modulePath, err)
	}
	return dir
}

func readme(t *testing.T) []byte {
	t.Helper()
	md, err := os.ReadFile(filepath.Join(root(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return md
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

// TestSnippetsCompile writes every Go block of README.md as a program of
// its own in a new module that requires this one from the checkout (a
// replace directive, as the README tells readers to do), with this
// module's requirements and go.sum, and builds and vets them all at once.
// A block that is not a complete gofmt-formatted file, or does not
// compile, fails the test at its README line (each file starts with a
// //line directive).
func TestSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the README's programs; skipped with -short")
	}
	dir := root(t)
	blocks := goBlocks(readme(t))
	if len(blocks) == 0 {
		t.Fatal("README.md has no ```go blocks")
	}

	tmp := t.TempDir()
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	mod = bytes.Replace(mod, []byte("module "+modulePath+"\n"), []byte("module readmesnippets\n"), 1)
	mod = fmt.Appendf(mod, "\nrequire %s v0.0.0\n\nreplace %s => %s\n", modulePath, modulePath, dir)
	writeFile(t, filepath.Join(tmp, "go.mod"), mod)
	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(tmp, "go.sum"), sum)

	fset := token.NewFileSet()
	for _, b := range blocks {
		if _, err := parser.ParseFile(fset, "", b.code, parser.PackageClauseOnly); err != nil {
			t.Errorf("README.md:%d: the Go block is not a complete file (a reader cannot compile it as written): %v", b.line, err)
			continue
		}
		if formatted, err := format.Source([]byte(b.code)); err == nil && string(formatted) != b.code {
			t.Errorf("README.md:%d: the Go block is not gofmt-formatted; gofmt gives:\n%s", b.line, formatted)
		}
		src := fmt.Sprintf("//line README.md:%d\n%s", b.line, b.code)
		writeFile(t, filepath.Join(tmp, fmt.Sprintf("line%04d", b.line), "main.go"), []byte(src))
	}
	if t.Failed() {
		return
	}
	for _, args := range [][]string{{"build", "./..."}, {"vet", "./..."}} {
		cmd := exec.Command(goTool(t), args...)
		cmd.Dir = tmp
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s of the README's %d Go blocks: %v\n%s", strings.Join(args, " "), len(blocks), err, out)
		}
	}
}

// exampleRef is how the README names an Example: `pkg.ExampleName`.
var exampleRef = regexp.MustCompile("`([a-z][a-z0-9]*)\\.(Example[A-Za-z0-9_]*)`")

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestExamplesNamed checks that every Example the README names (as
// `pkg.ExampleName`, pkg the package name) is a function of that package's
// tests.
func TestExamplesNamed(t *testing.T) {
	dir := root(t)
	have := map[string]bool{}
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
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := strings.TrimSuffix(f.Name.Name, "_test")
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Example") {
				have[pkg+"."+fn.Name.Name] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	refs := exampleRef.FindAllSubmatch(readme(t), -1)
	if len(refs) == 0 {
		t.Fatal("README.md names no Example")
	}
	for _, m := range refs {
		if ref := string(m[1]) + "." + string(m[2]); !have[ref] {
			t.Errorf("README.md names %s, which is not an Example of this module", ref)
		}
	}
}

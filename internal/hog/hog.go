// Package hog starts CPU-bound processes beside a test, as other programs
// on a busy machine would be: unlike CPU-bound goroutines, which the Go
// scheduler shares out with the test's own, they compete for the cores
// with every thread of the test process and with redis-server alike.
//
// A process started by Start is the test binary itself, run again with
// an environment variable that this package's init reads: it spins from
// there and never runs a test. So a test binary that imports hog serves
// as its own hog, and needs nothing else installed.
package hog

import (
	"os"
	"os/exec"
	"testing"
)

// env is the environment variable that makes a test binary a hog.
const env = "QUEUETHROTTLE_HOG"

func init() {
	if os.Getenv(env) == "1" {
		_, _ = os.Stdout.Write([]byte{'\n'}) // Start waits for it
		spin()
	}
}

// spin never returns.
func spin() {
	x := 0
	for {
		x++
	}
}

// Start starts n CPU-bound processes, and returns once they all spin; it
// kills them at t's cleanup (and, on Linux, when the test process dies).
// It fails t if one cannot start.
func Start(t testing.TB, n int) {
	t.Helper()
	for range n {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), env+"=1")
		cmd.SysProcAttr = sysProcAttr()
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatalf("hog: %v", err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatalf("hog: %v", err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		if _, err := out.Read(make([]byte, 1)); err != nil {
			t.Fatalf("hog: no word from the process: %v", err)
		}
	}
}

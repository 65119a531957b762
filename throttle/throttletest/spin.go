package throttletest

import (
	"runtime"
	"sync"
)

// Spin starts n CPU-bound goroutines, as other work on the machine would
// be, and returns the function that stops them and waits for them.
func Spin(n int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := 0
			for {
				select {
				case <-done:
					return
				default:
				}
				for i := range 100_000 {
					x += i
				}
				runtime.Gosched()
			}
		}()
	}
	return func() { close(done); wg.Wait() }
}

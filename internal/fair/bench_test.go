package fair

import (
	"strconv"
	"testing"
)

// BenchmarkArriveDone is one message's whole life in the scheduler (an
// arrival granted at once, then its end) with keys active keys sharing
// 16 handlers, each key a message at a time: the cost of a decision as
// the active keys grow (it should grow with their logarithm, classifying
// every 20 ms aside).
func BenchmarkArriveDone(b *testing.B) {
	for _, keys := range []int{1, 100, 10_000} {
		b.Run("keys="+strconv.Itoa(keys), func(b *testing.B) {
			s, _ := New(Config{Handlers: 16})
			names := make([]string, keys)
			for i := range names {
				names[i] = "tenant-" + strconv.Itoa(i)
			}
			// Every key has a message waiting, so that each decision picks
			// among them all.
			for _, n := range names {
				s.Arrive(n, Arrival{})
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				t := s.Arrive(names[i%keys], Arrival{})
				select {
				case <-t.Granted():
					t.Done()
				default:
					t.Leave(Block{})
				}
			}
		})
	}
}

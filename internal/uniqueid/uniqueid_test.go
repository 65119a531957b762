package uniqueid

import (
	"strings"
	"sync"
	"testing"
)

// TestUnique: ids of two Sources and many goroutines never repeat, and
// carry the tag.
func TestUnique(t *testing.T) {
	a, err := New("x:")
	if err != nil {
		t.Fatal(err)
	}
	b, err := New("x:")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	var wg sync.WaitGroup
	for _, s := range []*Source{a, b, a, b} {
		wg.Go(func() {
			for range 1000 {
				id := s.Next()
				mu.Lock()
				if seen[id] || !strings.HasPrefix(id, "x:") {
					t.Errorf("id %q repeated or without its tag", id)
				}
				seen[id] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

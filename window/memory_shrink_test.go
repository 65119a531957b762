package window_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
	"github.com/queuethrottle/queuethrottle/window"
)

// heapInuse returns HeapInuse after two collections.
func heapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestMemoryGivesBackSpike checks that a spike of 200k keys that leave
// the window gives its memory back while 2k other keys stay active: the
// sweep rebuilds the shards' maps, so that after it the heap holds less
// than a tenth of what the spike added (1% measured). Without the rebuild
// the maps keep their tables: 20% of the spike, 7 MiB for 200k keys (a Go
// map never shrinks, unless it empties completely).
func TestMemoryGivesBackSpike(t *testing.T) {
	const keys, every = 200_000, 100
	clock := throttletest.NewClock(throttletest.T0)
	m, err := window.NewMemory(throttle.PerSecond(10), window.WithClock(clock))
	require.NoError(t, err)
	ctx := context.Background()
	names := make([]string, keys+keys/every)
	for i := range names {
		names[i] = fmt.Sprint("key-", i)
	}
	allow := func(names []string) {
		t.Helper()
		for _, k := range names {
			if _, err := m.Allow(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
	}
	spikeKeys, liveKeys := names[:keys], names[keys:]
	base := heapInuse()
	allow(spikeKeys)
	require.Equal(t, keys, m.Len())
	peak := heapInuse()

	// 1% more keys become active (their state allocated apart from the
	// spike's, so that what the test sees is the maps, not fragmentation);
	// the spike's keys leave the window, and the next decision in each
	// shard sweeps them.
	clock.Advance(600 * time.Millisecond)
	allow(liveKeys)
	clock.Advance(600 * time.Millisecond)
	allow(liveKeys)
	require.Equal(t, len(liveKeys), m.Len())
	after := heapInuse()
	runtime.KeepAlive(names)
	runtime.KeepAlive(m)
	spike := int64(peak) - int64(base)
	kept := int64(after) - int64(base)
	t.Logf("HeapInuse: base %d KiB, peak %d KiB (+%d KiB), after the sweep %d KiB (+%d KiB, %.0f%% of the spike)",
		base>>10, peak>>10, spike>>10, after>>10, kept>>10, 100*float64(kept)/float64(spike))
	require.Greater(t, spike, int64(10<<20), "the spike should take more than 10 MiB")
	require.Less(t, kept, spike/10, "after the sweep the heap should keep less than a tenth of the spike")
}

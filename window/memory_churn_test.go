package window_test

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/queuethrottle/queuethrottle/internal/janitor"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
	"github.com/queuethrottle/queuethrottle/window"
)

// TestMemoryChurnKeepsLimits: a million distinct keys (a client minting
// keys) beside one key at 10/min: the limited key is admitted exactly as
// without the churn (10, then nothing for the rest of its minute), the
// keys beyond the cap are refused with ErrTooManyKeys, and the Memory
// holds no more than its WithMaxKeys.
func TestMemoryChurnKeepsLimits(t *testing.T) {
	const maxKeys = 100_000
	clock := throttletest.NewClock(throttletest.T0)
	m, err := window.NewMemory(throttle.PerMinute(10), window.WithClock(clock), window.WithMaxKeys(maxKeys))
	require.NoError(t, err)
	ctx := context.Background()
	buf := []byte("key-")
	limited, refused := 0, 0
	for i := range 1_000_000 {
		if i%20_000 == 0 { // 50 rounds over 2.5 s
			clock.Advance(50 * time.Millisecond)
			d, err := m.AllowN(ctx, "limited", 1)
			require.NoError(t, err)
			if d.Allowed {
				limited++
			}
		}
		key := string(strconv.AppendInt(buf[:4], int64(i), 10))
		d, err := m.AllowN(ctx, key, 1)
		switch {
		case errors.Is(err, throttle.ErrTooManyKeys):
			refused++
		case err != nil || !d.Allowed:
			t.Fatalf("key %d: %+v, %v; want admitted (a new key) or refused", i, d, err)
		}
	}
	require.Equal(t, 10, limited, "the limited key beside the churn: its 10 per minute")
	require.LessOrEqual(t, m.Len(), maxKeys)
	require.GreaterOrEqual(t, refused, 1_000_000-maxKeys)
	require.Equal(t, int64(refused), m.Refused())
}

// TestMemoryJanitor: keys whose window has passed are forgotten by the
// janitor without any new decision, and a Memory nobody holds is
// collected with no goroutine left behind.
func TestMemoryJanitor(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	defer janitor.SetPeriod(20 * time.Millisecond)()
	clock := throttletest.NewClock(throttletest.T0)
	m, err := window.NewMemory(throttle.PerSecond(10), window.WithClock(clock))
	require.NoError(t, err)
	ctx := context.Background()
	for i := range 10_000 {
		_, err := m.AllowN(ctx, "k"+strconv.Itoa(i), 1)
		require.NoError(t, err)
	}
	clock.Advance(500 * time.Millisecond)
	time.Sleep(100 * time.Millisecond) // a few sweeps: every log still counts
	require.Equal(t, 10_000, m.Len())
	clock.Advance(time.Second)
	require.Eventually(t, func() bool { return m.Len() == 0 }, 5*time.Second, 5*time.Millisecond,
		"the janitor forgets the keys once their window has passed")
	w := weak.Make(m)
	m = nil
	require.Eventually(t, func() bool { runtime.GC(); return w.Value() == nil }, 5*time.Second, 5*time.Millisecond,
		"a Memory nobody holds is collected")
	goleak.VerifyNone(t, ignore)
}

func TestMemoryWithMaxKeysValidates(t *testing.T) {
	_, err := window.NewMemory(throttle.PerSecond(1), window.WithMaxKeys(31))
	var oe *throttle.OptionError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "WithMaxKeys", oe.Field)
}

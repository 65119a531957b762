package throttle_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
	"github.com/queuethrottle/queuethrottle/window"
)

// logRecords is a JSON slog handler's output, parsed back per line.
type logRecords struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (r *logRecords) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.Write(p)
}

func (r *logRecords) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(r, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (r *logRecords) lines(t *testing.T, level string) []map[string]any {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(r.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		if m["level"] == level {
			out = append(out, m)
		}
	}
	return out
}

func TestGateLogsDecisionsAtDebug(t *testing.T) {
	var rec logRecords
	clock := throttletest.NewClock(throttletest.T0)
	l, err := window.NewMemory(throttle.PerSecond(2), window.WithClock(clock))
	require.NoError(t, err)
	g, err := throttle.NewGate(l, throttle.WithLogger(rec.logger()))
	require.NoError(t, err)
	ctx := context.Background()
	for range 3 {
		_, err := g.Admit(ctx, "tenant-a", 1)
		require.NoError(t, err)
	}
	_, err = g.Admit(ctx, "tenant-a", 0)
	require.ErrorIs(t, err, throttle.ErrInvalidCost)
	got := rec.lines(t, "DEBUG")
	require.Len(t, got, 4)
	for i, want := range []struct {
		outcome   string
		remaining float64
		retry     float64
	}{{"admitted", 1, 0}, {"admitted", 0, 0}, {"rejected", 0, float64(time.Second)}} {
		m := got[i]
		require.Equal(t, "throttle: decision", m["msg"])
		require.Equal(t, "tenant-a", m["key"])
		require.Equal(t, want.outcome, m["outcome"], "decision %d", i)
		require.Equal(t, "local", m["source"])
		require.Equal(t, want.remaining, m["remaining"])
		require.Equal(t, want.retry, m["retry_after"])
		require.Equal(t, float64(1), m["cost"])
	}
	require.Contains(t, got[3]["error"], "invalid cost")
	require.Empty(t, rec.lines(t, "WARN"))
}

// hinted is a limiter error that knows its way out, as the Redis
// limiters' errors for a Redis that refuses their script do.
type hinted struct{ msg string }

func (e hinted) Error() string { return e.msg }
func (e hinted) Hint() string  { return "use window.WithServerClock()" }

func TestGateReportsStoreFailures(t *testing.T) {
	tests := []struct {
		name  string
		err   func(i int) error
		error int    // Error lines expected
		hint  string // in the Error line
	}{
		{"a varying error is never called persistent", func(i int) error { return fmt.Errorf("read tcp 127.0.0.1:%d: i/o timeout", 40000+i) }, 0, ""},
		{"the same error every time", func(int) error { return errors.New("dial tcp 127.0.0.1:6379: connect: connection refused") }, 1, "reachable"},
		{"an error with a hint", func(int) error {
			return fmt.Errorf("window: redis: %w", hinted{"ERR Unknown Redis command called from script"})
		}, 1, "WithServerClock"},
		{"two hinted errors", func(i int) error { return hinted{fmt.Sprint("ERR script ", i%2)} }, 2, "WithServerClock"},
		{"a store slower than the timeout, its round trip varying", func(i int) error {
			return &throttle.SlowStoreError{RoundTrip: time.Duration(150+i) * time.Millisecond, Timeout: 100 * time.Millisecond, Err: context.DeadlineExceeded}
		}, 1, "WithTimeout to about twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rec logRecords
			i := 0
			l := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
				i++
				return throttle.Decision{}, tt.err(i)
			})
			g, err := throttle.NewGate(l, throttle.WithLogger(rec.logger()), throttle.WithFailurePolicy(throttle.FailOpen))
			require.NoError(t, err)
			for range 200 {
				d, err := g.Admit(context.Background(), "k", 1)
				require.NoError(t, err)
				require.True(t, d.Allowed)
				require.Equal(t, throttle.SourceDegraded, d.Source)
				require.Error(t, d.Err)
			}
			// 200 failures within far less than a second: the burst of 3
			// Warn lines, perhaps one more.
			warns := rec.lines(t, "WARN")
			require.GreaterOrEqual(t, len(warns), 3)
			require.LessOrEqual(t, len(warns), 5)
			require.Equal(t, "fail_open", warns[0]["policy"])
			errs := rec.lines(t, "ERROR")
			require.Len(t, errs, tt.error)
			for _, e := range errs {
				require.Contains(t, e["hint"], tt.hint)
				require.Contains(t, e["msg"], "fails every decision the same way")
			}
			require.Len(t, rec.lines(t, "DEBUG"), 200)
		})
	}
}

func TestGateStreakEndsOnSuccess(t *testing.T) {
	var rec logRecords
	i := 0
	l := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		i++
		if i%3 == 0 {
			return throttle.Decision{Allowed: true, Source: throttle.SourceRedis}, nil
		}
		return throttle.Decision{}, errors.New("flaky")
	})
	g, err := throttle.NewGate(l, throttle.WithLogger(rec.logger()))
	require.NoError(t, err)
	for range 30 {
		_, err := g.Admit(context.Background(), "k", 1)
		require.NoError(t, err)
	}
	require.Empty(t, rec.lines(t, "ERROR"), "two failures between successes are not persistent")
}

func TestStoreErrorsReport(t *testing.T) {
	cause := errors.New("connection refused")
	l := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		return throttle.Decision{}, cause
	})
	g, err := throttle.NewGate(l)
	require.NoError(t, err)
	var r throttle.StoreErrors
	var reported []error
	for range 100 {
		d, err := g.Admit(context.Background(), "tenant", 1)
		require.NoError(t, err)
		require.ErrorIs(t, d.Err, cause)
		if e := r.Report(g, "tenant", d); e != nil {
			reported = append(reported, e)
		}
	}
	require.GreaterOrEqual(t, len(reported), 3)
	require.LessOrEqual(t, len(reported), 5)
	var se *throttle.StoreError
	require.ErrorAs(t, reported[0], &se)
	require.ErrorIs(t, reported[0], throttle.ErrStore)
	require.ErrorIs(t, reported[0], cause)
	require.Equal(t, "tenant", se.Key)
	require.Equal(t, throttle.FailClosed, se.Policy)
	require.Equal(t, `throttle: store failure for key "tenant", fail_closed decided: connection refused`, reported[0].Error())
	require.Nil(t, r.Report(g, "tenant", throttle.Decision{Allowed: true}))
	// The next report carries the failures left out since the last one.
	time.Sleep(600 * time.Millisecond)
	d, _ := g.Admit(context.Background(), "tenant", 1)
	e := r.Report(g, "tenant", d)
	require.ErrorAs(t, e, &se)
	require.Equal(t, 100-len(reported), se.Suppressed)
	require.Contains(t, e.Error(), "more since the last report")
}

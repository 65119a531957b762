package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
	"github.com/queuethrottle/queuethrottle/window"
)

// telemetry is an SDK tracer and meter provider that keep what they record.
type telemetry struct {
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newTelemetry(t *testing.T) *telemetry {
	t.Helper()
	tel := &telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tel.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tel.spans))
	tel.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	t.Cleanup(func() {
		_ = tel.tp.Shutdown(context.Background())
		_ = tel.mp.Shutdown(context.Background())
	})
	return tel
}

func (tel *telemetry) options() []throttle.Option {
	return []throttle.Option{throttle.WithTracerProvider(tel.tp), throttle.WithMeterProvider(tel.mp)}
}

// sums returns each Int64 sum data point of the named metric by its
// "outcome/source" or "algorithm" labels.
func (tel *telemetry) sums(t *testing.T, name string) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, tel.reader.Collect(context.Background(), &rm))
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				got[label(dp.Attributes)] += dp.Value
			}
		}
	}
	return got
}

// histogramCount returns the number of samples of the named histogram.
func (tel *telemetry) histogramCount(t *testing.T, name string) uint64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, tel.reader.Collect(context.Background(), &rm))
	var n uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
					n += dp.Count
				}
			}
		}
	}
	return n
}

func label(set attribute.Set) string {
	if v, ok := set.Value(throttle.OutcomeAttr); ok {
		s, _ := set.Value(throttle.SourceAttr)
		return v.AsString() + "/" + s.AsString()
	}
	v, _ := set.Value(throttle.AlgorithmAttr)
	return v.AsString()
}

func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestGateRecordsEveryDecision(t *testing.T) {
	tel := newTelemetry(t)
	clock := throttletest.NewClock(throttletest.T0)
	lim, err := window.NewMemory(throttle.Rate{Count: 2, Per: time.Second}, window.WithClock(clock))
	require.NoError(t, err)
	g, err := throttle.NewGate(lim, tel.options()...)
	require.NoError(t, err)

	ctx := context.Background()
	for i := 0; i < 2; i++ {
		d, err := g.Admit(ctx, "tenant-a", 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	clock.Advance(400 * time.Millisecond)
	d, err := g.Admit(ctx, "tenant-a", 1)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, 600*time.Millisecond, d.RetryAfter)

	spans := tel.spans.Ended()
	require.Len(t, spans, 3, "one span per decision")
	last := spans[2]
	require.Equal(t, throttle.SpanName, last.Name())
	require.Equal(t, codes.Unset, last.Status().Code, "a rejection is not an error")
	attrs := spanAttrs(last)
	require.Equal(t, "tenant-a", attrs[throttle.KeyAttr].AsString())
	require.Equal(t, "sliding_window_log", attrs[throttle.AlgorithmAttr].AsString())
	require.False(t, attrs[throttle.AllowedAttr].AsBool())
	require.Equal(t, int64(0), attrs[throttle.RemainingAttr].AsInt64())
	require.Equal(t, int64(600), attrs[throttle.RetryAfterMsAttr].AsInt64())
	require.Equal(t, "local", attrs[throttle.SourceAttr].AsString())
	require.Equal(t, int64(2), attrs[throttle.LimitAttr].AsInt64())
	require.True(t, spanAttrs(spans[0])[throttle.AllowedAttr].AsBool())

	require.Equal(t, map[string]int64{"admitted/local": 2, "rejected/local": 1}, tel.sums(t, throttle.DecisionsMetric))
	require.Equal(t, uint64(3), tel.histogramCount(t, throttle.DurationMetric))
	require.Empty(t, tel.sums(t, throttle.StoreErrorsMetric))
}

func TestGateSpanIsChildOfCaller(t *testing.T) {
	tel := newTelemetry(t)
	lim, err := window.NewMemory(throttle.PerSecond(1))
	require.NoError(t, err)
	g, err := throttle.NewGate(lim, tel.options()...)
	require.NoError(t, err)
	ctx, parent := tel.tp.Tracer("test").Start(context.Background(), "process orders")
	_, err = g.Admit(ctx, "k", 1)
	require.NoError(t, err)
	parent.End()
	spans := tel.spans.Ended()
	require.Len(t, spans, 2)
	require.Equal(t, parent.SpanContext().SpanID(), spans[0].Parent().SpanID())
	require.Equal(t, parent.SpanContext().TraceID(), spans[0].SpanContext().TraceID())
}

var errStoreDown = errors.New("store: connection refused")

func failing(context.Context, string, int) (throttle.Decision, error) {
	return throttle.Decision{}, errStoreDown
}

func TestGateFailurePolicy(t *testing.T) {
	tests := []struct {
		name      string
		opts      []throttle.Option
		allowed   bool
		retry     time.Duration
		outcome   string
		policyTag string
	}{
		{name: "default is fail-closed", allowed: false, retry: time.Second, outcome: "rejected/degraded", policyTag: "fail_closed"},
		{name: "fail-closed with retry-after", opts: []throttle.Option{throttle.WithFailurePolicy(throttle.FailClosed), throttle.WithDegradedRetryAfter(250*time.Millisecond + 1)},
			allowed: false, retry: 251 * time.Millisecond, outcome: "rejected/degraded", policyTag: "fail_closed"},
		{name: "fail-open", opts: []throttle.Option{throttle.WithFailurePolicy(throttle.FailOpen)}, allowed: true, outcome: "admitted/degraded", policyTag: "fail_open"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tel := newTelemetry(t)
			g, err := throttle.NewGate(throttle.LimiterFunc(failing), append(tel.options(), append(tt.opts, throttle.WithAlgorithm("test_store"))...)...)
			require.NoError(t, err)
			d, err := g.Admit(context.Background(), "k", 1)
			require.NoError(t, err, "the policy decided; the error is recorded, not returned")
			require.Equal(t, tt.allowed, d.Allowed)
			require.Equal(t, tt.retry, d.RetryAfter)
			require.Equal(t, throttle.SourceDegraded, d.Source)

			spans := tel.spans.Ended()
			require.Len(t, spans, 1)
			require.Equal(t, codes.Error, spans[0].Status().Code, "a store failure is an error")
			require.NotEmpty(t, spans[0].Events(), "the error is recorded on the span")
			require.Equal(t, "exception", spans[0].Events()[0].Name)
			attrs := spanAttrs(spans[0])
			require.Equal(t, tt.policyTag, attrs[throttle.PolicyAttr].AsString())
			require.Equal(t, "degraded", attrs[throttle.SourceAttr].AsString())
			require.Equal(t, map[string]int64{tt.outcome: 1}, tel.sums(t, throttle.DecisionsMetric))
			require.Equal(t, map[string]int64{"test_store": 1}, tel.sums(t, throttle.StoreErrorsMetric))
		})
	}
}

// TestGateQuotaFailurePolicy: a QuotaFunc's quota that cannot be enforced
// is decided by the quota failure policy, FailClosed by default even under
// FailOpen (100 requests against a broken 5/s quota: 0 admitted, not 100);
// FailOpen for quotas only when chosen.
func TestGateQuotaFailurePolicy(t *testing.T) {
	broken := func(string) throttle.Quota { return throttle.Quota{Rate: throttle.Rate{Count: -5, Per: time.Second}} }
	for _, tt := range []struct {
		name     string
		opts     []throttle.Option
		admitted int
		policy   throttle.FailurePolicy
	}{
		{"store fail-open, quotas by default", []throttle.Option{throttle.WithFailurePolicy(throttle.FailOpen)}, 0, throttle.FailClosed},
		{"quotas fail-open when chosen", []throttle.Option{throttle.WithQuotaFailurePolicy(throttle.FailOpen)}, 100, throttle.FailOpen},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lim, err := window.NewMemory(throttle.PerSecond(5), window.WithQuotas(broken))
			require.NoError(t, err)
			tel := newTelemetry(t)
			g, err := throttle.NewGate(lim, append(tel.options(), tt.opts...)...)
			require.NoError(t, err)
			admitted := 0
			var last throttle.Decision
			for range 100 {
				d, err := g.Admit(context.Background(), "k", 1)
				require.NoError(t, err)
				require.ErrorIs(t, d.Err, throttle.ErrInvalidQuota)
				require.Equal(t, throttle.SourceDegraded, d.Source)
				if d.Allowed {
					admitted++
				}
				last = d
			}
			require.Equal(t, tt.admitted, admitted)
			var se *throttle.StoreError
			require.ErrorAs(t, new(throttle.StoreErrors).Report(g, "k", last), &se)
			require.Equal(t, tt.policy, se.Policy)
			require.Equal(t, tt.policy.String(), spanAttrs(tel.spans.Ended()[0])[throttle.PolicyAttr].AsString())
		})
	}
	_, err := throttle.NewGate(throttle.LimiterFunc(failing), throttle.WithQuotaFailurePolicy(7))
	require.ErrorIs(t, err, throttle.ErrInvalidOption)
}

// TestGateTooManyKeys: a key an in-process limiter refuses as one too
// many is rejected even under FailOpen, with the error in Decision.Err,
// counted as refused and not as a store error.
func TestGateTooManyKeys(t *testing.T) {
	lim, err := window.NewMemory(throttle.PerMinute(1), window.WithMaxKeys(32))
	require.NoError(t, err)
	tel := newTelemetry(t)
	g, err := throttle.NewGate(lim, append(tel.options(), throttle.WithFailurePolicy(throttle.FailOpen), throttle.WithDegradedRetryAfter(2*time.Second))...)
	require.NoError(t, err)
	ctx := context.Background()
	refused := 0
	for i := range 200 { // 32 shards of one key each: most keys find theirs taken
		d, err := g.Admit(ctx, fmt.Sprint("k", i), 1)
		require.NoError(t, err)
		if d.Err != nil {
			require.ErrorIs(t, d.Err, throttle.ErrTooManyKeys)
			require.False(t, d.Allowed, "fail-open does not admit a key refused as one too many")
			require.Equal(t, 2*time.Second, d.RetryAfter)
			require.Equal(t, throttle.SourceLocal, d.Source)
			require.ErrorIs(t, new(throttle.StoreErrors).Report(g, "k", d), throttle.ErrTooManyKeys)
			refused++
		}
	}
	require.Greater(t, refused, 100)
	require.Equal(t, int64(refused), lim.Refused())
	require.Equal(t, map[string]int64{"sliding_window_log": int64(refused)}, tel.sums(t, throttle.KeysRefusedMetric))
	require.Empty(t, tel.sums(t, throttle.StoreErrorsMetric))
}

// TestGateCountsSlowStores: a timeout while the store's round trip is
// longer than the timeout is a store failure counted as slow too.
func TestGateCountsSlowStores(t *testing.T) {
	tel := newTelemetry(t)
	slow := true
	l := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		if slow {
			return throttle.Decision{}, fmt.Errorf("window: redis: %w", &throttle.SlowStoreError{RoundTrip: 160 * time.Millisecond, Timeout: 100 * time.Millisecond, Err: context.DeadlineExceeded})
		}
		return throttle.Decision{}, fmt.Errorf("window: redis: %w", context.DeadlineExceeded)
	})
	g, err := throttle.NewGate(l, append(tel.options(), throttle.WithAlgorithm("sliding_window_log"))...)
	require.NoError(t, err)
	for range 3 {
		d, err := g.Admit(context.Background(), "k", 1)
		require.NoError(t, err)
		require.ErrorIs(t, d.Err, throttle.ErrSlowStore)
		require.ErrorIs(t, d.Err, context.DeadlineExceeded)
		require.Contains(t, d.Err.Error(), "round trip (160ms) is longer than WithTimeout (100ms)")
	}
	slow = false
	_, err = g.Admit(context.Background(), "k", 1)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"sliding_window_log": 3}, tel.sums(t, throttle.SlowStoreMetric))
	require.Equal(t, map[string]int64{"sliding_window_log": 4}, tel.sums(t, throttle.StoreErrorsMetric))
}

func TestGateUsageErrorsAreNotPolicyDecisions(t *testing.T) {
	tel := newTelemetry(t)
	lim, err := window.NewMemory(throttle.PerSecond(5))
	require.NoError(t, err)
	g, err := throttle.NewGate(lim, append(tel.options(), throttle.WithFailurePolicy(throttle.FailOpen))...)
	require.NoError(t, err)
	for _, n := range []int{0, -1, 6} {
		d, err := g.Admit(context.Background(), "k", n)
		require.ErrorIs(t, err, throttle.ErrInvalidCost, "n=%d", n)
		require.False(t, d.Allowed, "fail-open must not admit a request that can never be admitted")
		require.Equal(t, throttle.Never, d.RetryAfter)
	}
	require.Empty(t, tel.sums(t, throttle.StoreErrorsMetric), "a bad request is not a store error")
	d, err := g.Admit(context.Background(), "k", 5)
	require.NoError(t, err)
	require.True(t, d.Allowed, "rejected bad requests charged nothing")
}

func TestNewGateValidates(t *testing.T) {
	lim, err := window.NewMemory(throttle.PerSecond(1))
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		l     throttle.Limiter
		opts  []throttle.Option
		field string
	}{
		"nil limiter":          {l: nil, field: "Limiter"},
		"unknown policy":       {l: lim, opts: []throttle.Option{throttle.WithFailurePolicy(7)}, field: "WithFailurePolicy"},
		"zero degraded retry":  {l: lim, opts: []throttle.Option{throttle.WithDegradedRetryAfter(0)}, field: "WithDegradedRetryAfter"},
		"negative degraded re": {l: lim, opts: []throttle.Option{throttle.WithDegradedRetryAfter(-time.Second)}, field: "WithDegradedRetryAfter"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := throttle.NewGate(tc.l, tc.opts...)
			require.ErrorIs(t, err, throttle.ErrInvalidOption)
			var oe *throttle.OptionError
			require.ErrorAs(t, err, &oe)
			require.Equal(t, tc.field, oe.Field)
		})
	}
	g, err := throttle.NewGate(lim, nil, throttle.WithTracerProvider(nil), throttle.WithMeterProvider(nil))
	require.NoError(t, err, "nil options fall back to the globals")
	require.Equal(t, throttle.FailClosed, g.Policy())
}

func TestGateWithNoopProviders(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	lim, err := window.NewMemory(throttle.Rate{Count: 1, Per: time.Second}, window.WithClock(clock))
	require.NoError(t, err)
	noops := []throttle.Option{throttle.WithTracerProvider(tracenoop.NewTracerProvider()), throttle.WithMeterProvider(metricnoop.NewMeterProvider())}
	g, err := throttle.NewGate(lim, noops...)
	require.NoError(t, err)
	tel := newTelemetry(t)
	ctx, parent := tel.tp.Tracer("test").Start(context.Background(), "caller")
	d, err := g.Admit(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = g.Admit(ctx, "k", 1)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, time.Second, d.RetryAfter)

	failingGate, err := throttle.NewGate(throttle.LimiterFunc(failing), noops...)
	require.NoError(t, err)
	d, err = failingGate.Admit(ctx, "k", 1)
	require.NoError(t, err)
	require.Equal(t, throttle.SourceDegraded, d.Source)
	require.False(t, d.Allowed)
	parent.End()
	spans := tel.spans.Ended()
	require.Len(t, spans, 1)
	require.Equal(t, codes.Unset, spans[0].Status().Code, "the caller's span must not get the Gate's error")
	require.Empty(t, spans[0].Events())
}

func TestGateClosedLimiterRejectsWhateverThePolicy(t *testing.T) {
	closed := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
		return throttle.Decision{}, fmt.Errorf("some limiter: %w", throttle.ErrClosed)
	})
	for _, p := range []throttle.FailurePolicy{throttle.FailClosed, throttle.FailOpen} {
		g, err := throttle.NewGate(closed, throttle.WithFailurePolicy(p), throttle.WithDegradedRetryAfter(300*time.Millisecond))
		require.NoError(t, err)
		d, err := g.Admit(context.Background(), "k", 1)
		require.NoError(t, err)
		require.False(t, d.Allowed, "%v must not admit through a closed limiter", p)
		require.Equal(t, 300*time.Millisecond, d.RetryAfter)
		require.Equal(t, throttle.SourceDegraded, d.Source)
	}
}

func TestGateCallerContextDone(t *testing.T) {
	waits := throttle.LimiterFunc(func(ctx context.Context, _ string, _ int) (throttle.Decision, error) {
		<-ctx.Done()
		return throttle.Decision{}, fmt.Errorf("store: %w", ctx.Err())
	})
	g, err := throttle.NewGate(waits, throttle.WithFailurePolicy(throttle.FailOpen))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	d, err := g.Admit(ctx, "k", 1)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, d.Allowed, "no decision is not an admission, even fail-open")
	require.Equal(t, time.Second, d.RetryAfter, "the caller may retry later")
	require.False(t, throttle.IsUsageError(err))
}

func TestZeroGate(t *testing.T) {
	var g throttle.Gate
	d, err := g.Admit(context.Background(), "k", 1)
	require.ErrorIs(t, err, throttle.ErrInvalidOption)
	require.False(t, d.Allowed)
}

// TestGateAdmitID checks that AdmitID decides by id with the Gate's
// horizon: a rejection reserves its slot (counted as "reserved"), the same
// id is admitted there, and an admitted id is not charged again; without
// WithReservations nothing is reserved but ids stay idempotent.
func TestGateAdmitID(t *testing.T) {
	clock := throttletest.NewClock(throttletest.T0)
	lim, err := window.NewMemory(throttle.Rate{Count: 1, Per: time.Second}, window.WithClock(clock))
	require.NoError(t, err)
	ctx := context.Background()

	tel := newTelemetry(t)
	g, err := throttle.NewGate(lim, append(tel.options(), throttle.WithReservations(5*time.Second))...)
	require.NoError(t, err)
	require.Equal(t, 5*time.Second, g.Reservations())

	d, err := g.AdmitID(ctx, "tenant", 1, "a")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = g.AdmitID(ctx, "tenant", 1, "a")
	require.NoError(t, err)
	require.True(t, d.Allowed, "an admitted id is admitted again")
	d, err = g.AdmitID(ctx, "tenant", 1, "b")
	require.NoError(t, err)
	require.True(t, d.Reserved)
	require.Equal(t, time.Second, d.RetryAfter)
	d, err = g.Admit(ctx, "tenant", 1)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.False(t, d.Reserved, "Admit never reserves")
	require.Equal(t, 2*time.Second, d.RetryAfter, "Admit waits behind b's reservation")
	clock.Advance(time.Second)
	d, err = g.AdmitID(ctx, "tenant", 1, "b")
	require.NoError(t, err)
	require.True(t, d.Allowed, "b is admitted on its reservation")

	require.Equal(t, map[string]int64{"admitted/local": 3, "reserved/local": 1, "rejected/local": 1}, tel.sums(t, throttle.DecisionsMetric))
	spans := tel.spans.Ended()
	require.Len(t, spans, 5)
	require.True(t, spanAttrs(spans[2])[throttle.ReservedAttr].AsBool())
	_, hasReserved := spanAttrs(spans[3])[throttle.ReservedAttr]
	require.False(t, hasReserved, "Admit's spans carry no throttle.reserved")

	t.Run("an empty id is no identity", func(t *testing.T) {
		lim, err := window.NewMemory(throttle.Rate{Count: 1, Per: time.Second}, window.WithClock(clock))
		require.NoError(t, err)
		g, err := throttle.NewGate(lim, throttle.WithReservations(5*time.Second))
		require.NoError(t, err)
		d, err := g.AdmitID(ctx, "tenant", 1, "")
		require.NoError(t, err)
		require.True(t, d.Allowed)
		d, err = g.AdmitID(ctx, "tenant", 1, "")
		require.NoError(t, err)
		require.False(t, d.Allowed, "a second request without an id is charged, not admitted as the first")
		require.False(t, d.Reserved, "without an id nothing is reserved")
	})

	t.Run("without reservations", func(t *testing.T) {
		lim, err := window.NewMemory(throttle.Rate{Count: 1, Per: time.Second}, window.WithClock(clock))
		require.NoError(t, err)
		g, err := throttle.NewGate(lim)
		require.NoError(t, err)
		require.Zero(t, g.Reservations())
		d, err := g.AdmitID(ctx, "tenant", 1, "a")
		require.NoError(t, err)
		require.True(t, d.Allowed)
		d, err = g.AdmitID(ctx, "tenant", 1, "a")
		require.NoError(t, err)
		require.True(t, d.Allowed, "ids are idempotent without reservations too")
		d, err = g.AdmitID(ctx, "tenant", 1, "b")
		require.NoError(t, err)
		require.False(t, d.Allowed)
		require.False(t, d.Reserved)
	})
	t.Run("a limiter without ids", func(t *testing.T) {
		calls := 0
		lim := throttle.LimiterFunc(func(context.Context, string, int) (throttle.Decision, error) {
			calls++
			return throttle.Decision{Allowed: true, Limit: 1}, nil
		})
		_, err := throttle.NewGate(lim, throttle.WithReservations(time.Second))
		require.ErrorIs(t, err, throttle.ErrInvalidOption, "no IDLimiter: reservations refused")
		require.ErrorContains(t, err, "WithReservations")
		require.ErrorContains(t, err, "throttle.LimiterFunc")
		g, err := throttle.NewGate(lim)
		require.NoError(t, err)
		require.Zero(t, g.Reservations())
		d, err := g.AdmitID(ctx, "tenant", 1, "a")
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, 1, calls, "AdmitID falls back to AllowN")
	})
	t.Run("bad horizon", func(t *testing.T) {
		_, err := throttle.NewGate(lim, throttle.WithReservations(-time.Second))
		require.ErrorIs(t, err, throttle.ErrInvalidOption)
		require.ErrorContains(t, err, "WithReservations")
	})
}

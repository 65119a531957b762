package natsthrottle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
	"github.com/queuethrottle/queuethrottle/window"
)

// keyedCfg is the template of the per-key consumers of the tests.
var keyedCfg = jetstream.ConsumerConfig{Durable: "work", AckPolicy: jetstream.AckExplicitPolicy,
	AckWait: 5 * time.Second, MaxDeliver: 5, MaxAckPending: -1, FilterSubject: "jobs.*"}

// starts records when each message's handler started, by subject, and
// how many ran at once per subject.
type starts struct {
	mu      sync.Mutex
	at      map[string][]time.Time
	runs    map[uint64]int
	now     map[string]int
	most    map[string]int
	work    time.Duration
	started map[uint64]time.Time
	// calmSeqs are the stream sequences calmBeside published.
	calmSeqs []uint64
}

func newStarts(work time.Duration) *starts {
	return &starts{at: map[string][]time.Time{}, runs: map[uint64]int{}, now: map[string]int{}, most: map[string]int{}, work: work, started: map[uint64]time.Time{}}
}

func (s *starts) handle(m jetstream.Msg) {
	md, _ := m.Metadata()
	s.mu.Lock()
	s.at[m.Subject()] = append(s.at[m.Subject()], time.Now())
	s.runs[md.Sequence.Stream]++
	s.started[md.Sequence.Stream] = time.Now()
	s.now[m.Subject()]++
	s.most[m.Subject()] = max(s.most[m.Subject()], s.now[m.Subject()])
	s.mu.Unlock()
	time.Sleep(s.work)
	s.mu.Lock()
	s.now[m.Subject()]--
	s.mu.Unlock()
	_ = m.Ack()
}

func (s *starts) handled() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.runs)
}

// calmBeside waits for the flood's first start, publishes calm messages
// on jobs.calm every work, waits until all flood+calm are handled, and
// returns the calm ones' waits from publish to handler start, sorted.
func (s *starts) calmBeside(t *testing.T, e *env, flood, calm int, work time.Duration) []time.Duration {
	t.Helper()
	waitFor(t, 5*time.Second, "the flood started", func() bool { return s.handled() > 0 })
	var published []time.Time
	var seqs []uint64
	for i := range calm {
		seqs = append(seqs, e.publish(t, "jobs.calm", fmt.Sprint(i), nil))
		published = append(published, time.Now())
		time.Sleep(work)
	}
	waitFor(t, 20*time.Second, "every message handled", func() bool { return s.handled() == flood+calm })
	var waits []time.Duration
	for i, seq := range seqs {
		waits = append(waits, s.startedAt(seq).Sub(published[i]))
	}
	slices.Sort(waits)
	s.calmSeqs = seqs
	return waits
}

func (s *starts) startedAt(seq uint64) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started[seq]
}

func (e *env) stream(t *testing.T) jetstream.Stream {
	t.Helper()
	st, err := e.js.Stream(testCtx(t), streamName)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// consumeByKey starts h.ConsumeByKey with keyedCfg, stopped in t.Cleanup
// (before the Handler's Close).
func consumeByKey(t *testing.T, e *env, h *Handler) *KeyedConsumer {
	t.Helper()
	kc, err := h.ConsumeByKey(e.stream(t), keyedCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Stop)
	return kc
}

// TestConsumeByKeyFairShares: a flood of one key fills 4 handlers of
// 50 ms; a calm key publishing every 50 ms beside it is pulled and started
// at once (its wait is a fraction of the flood's backlog of 2.5 s), no
// message is NAKed or delivered twice, and the flood never runs on more
// than the 4 handlers.
func TestConsumeByKeyFairShares(t *testing.T) {
	e := newEnv(t)
	const flood, calm, work = 200, 30, 50 * time.Millisecond
	s := newStarts(work)
	naked := e.watch(t, nakAdvisory)
	var reported errs
	h := newHandler(t, s.handle, newGate(t, throttle.PerSecond(10_000), nil),
		WithConcurrency(4), WithConsumerConfig(keyedCfg), WithErrorHandler(reported.handle))
	for i := range flood {
		e.publish(t, "jobs.hog", fmt.Sprint(i), nil)
	}
	kc := consumeByKey(t, e, h)
	waits := s.calmBeside(t, e, flood, calm, work)
	// The flood's backlog behind which a first come, first served
	// consumer would start them: (flood / 4) × 50 ms = 2.5 s.
	if w := waits[len(waits)-1]; w > 500*time.Millisecond {
		t.Errorf("calm's longest wait %v beside the flood, want well under the flood's 2.5 s backlog (waits %v)", w, waits)
	}
	if n := len(naked.all()); n != 0 {
		t.Errorf("%d NAKs, want 0: a message is pulled only when it can start", n)
	}
	for seq, n := range s.runs {
		if n != 1 {
			t.Errorf("stream seq %d handled %d times", seq, n)
		}
	}
	if most := s.most["jobs.hog"]; most > 4 {
		t.Errorf("the flood ran %d handlers at once, want <= 4", most)
	}
	n, err := kc.Deliveries(testCtx(t))
	if err != nil || n != flood+calm {
		t.Errorf("Deliveries = %d, %v; want %d, nil", n, err, flood+calm)
	}
	if got := kc.Keys(); !slices.Equal(got, []string{"calm", "hog"}) {
		t.Errorf("Keys = %v", got)
	}
	if errs := reported.all(); len(errs) != 0 {
		t.Errorf("errors reported: %v", errs)
	}
	t.Logf("calm waits p50 %v max %v", waits[len(waits)/2], waits[len(waits)-1])
}

// TestConsumeByKeyWaitsForRate: a key over its rate is not NAKed: its head
// waits in process for its reserved slot while the rest stay in the
// stream, so every message is delivered once, and the admissions hold the
// limit.
func TestConsumeByKeyWaitsForRate(t *testing.T) {
	e := newEnv(t)
	r := throttle.Rate{Count: 5, Per: 200 * time.Millisecond}
	lim := newInstantsLimiter(t, r)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	g, err := throttle.NewGate(lim, throttle.WithReservations(5*time.Second), throttle.WithMeterProvider(mp), throttle.WithKeyMetrics(nil, 10))
	if err != nil {
		t.Fatal(err)
	}
	const total = 20
	s := newStarts(0)
	naked := e.watch(t, nakAdvisory)
	h := newHandler(t, s.handle, g, WithConcurrency(4), WithConsumerConfig(keyedCfg))
	for i := range total {
		e.publish(t, "jobs.burst", fmt.Sprint(i), nil)
	}
	kc := consumeByKey(t, e, h)
	waitFor(t, 10*time.Second, "every message handled", func() bool { return s.handled() == total })
	if n := len(naked.all()); n != 0 {
		t.Errorf("%d NAKs, want 0", n)
	}
	if n, err := kc.Deliveries(testCtx(t)); err != nil || n != total {
		t.Errorf("Deliveries = %d, %v; want %d (one each)", n, err, total)
	}
	if most := maxInWindow(lim.admitted(), r.Per); most > r.Count {
		t.Errorf("%d admissions in one %v window, want <= %d", most, r.Per, r.Count)
	}
	// Those refused waited here, each counted once however often it
	// asked again (at most the 15 beyond the first window); none was
	// NAKed.
	counts := throttletest.Sums(t, reader, throttle.DispositionsMetric, throttle.KeyAttr, throttle.DispositionAttr)
	if w := counts["jobs.burst/"+DispositionWait]; w < 1 || w > total-int64(r.Count) || len(counts) != 1 {
		t.Errorf("dispositions %v, want jobs.burst/wait between 1 and %d, nothing else", counts, total-r.Count)
	}
}

// TestConsumeByKeySlowStore: a flood of one key behind a Redis 100 ms
// away (50 ms each way) still starts at its rate: a key's decisions are
// not one round trip after the other (that would admit at most 5 in a
// window of 500 ms, where the limit is 10). Judged on the admission
// instants in Redis's own record: the limit holds, and is reached;
// nothing is NAKed and each message runs once.
func TestConsumeByKeySlowStore(t *testing.T) {
	e := newEnv(t)
	srv := redistest.Start(t)
	proxy := redistest.NewLatencyProxy(t, srv, 50*time.Millisecond)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	r := throttle.Rate{Count: 10, Per: 500 * time.Millisecond}
	prefix := redistest.Prefix("natsthrottle")
	lim, err := window.NewRedis(client, r, window.WithPrefix(prefix), window.WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// The horizon is also how long Redis keeps admitted units past their
	// window: the record is read at the end.
	g, err := throttle.NewGate(lim, throttle.WithReservations(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	const total = 60
	s := newStarts(0)
	naked := e.watch(t, nakAdvisory)
	h := newHandler(t, s.handle, g, WithConcurrency(8), WithConsumerConfig(keyedCfg), WithDecisionTimeout(2*time.Second))
	for i := range total {
		e.publish(t, "jobs.flood", fmt.Sprint(i), nil)
	}
	consumeByKey(t, e, h)
	waitFor(t, 20*time.Second, "every message handled", func() bool { return s.handled() == total })
	var admitted []time.Time
	for _, z := range srv.Client(t).ZRangeWithScores(testCtx(t), rediskey.Key(prefix, "jobs.flood"), 0, -1).Val() {
		if m, _ := z.Member.(string); strings.HasPrefix(m, "A") {
			admitted = append(admitted, time.UnixMicro(int64(z.Score)))
		}
	}
	if len(admitted) != total {
		t.Fatalf("Redis holds %d admissions, want %d", len(admitted), total)
	}
	if most := maxInWindow(admitted, r.Per); most > r.Count || most < r.Count*9/10 {
		t.Errorf("at most %d admitted in one %v window, want %d (the limit) or at least 0.9 of it", most, r.Per, r.Count)
	}
	if n := len(naked.all()); n != 0 {
		t.Errorf("%d NAKs, want 0", n)
	}
	for seq, n := range s.runs {
		if n != 1 {
			t.Errorf("stream seq %d handled %d times", seq, n)
		}
	}
}

// TestConsumeByKeyInFlight: a key limited to 2 handlers at once beside
// 4 handlers: never more than 2 run, none is NAKed, each runs once.
func TestConsumeByKeyInFlight(t *testing.T) {
	for _, lim := range inFlightLimiters(t, 2) {
		t.Run(lim.name, func(t *testing.T) {
			e := newEnv(t)
			const total = 12
			s := newStarts(50 * time.Millisecond)
			naked := e.watch(t, nakAdvisory)
			h := newHandler(t, s.handle, newGate(t, throttle.PerSecond(10_000), nil), WithConcurrency(4),
				WithConsumerConfig(keyedCfg), WithInFlight(lim.l, 300*time.Millisecond))
			for i := range total {
				e.publish(t, "jobs.a", fmt.Sprint(i), nil)
			}
			consumeByKey(t, e, h)
			waitFor(t, 10*time.Second, "every message handled", func() bool { return s.handled() == total })
			if most := s.most["jobs.a"]; most != 2 {
				t.Errorf("%d handlers at once, want 2", most)
			}
			if n := len(naked.all()); n != 0 {
				t.Errorf("%d NAKs, want 0: refused a slot, the head waits for one", n)
			}
		})
	}
}

// TestConsumeByKeySharedByProcesses: two KeyedConsumers (two processes)
// on the same per-key consumers handle every message once between them.
func TestConsumeByKeySharedByProcesses(t *testing.T) {
	e := newEnv(t)
	const total = 60
	s := newStarts(5 * time.Millisecond)
	for range 2 {
		h := newHandler(t, s.handle, newGate(t, throttle.PerSecond(10_000), nil), WithConcurrency(2), WithConsumerConfig(keyedCfg))
		consumeByKey(t, e, h)
	}
	for i := range total {
		e.publish(t, fmt.Sprintf("jobs.k%d", i%3), fmt.Sprint(i), nil)
	}
	waitFor(t, 10*time.Second, "every message handled", func() bool { return s.handled() == total })
	time.Sleep(100 * time.Millisecond)
	for seq, n := range s.runs {
		if n != 1 {
			t.Errorf("stream seq %d handled %d times", seq, n)
		}
	}
}

// TestConsumeByKeyStopNaks: Stop gives a message that waits for its slot
// back to the server (NAK), so that another process can take it.
func TestConsumeByKeyStopNaks(t *testing.T) {
	e := newEnv(t)
	g, err := throttle.NewGate(newInstantsLimiter(t, throttle.Rate{Count: 1, Per: time.Minute}), throttle.WithReservations(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	s := newStarts(0)
	naked := e.watch(t, nakAdvisory)
	h := newHandler(t, s.handle, g, WithConcurrency(2), WithConsumerConfig(keyedCfg))
	e.publish(t, "jobs.a", "first", nil)
	e.publish(t, "jobs.a", "second", nil)
	kc, err := h.ConsumeByKey(e.stream(t), keyedCfg)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the first handled", func() bool { return s.handled() == 1 })
	time.Sleep(100 * time.Millisecond) // the second waits for its slot a minute ahead
	kc.Stop()
	waitFor(t, 5*time.Second, "the second NAKed", func() bool { return len(naked.all()) == 1 })
	kc.Stop() // twice is harmless
}

func TestConsumeByKeyValidates(t *testing.T) {
	e := newEnv(t)
	st := e.stream(t)
	g := newGate(t, throttle.PerSecond(10), nil)
	good := []Option{WithConcurrency(2), WithConsumerConfig(keyedCfg)}
	for _, tc := range []struct {
		name string
		opts []Option
		cfg  func(*jetstream.ConsumerConfig)
		st   jetstream.Stream
	}{
		{"no concurrency", []Option{WithConsumerConfig(keyedCfg)}, nil, st},
		{"fair off", append(good, WithFair(false)), nil, st},
		{"no consumer config", []Option{WithConcurrency(2)}, nil, st},
		{"other ack wait", good, func(c *jetstream.ConsumerConfig) { c.AckWait = time.Second }, st},
		{"no durable", good, func(c *jetstream.ConsumerConfig) { c.Durable = "" }, st},
		{"no key token", good, func(c *jetstream.ConsumerConfig) { c.FilterSubject = "jobs.>" }, st},
		{"two key tokens", good, func(c *jetstream.ConsumerConfig) { c.FilterSubject = "jobs.*.*" }, st},
		{"filter subjects", good, func(c *jetstream.ConsumerConfig) { c.FilterSubjects = []string{"jobs.a"} }, st},
		{"ack none", good, func(c *jetstream.ConsumerConfig) { c.AckPolicy = jetstream.AckNonePolicy }, st},
		{"nil stream", good, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHandler(t, newRecorder().handle, g, tc.opts...)
			cfg := keyedCfg
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			kc, err := h.ConsumeByKey(tc.st, cfg)
			if !errors.Is(err, throttle.ErrInvalidOption) {
				if kc != nil {
					kc.Stop()
				}
				t.Fatalf("ConsumeByKey = %v, want an error wrapping ErrInvalidOption", err)
			}
		})
	}
}

func TestKeyConsumerName(t *testing.T) {
	seen := map[string]string{}
	long := strings.Repeat("é", 64) // 128 bytes, 384 escaped
	for _, key := range []string{"acme", "a_b", "a__b", "a-b", "a/b", "é", "a_2fb", "A", long, long[:126] + "e", strings.Repeat("_", 125)} {
		name := keyConsumerName("work", key)
		if other, dup := seen[name]; dup {
			t.Errorf("keys %q and %q share the consumer name %q", key, other, name)
		}
		seen[name] = key
		if len(name) > maxConsumerName {
			t.Errorf("consumer name of key %q is %d bytes, more than %d", key, len(name), maxConsumerName)
		}
		for _, c := range name[len("work_"):] {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				t.Errorf("consumer name %q of key %q holds %q", name, key, c)
			}
		}
	}
}

// givenBack wraps a window.Redis and counts what All gives back to it.
type givenBack struct {
	*window.Redis
	mu  sync.Mutex
	ids []string
}

func (l *givenBack) Refund(ctx context.Context, key string, n int, id string) (bool, error) {
	l.mu.Lock()
	l.ids = append(l.ids, id)
	l.mu.Unlock()
	return l.Redis.Refund(ctx, key, n, id)
}

// TestConsumeByKeyStackedClaims: a flood of one key under a tenant limit
// it never reaches and a partner limit (throttle.All, both on Redis, the
// partner's a few milliseconds away) that reserves a slot for nearly
// every message. All moves the tenant's admission to the partner's slot,
// so the tenant's slot lies a round trip after the partner's; a claim
// made before the tenant's slot would claim the partner's, see the
// tenant refuse, and All would give the partner's back and reserve its
// next free one, at the tail of a full schedule: a slot lost. So no
// slot of the partner is ever given back; each message runs once, none
// is NAKed, and neither limit is exceeded at the admissions Redis
// records.
func TestConsumeByKeyStackedClaims(t *testing.T) {
	e := newEnv(t)
	srv := redistest.Start(t)
	near := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = near.Close() })
	proxy := redistest.NewLatencyProxy(t, srv, 2*time.Millisecond)
	far := redis.NewClient(&redis.Options{Addr: proxy.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = far.Close() })
	tenantRate := throttle.Rate{Count: 100, Per: 200 * time.Millisecond}
	partnerRate := throttle.Rate{Count: 5, Per: 200 * time.Millisecond}
	prefix := redistest.Prefix("natsthrottle")
	tenants, err := window.NewRedis(near, tenantRate, window.WithPrefix(prefix+"tenant:"), window.WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	pl, err := window.NewRedis(far, partnerRate, window.WithPrefix(prefix+"partner:"), window.WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	partner := &givenBack{Redis: pl}
	all, err := throttle.All(throttle.Part{Limiter: tenants}, throttle.Part{Limiter: partner, Key: func(string) string { return "partner" }})
	if err != nil {
		t.Fatal(err)
	}
	// The horizon is also how long Redis keeps admitted units past their
	// window: the record is read at the end.
	g, err := throttle.NewGate(all, throttle.WithReservations(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	const total = 40
	s := newStarts(0)
	naked := e.watch(t, nakAdvisory)
	h := newHandler(t, s.handle, g, WithConcurrency(4), WithConsumerConfig(keyedCfg), WithDecisionTimeout(2*time.Second))
	for i := range total {
		e.publish(t, "jobs.flood", fmt.Sprint(i), nil)
	}
	consumeByKey(t, e, h)
	waitFor(t, 20*time.Second, "every message handled", func() bool { return s.handled() == total })
	partner.mu.Lock()
	if n := len(partner.ids); n > 0 {
		t.Errorf("the partner's slots of %d claims were given back (%v), want none", n, partner.ids)
	}
	partner.mu.Unlock()
	for _, c := range []struct {
		key  string
		rate throttle.Rate
	}{
		{rediskey.Key(prefix+"tenant:", "jobs.flood"), tenantRate},
		{rediskey.Key(prefix+"partner:", "partner"), partnerRate},
	} {
		var admitted []time.Time
		for _, z := range srv.Client(t).ZRangeWithScores(testCtx(t), c.key, 0, -1).Val() {
			if m, _ := z.Member.(string); strings.HasPrefix(m, "A") {
				admitted = append(admitted, time.UnixMicro(int64(z.Score)))
			}
		}
		if len(admitted) != total {
			t.Errorf("%s: Redis holds %d admissions, want %d", c.key, len(admitted), total)
		}
		if most := maxInWindow(admitted, c.rate.Per); most > c.rate.Count {
			t.Errorf("%s: %d admitted in one %v window, want <= %d", c.key, most, c.rate.Per, c.rate.Count)
		}
	}
	if n := len(naked.all()); n != 0 {
		t.Errorf("%d NAKs, want 0", n)
	}
	for seq, n := range s.runs {
		if n != 1 {
			t.Errorf("stream seq %d handled %d times", seq, n)
		}
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/adaptive"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// partnerKey is the one key of the partner's limit (-partner), stacked on
// every tenant's (throttle.All).
const partnerKey = "partner"

// partnerSettings are the -partner flags.
type partnerSettings struct {
	Budget throttle.Rate // -partner: the limit the worker believes in (zero: none)
	Quota  throttle.Rate // -partner-quota: what the simulated partner accepts (zero: no partner)
	After  []quotaChange // -partner-quota-after: its quota changes
	URL    string        // the partner server (-partner-url in a worker process)
	// MaxCost is the trace's largest job cost: the least part of the
	// adaptive limit's paced first window (adaptive.WithPacedStart).
	MaxCost int
	client  *partnerClient  // set for the run: every handler calls it once per job
	adapt   *adaptive.Limit // -partner's adaptive limit, with Redis
}

// quotaChange is the partner's quota from At (from the replay's t=0) on.
type quotaChange struct {
	At   time.Duration
	Rate throttle.Rate
}

// parsePartner checks the -partner flags.
func parsePartner(budget, quota, after string) (partnerSettings, error) {
	var ps partnerSettings
	var err error
	if budget != "" {
		if ps.Budget, err = throttle.ParseRate(budget); err != nil {
			return ps, fmt.Errorf("-partner: %w", err)
		}
	}
	if quota != "" {
		if ps.Quota, err = throttle.ParseRate(quota); err != nil {
			return ps, fmt.Errorf("-partner-quota: %w", err)
		}
	}
	for _, item := range strings.FieldsFunc(after, func(r rune) bool { return r == ',' }) {
		at, rate, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			return ps, fmt.Errorf("-partner-quota-after: %q is not T=RATE (e.g. 10s=10/1s)", item)
		}
		var c quotaChange
		if c.At, err = time.ParseDuration(at); err != nil || c.At < 0 {
			return ps, fmt.Errorf("-partner-quota-after: %q: T must be a duration >= 0 from the replay's start", item)
		}
		if c.Rate, err = throttle.ParseRate(rate); err != nil {
			return ps, fmt.Errorf("-partner-quota-after: %q: %w", item, err)
		}
		if n := len(ps.After); n > 0 && c.At <= ps.After[n-1].At {
			return ps, fmt.Errorf("-partner-quota-after: %q: the changes must come in order, each after the one before", item)
		}
		ps.After = append(ps.After, c)
	}
	if len(ps.After) > 0 && ps.Quota.Count == 0 {
		return ps, errors.New("-partner-quota-after needs -partner-quota: it changes the simulated partner's quota")
	}
	return ps, nil
}

// newPartnerLimit returns the limit of -partner on its one key, shared by
// every consumer and process, nil without -partner: in process without
// Redis; with it, a window in Redis under prefix whose limit adapts to the
// partner's 429s (adaptive.Limit, its state beside it, for every process),
// starting at -partner and never below a hundredth of it. Its window is
// guarded (see guarded), and its reservations spaced
// (window.WithSpacedReservations): the calls a pause or a quota change
// bunched are spread within a window, not repeated window after window.
func newPartnerLimit(ps partnerSettings, rc *redis.Client, prefix string, timeout time.Duration) (throttle.Limiter, *adaptive.Limit, error) {
	if ps.Budget.Count == 0 {
		return nil, nil, nil
	}
	if rc == nil {
		l, err := window.NewMemory(guarded(ps.Budget), window.WithSpacedReservations())
		return l, nil, err
	}
	var l *window.Redis
	ad, err := newAdaptive(ps, rc, prefix, adaptive.WithReplan(func(ctx context.Context, key string) { l.Replan(ctx, key) }))
	if err != nil {
		return nil, nil, err
	}
	l, err = window.NewRedis(rc, guarded(ps.Budget), window.WithPrefix(prefix+"partner:"), window.WithTimeout(timeout), window.WithQuotas(ad.Quota), window.WithSpacedReservations())
	return l, ad, err
}

// guarded is r with its window longer by a fiftieth: the guard between our
// window and the partner's. A call reaches the partner a little after the
// limiter admitted it, later for some calls than others; a schedule that
// is full admits a call exactly a window after the one whose place it
// takes, so a call that travels faster than that one finds the partner's
// window still full (a 429, and a pause of its Retry-After for everyone).
// A window longer by g absorbs differences up to g (20 ms of 1 s) and
// costs 2 % of the rate.
func guarded(r throttle.Rate) throttle.Rate {
	return throttle.Rate{Count: r.Count, Per: r.Per + r.Per/50}
}

// newAdaptive returns -partner's adaptive limit, its state in Redis under
// prefix: every process of the run shares it. It counts in the guarded
// window, as the limit it adapts, and paces a first window in parts no
// smaller than the trace's largest cost.
func newAdaptive(ps partnerSettings, rc *redis.Client, prefix string, opts ...adaptive.Option) (*adaptive.Limit, error) {
	return adaptive.NewRedis(rc, guarded(ps.Budget), max(1, ps.Budget.Count/100),
		append([]adaptive.Option{adaptive.WithPrefix(prefix + "adaptive:"), adaptive.WithPacedStart(max(1, ps.MaxCost))}, opts...)...)
}

// partnerServer is -partner-quota: the downstream every handler calls once
// per job. It accepts at most its quota in any window (a sliding window
// log of its own, which the throttle is not told about) and answers the
// rest 429 with Retry-After (whole seconds, rounded up, as HTTP has it)
// and Retry-After-Ms (the exact wait, which the handlers use).
type partnerServer struct {
	srv   *http.Server
	url   string
	start time.Time // the replay's t=0
	win   *window.Memory
	quota atomic.Pointer[throttle.Rate]

	mu     sync.Mutex
	calls  []partnerCall
	limits []int // -partner's limit every plotStep from start (nil: no -partner)
}

// partnerCall is one call the partner answered, at an offset from start.
type partnerCall struct {
	at time.Duration
	ok bool
}

// startPartner serves the partner on a free loopback port until cl runs;
// its quota follows ps.After from start on. With -partner it samples the
// partner key's limit every plotStep (adapted, with ps.adapt).
func startPartner(ps partnerSettings, start time.Time, cl *closers) (*partnerServer, error) {
	p := &partnerServer{start: start}
	p.quota.Store(&ps.Quota)
	var err error
	p.win, err = window.NewMemory(ps.Quota, window.WithQuotas(func(string) throttle.Quota { return throttle.Quota{Rate: *p.quota.Load()} }))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("-partner-quota: %w", err)
	}
	p.url = "http://" + ln.Addr().String() + "/call"
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve), ReadHeaderTimeout: 5 * time.Second}
	go p.srv.Serve(ln)
	var timers []*time.Timer
	for _, c := range ps.After {
		rate := c.Rate
		timers = append(timers, time.AfterFunc(time.Until(start.Add(c.At)), func() { p.quota.Store(&rate) }))
	}
	stopSampling := p.sampleLimit(ps)
	cl.add(func() {
		stopSampling()
		for _, t := range timers {
			t.Stop()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		p.srv.Shutdown(ctx)
	})
	return p, nil
}

// sampleLimit records -partner's limit every plotStep from the replay's
// start until the returned func runs: the limit over time, for the report
// and the plot.
func (p *partnerServer) sampleLimit(ps partnerSettings) (stop func()) {
	if ps.Budget.Count == 0 {
		return func() {}
	}
	limit := func() int { return ps.Budget.Count }
	if ps.adapt != nil {
		limit = func() int { return ps.adapt.Limit(partnerKey) }
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-time.After(time.Until(p.start)):
		case <-done:
			return
		}
		t := time.NewTicker(plotStep)
		defer t.Stop()
		for {
			v := limit() // not under p.mu: it may take the adaptive limit's lock
			p.mu.Lock()
			for len(p.limits) <= int(time.Since(p.start)/plotStep) {
				p.limits = append(p.limits, v)
			}
			p.mu.Unlock()
			select {
			case <-t.C:
			case <-done:
				return
			}
		}
	}()
	return sync.OnceFunc(func() { close(done) })
}

func (p *partnerServer) serve(w http.ResponseWriter, r *http.Request) {
	d, err := p.win.AllowN(r.Context(), partnerKey, 1)
	at := time.Since(p.start)
	p.mu.Lock()
	p.calls = append(p.calls, partnerCall{at: at, ok: err == nil && d.Allowed})
	p.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if !d.Allowed {
		w.Header().Set("Retry-After", strconv.FormatInt(int64((d.RetryAfter+time.Second-1)/time.Second), 10))
		w.Header().Set("Retry-After-Ms", strconv.FormatInt(d.RetryAfter.Milliseconds(), 10))
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// partnerClient calls the partner for the handlers, and tells the
// adaptive limit (if any) what it answered.
type partnerClient struct {
	url   string
	http  *http.Client
	adapt *adaptive.Limit
}

func newPartnerClient(url string, handlers int, adapt *adaptive.Limit) *partnerClient {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = handlers
	return &partnerClient{url: url, http: &http.Client{Transport: t, Timeout: 5 * time.Second}, adapt: adapt}
}

// call makes one call: accepted, or answered 429 with the wait it asked
// for (at least a millisecond).
func (c *partnerClient) call(ctx context.Context) (accepted bool, retry time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
	if err != nil {
		return false, 0, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return false, 0, fmt.Errorf("partner: %w", err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	switch resp.StatusCode {
	case http.StatusOK:
		if c.adapt != nil {
			if err := c.adapt.Accepted(ctx, partnerKey); err != nil {
				return true, 0, err
			}
		}
		return true, 0, nil
	case http.StatusTooManyRequests:
		ms, _ := strconv.ParseInt(resp.Header.Get("Retry-After-Ms"), 10, 64)
		if ms <= 0 {
			s, _ := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
			ms = s * 1000
		}
		retry := max(time.Duration(ms)*time.Millisecond, time.Millisecond)
		if c.adapt != nil {
			if _, err := c.adapt.RejectedAfter(ctx, partnerKey, retry); err != nil {
				return false, time.Second, err
			}
		}
		return false, retry, nil
	}
	return false, 0, fmt.Errorf("partner: %s", resp.Status)
}

// partnerReport is the run's partner: what it was called and answered,
// both consumers and every process together.
type partnerReport struct {
	Quota        throttle.Rate // at the start
	After        []quotaChange // -partner-quota-after
	Budget       throttle.Rate // -partner (zero: none)
	Final        int           // -partner's limit at the end: adapted, with Redis
	Calls        int
	Accepted     int
	Rejected429  int
	MaxInWindow  int   // most admissions on the partner key certainly inside any window of its period (-partner's, else 1 s)
	AcceptedPerS []int // per whole second from the replay's t=0, to the last call
	RejectedPerS []int
	Limits       []int // -partner's limit every plotStep from t=0 (nil without it)
	calls        []partnerCall
}

// per is the window the partner's calls are counted in: -partner's
// period, else 1 s.
func (r partnerReport) per() time.Duration {
	if r.Budget.Count > 0 {
		return r.Budget.Per
	}
	return time.Second
}

// quotaAt is the partner's quota at t from the replay's start.
func (r partnerReport) quotaAt(t time.Duration) throttle.Rate {
	q := r.Quota
	for _, c := range r.After {
		if c.At <= t {
			q = c.Rate
		}
	}
	return q
}

// quotaText is the partner's quota and its changes, for people.
func (r partnerReport) quotaText() string {
	quota := r.Quota.String()
	for _, c := range r.After {
		quota += fmt.Sprintf(", %s from t=%v", c.Rate, c.At)
	}
	return quota
}

// limitPerS returns the lowest of Limits in each whole second.
func (r partnerReport) limitPerS() []int {
	per := int(time.Second / plotStep)
	var out []int
	for i, l := range r.Limits {
		if i%per == 0 {
			out = append(out, l)
		}
		out[len(out)-1] = min(out[len(out)-1], l)
	}
	return out
}

// finalLimit returns -partner's limit now: adapted, with Redis (read
// before the run closes its Redis client).
func (ps partnerSettings) finalLimit(ctx context.Context) int {
	if ps.adapt == nil {
		return ps.Budget.Count
	}
	n, _ := ps.adapt.Read(ctx, partnerKey)
	return n
}

// report sums the calls; admits are every admission of the run, final
// -partner's limit at its end.
func (p *partnerServer) report(ps partnerSettings, final int, admits []event) partnerReport {
	r := partnerReport{Quota: ps.Quota, After: ps.After, Budget: ps.Budget, Final: final, AcceptedPerS: []int{}, RejectedPerS: []int{}}
	p.mu.Lock()
	defer p.mu.Unlock()
	r.Calls = len(p.calls)
	r.Limits = slices.Clone(p.limits)
	r.calls = slices.Clone(p.calls)
	for _, c := range p.calls {
		s := int(c.at / time.Second)
		for len(r.AcceptedPerS) <= s {
			r.AcceptedPerS = append(r.AcceptedPerS, 0)
			r.RejectedPerS = append(r.RejectedPerS, 0)
		}
		if c.ok {
			r.Accepted++
			r.AcceptedPerS[s]++
		} else {
			r.Rejected429++
			r.RejectedPerS[s]++
		}
	}
	r.MaxInWindow = maxInWindow(admits, r.per())
	return r
}

// line is the summary's line on the partner.
func (r partnerReport) line() string {
	share := 0.0
	if r.Calls > 0 {
		share = 100 * float64(r.Rejected429) / float64(r.Calls)
	}
	budget := "no -partner limit"
	if r.Budget.Count > 0 {
		budget = fmt.Sprintf("-partner %s (at the end %d/%v), max %d admitted in any %v", r.Budget, r.Final, r.Budget.Per, r.MaxInWindow, r.Budget.Per)
	}
	return fmt.Sprintf("partner (quota %s): %s, %d accepted, %d answered 429 (%.1f%%); %s",
		r.quotaText(), plural(r.Calls, "call"), r.Accepted, r.Rejected429, share, budget)
}

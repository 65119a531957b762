package coalesce

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/deadline"
)

// recorder decides requests (ints) by echoing them, holding the first
// MaxInFlight flushes until release is closed, and records the batches.
type recorder struct {
	release chan struct{}
	mu      sync.Mutex
	lone    []int
	batches [][]int
	started chan struct{}
}

func newRecorder() *recorder {
	return &recorder{release: make(chan struct{}), started: make(chan struct{}, 100)}
}

func (r *recorder) one(ctx context.Context, req int) (int, error) {
	r.mu.Lock()
	r.lone = append(r.lone, req)
	r.mu.Unlock()
	r.started <- struct{}{}
	<-r.release
	return req, nil
}

func (r *recorder) many(ctx context.Context, calls []*Call[int, int]) {
	var reqs []int
	for _, c := range calls {
		reqs = append(reqs, c.Req)
		c.Res = c.Req
	}
	r.mu.Lock()
	r.batches = append(r.batches, reqs)
	r.mu.Unlock()
}

// TestQueuedCallsGoTogether: while MaxInFlight lone calls are in flight,
// further calls queue and go in batches of at most maxBatch, in arrival
// order; a caller that gives up while queued is left out, and the others
// still get their results.
func TestQueuedCallsGoTogether(t *testing.T) {
	r := newRecorder()
	b := New(deadline.NewShared(time.Second), 3, r.one, r.many)
	ctx := context.Background()
	var wg sync.WaitGroup
	results := make([]int, 10)
	for i := range MaxInFlight {
		wg.Add(1)
		go func() { defer wg.Done(); results[i], _ = b.Do(ctx, i) }()
	}
	for range MaxInFlight {
		<-r.started
	}
	// Queue the rest one at a time, so that arrival order is known.
	gone, cancel := context.WithCancel(ctx)
	for i := MaxInFlight; i < 10; i++ {
		wg.Add(1)
		c := ctx
		if i == 4 {
			c = gone
		}
		go func() {
			defer wg.Done()
			var err error
			results[i], err = b.Do(c, i)
			if i == 4 && !errors.Is(err, context.Canceled) {
				t.Errorf("withdrawn call: %v, want context.Canceled", err)
			}
		}()
		waitQueued(t, b, i-MaxInFlight+1)
	}
	cancel()
	waitQueued(t, b, 10-MaxInFlight-1)
	close(r.release)
	wg.Wait()
	if !slices.Equal(r.lone, []int{0, 1}) && !slices.Equal(r.lone, []int{1, 0}) {
		t.Fatalf("lone calls %v, want 0 and 1", r.lone)
	}
	// Batches in flight together may record in either order; each is
	// taken from the head of the queue.
	slices.SortFunc(r.batches, func(a, b []int) int { return a[0] - b[0] })
	var flushed []int
	for _, batch := range r.batches {
		if len(batch) > 3 {
			t.Fatalf("batch %v holds more than maxBatch 3", batch)
		}
		flushed = append(flushed, batch...)
	}
	if want := []int{2, 3, 5, 6, 7, 8, 9}; !slices.Equal(flushed, want) {
		t.Fatalf("flushed %v, want %v (arrival order, without the withdrawn 4)", flushed, want)
	}
	for i, got := range results {
		if i != 4 && got != i {
			t.Fatalf("call %d got %d", i, got)
		}
	}
	// A flusher frees its place once its last batch's callers are woken.
	for deadline := time.Now().Add(5 * time.Second); b.InFlight() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d flushes in flight after all returned", b.InFlight())
		}
	}
}

// TestBatchesInFlightTogether: under load, every place in flight carries a
// batch: when the lone calls return with calls queued, MaxInFlight
// batches go at once, not one after another.
func TestBatchesInFlightTogether(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 100)
	var mu sync.Mutex
	inMany, most := 0, 0
	one := func(ctx context.Context, req int) (int, error) {
		started <- struct{}{}
		<-release
		return req, nil
	}
	many := func(ctx context.Context, calls []*Call[int, int]) {
		mu.Lock()
		inMany++
		most = max(most, inMany)
		mu.Unlock()
		<-started // wait for the other batch (or time out below)
		mu.Lock()
		inMany--
		mu.Unlock()
		for _, c := range calls {
			c.Res = c.Req
		}
	}
	b := New(deadline.NewShared(time.Second), 2, one, many)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := range MaxInFlight {
		wg.Go(func() { b.Do(ctx, i) })
	}
	for range MaxInFlight {
		<-started
	}
	for i := MaxInFlight; i < MaxInFlight+2*MaxInFlight; i++ {
		wg.Go(func() { b.Do(ctx, i) })
		waitQueued(t, b, i-MaxInFlight+1)
	}
	// Each batch waits for a token; give one per batch only once all of
	// them could be in flight, so that one flusher at a time would take
	// its batches one after another and see at most one in many.
	close(release)
	go func() {
		time.Sleep(100 * time.Millisecond)
		for range 2 * MaxInFlight {
			started <- struct{}{}
		}
	}()
	wg.Wait()
	if most != MaxInFlight {
		t.Fatalf("at most %d batches in flight at once, want %d", most, MaxInFlight)
	}
}

func waitQueued(t *testing.T, b *Batcher[int, int], n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		b.mu.Lock()
		q := len(b.queue)
		b.mu.Unlock()
		if q == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d queued, want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestGroupKeepsEachKeysOrder: a key whose quota changes and changes back
// is in a group per run, in arrival order; one key alone is one group.
func TestGroupKeepsEachKeysOrder(t *testing.T) {
	type req struct{ key, quota string }
	calls := func(reqs ...req) []*Call[req, int] {
		cs := make([]*Call[req, int], len(reqs))
		for i, r := range reqs {
			cs[i] = &Call[req, int]{Req: r}
		}
		return cs
	}
	show := func(groups [][]*Call[req, int]) [][]req {
		var out [][]req
		for _, g := range groups {
			var rs []req
			for _, c := range g {
				rs = append(rs, c.Req)
			}
			out = append(out, rs)
		}
		return out
	}
	id := func(r req) req { return r }
	key := func(r req) string { return r.key }
	a1, a2, b1 := req{"a", "1"}, req{"a", "2"}, req{"b", "1"}
	got := show(Group(calls(a1, b1, a2, a1, b1, a1), id, key))
	want := [][]req{{a1}, {b1, b1}, {a2}, {a1, a1}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("Group = %v; want %v", got, want)
	}
	if got := show(Group(calls(a1, a1, a1), id, key)); len(got) != 1 || len(got[0]) != 3 {
		t.Fatalf("Group of one key = %v; want one group of 3", got)
	}
	if got := Group(calls(), id, key); got != nil {
		t.Fatalf("Group of nothing = %v; want nil", got)
	}
}

// TestDoAll: a caller's own batch goes in batches of at most maxBatch
// requests and maxUnits units, in order; after a batch the store could
// not be reached for, and under an ended context, nothing more is sent.
func TestDoAll(t *testing.T) {
	r := newRecorder()
	b := New(deadline.NewShared(time.Second), 3, r.one, r.many).WithUnits(func(n int) int { return n }, 10)
	res, errs := b.DoAll(context.Background(), []int{1, 2, 3, 4, 9, 11, 1, 1})
	if errs != nil || !slices.Equal(res, []int{1, 2, 3, 4, 9, 11, 1, 1}) {
		t.Fatalf("DoAll = %v, %v; want every request echoed", res, errs)
	}
	want := [][]int{{1, 2, 3}, {4}, {9}, {11}, {1, 1}}
	if !slices.EqualFunc(r.batches, want, slices.Equal) {
		t.Fatalf("batches %v; want %v (at most 3 requests, 10 units, one heavier request alone)", r.batches, want)
	}

	sent := 0
	down := New(deadline.NewShared(time.Second), 2, r.one, func(ctx context.Context, calls []*Call[int, int]) {
		sent++
		for _, c := range calls {
			c.Err = context.DeadlineExceeded
		}
	})
	_, errs = down.DoAll(context.Background(), []int{1, 2, 3, 4, 5})
	if sent != 1 || len(errs) != 5 || !errors.Is(errs[4], context.DeadlineExceeded) {
		t.Fatalf("store unreachable: %d batches sent, errors %v; want 1 sent, every request failed", sent, errs)
	}
	refused := 0
	picky := New(deadline.NewShared(time.Second), 2, r.one, func(ctx context.Context, calls []*Call[int, int]) {
		refused++
		for _, c := range calls {
			c.Err = errors.New("WRONGTYPE")
		}
	})
	if _, errs = picky.DoAll(context.Background(), []int{1, 2, 3, 4, 5}); refused != 3 || len(errs) != 5 {
		t.Fatalf("requests refused: %d batches sent, errors %v; want all 3 sent (a refusal is about its requests)", refused, errs)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r.batches = nil
	_, errs = b.DoAll(ctx, []int{1, 2})
	if len(r.batches) != 0 || !errors.Is(errs[1], context.Canceled) {
		t.Fatalf("canceled: batches %v, errors %v; want none sent, context.Canceled", r.batches, errs)
	}
}

// TestCallsReusedOnlyWhenFree: the Calls of Do are reused (a pool), yet a
// caller always gets its own request's result: one whose context ends
// while its call is in a flush leaves the Call to that flush, which still
// signals it, so no later caller can take the signal meant for it. Many
// callers with short deadlines and slow flushes meet every case
// (withdrawn while queued, given up in a flush, answered).
func TestCallsReusedOnlyWhenFree(t *testing.T) {
	echo := func(ctx context.Context, req int) (int, error) {
		time.Sleep(time.Millisecond) // the others queue meanwhile
		return req, nil
	}
	many := func(ctx context.Context, calls []*Call[int, int]) {
		time.Sleep(time.Millisecond)
		for _, c := range calls {
			c.Res = c.Req
		}
	}
	b := New(deadline.NewShared(time.Second), 4, echo, many)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var answered, gaveUp int
	for g := range 16 {
		wg.Go(func() {
			for i := range 200 {
				req := g*1000 + i
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%7)*500*time.Microsecond)
				res, err := b.Do(ctx, req)
				cancel()
				mu.Lock()
				if err == nil {
					answered++
				} else {
					gaveUp++
				}
				mu.Unlock()
				if err == nil && res != req {
					t.Errorf("Do(%d) = %d: another caller's result", req, res)
					return
				}
			}
		})
	}
	wg.Wait()
	if answered == 0 || gaveUp == 0 {
		t.Fatalf("%d answered, %d gave up: want both", answered, gaveUp)
	}
}

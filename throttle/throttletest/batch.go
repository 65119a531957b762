package throttletest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// NewBatchFunc returns a fresh limiter (state of its own) of Rate r and,
// for token buckets, burst r.Count, reading time from c, with quotas q
// (WithQuotas) when q is not nil.
type NewBatchFunc func(t *testing.T, r throttle.Rate, c throttle.Clock, q throttle.QuotaFunc) throttle.BatchLimiter

// RunBatch checks throttle.BatchLimiter's contract on limiters from
// newLimiter:
//   - AllowBatch decides exactly as AllowN one after another at the same
//     instant, on a twin of the same configuration: random batches over a
//     few keys (each key several times), costs 1 to 3, at instants that
//     refill part of the limit between batches;
//   - more requests than one script call carries (600 on one key) are
//     decided in order: exactly the limit admitted, the first ones;
//   - so it does while a key's quota changes from request to request
//     (the quota is read once per request, in order, as by AllowN);
//   - a request with a bad cost fails the call before anything is
//     decided, naming its place;
//   - under a canceled context nothing is decided, and every request
//     says so in a *throttle.BatchError;
//   - an empty batch decides nothing.
func RunBatch(t *testing.T, newLimiter NewBatchFunc) {
	t.Run("matches one by one", func(t *testing.T) { testBatchMatches(t, newLimiter, nil) })
	t.Run("quota changes within a batch", func(t *testing.T) {
		testBatchMatches(t, newLimiter, func() throttle.QuotaFunc {
			calls := 0
			quotas := []throttle.Quota{{}, {Rate: throttle.PerSecond(3)}, {Rate: throttle.PerMinute(12)}}
			return func(string) throttle.Quota {
				calls++
				return quotas[calls/3%len(quotas)]
			}
		})
	})
	t.Run("longer than a call", func(t *testing.T) { testBatchLong(t, newLimiter) })
	t.Run("bad cost", func(t *testing.T) { testBatchBadCost(t, newLimiter) })
	t.Run("canceled", func(t *testing.T) { testBatchCanceled(t, newLimiter) })
	t.Run("empty", func(t *testing.T) {
		l := newLimiter(t, throttle.PerSecond(5), NewClock(T0), nil)
		if ds, err := l.AllowBatch(context.Background(), nil); err != nil || len(ds) != 0 {
			t.Fatalf("AllowBatch(nil) = %v, %v; want no decisions, nil", ds, err)
		}
	})
}

// testBatchMatches compares a batch with AllowN one by one; quotas, if
// not nil, makes the quota function of each of the two (the same sequence
// of quotas for both).
func testBatchMatches(t *testing.T, newLimiter NewBatchFunc, quotas func() throttle.QuotaFunc) {
	ctx := context.Background()
	r := throttle.PerSecond(10)
	clock := NewClock(T0)
	var qb, qs throttle.QuotaFunc
	if quotas != nil {
		qb, qs = quotas(), quotas()
	}
	batch, single := newLimiter(t, r, clock, qb), newLimiter(t, r, clock, qs)
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []string{"a", "b", "", "c{d}"}
	admitted := 0
	for round := range 12 {
		reqs := make([]throttle.Request, 1+rng.IntN(20))
		for i := range reqs {
			reqs[i] = throttle.Request{Key: keys[rng.IntN(len(keys))], N: 1 + rng.IntN(3)}
		}
		got, err := batch.AllowBatch(ctx, reqs)
		if err != nil || len(got) != len(reqs) {
			t.Fatalf("round %d: AllowBatch = %d decisions, %v; want %d", round, len(got), err, len(reqs))
		}
		for i, q := range reqs {
			want, err := single.AllowN(ctx, q.Key, q.N)
			if err != nil {
				t.Fatal(err)
			}
			if got[i] != want {
				t.Fatalf("round %d, reqs[%d] = %+v: AllowBatch decided %+v, AllowN one by one %+v", round, i, q, got[i], want)
			}
			if want.Allowed {
				admitted++
			}
		}
		clock.Advance(time.Duration(rng.IntN(400)) * time.Millisecond)
	}
	if admitted == 0 {
		t.Fatal("no request admitted: the comparison saw only rejections")
	}
}

func testBatchLong(t *testing.T, newLimiter NewBatchFunc) {
	r := throttle.PerSecond(500)
	l := newLimiter(t, r, NewClock(T0), nil)
	reqs := make([]throttle.Request, 600)
	for i := range reqs {
		reqs[i] = throttle.Request{Key: "long", N: 1}
	}
	ds, err := l.AllowBatch(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range ds {
		if want := i < r.Count; d.Allowed != want {
			t.Fatalf("reqs[%d]: Allowed = %v; want %v (the first %d of 600 fit)", i, d.Allowed, want, r.Count)
		}
	}
}

func testBatchBadCost(t *testing.T, newLimiter NewBatchFunc) {
	ctx := context.Background()
	r := throttle.PerSecond(5)
	l := newLimiter(t, r, NewClock(T0), nil)
	for _, n := range []int{0, -1, r.Count + 1} {
		reqs := []throttle.Request{{Key: "k", N: 1}, {Key: "k", N: 2}, {Key: "k", N: n}}
		ds, err := l.AllowBatch(ctx, reqs)
		if !errors.Is(err, throttle.ErrInvalidCost) || !strings.Contains(err.Error(), "reqs[2]") || ds != nil {
			t.Fatalf("AllowBatch with reqs[2].N = %d: %v, %v; want no decisions and an error naming reqs[2], wrapping ErrInvalidCost", n, ds, err)
		}
	}
	// Nothing was decided: the whole limit is still there.
	d, err := l.AllowN(ctx, "k", r.Count)
	if err != nil || !d.Allowed {
		t.Fatalf("AllowN(k, %d) after the refused batches = %+v, %v; want admitted (nothing charged)", r.Count, d, err)
	}
}

func testBatchCanceled(t *testing.T, newLimiter NewBatchFunc) {
	r := throttle.PerSecond(5)
	l := newLimiter(t, r, NewClock(T0), nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	reqs := make([]throttle.Request, 300) // two script calls' worth
	for i := range reqs {
		reqs[i] = throttle.Request{Key: fmt.Sprint("c", i%3), N: 1}
	}
	_, err := l.AllowBatch(ctx, reqs)
	be, _ := BatchErrorOf(t, err)
	for i, e := range be.Errs {
		if !errors.Is(e, context.Canceled) {
			t.Fatalf("reqs[%d] under a canceled context: %v; want context.Canceled", i, e)
		}
	}
	if d, err := l.AllowN(context.Background(), "c0", r.Count); err != nil || !d.Allowed {
		t.Fatalf("AllowN(c0, %d) after the canceled batch = %+v, %v; want admitted (nothing charged)", r.Count, d, err)
	}
}

// BatchErrorOf returns err as a *throttle.BatchError, failing t if it is
// not one, and says which requests failed.
func BatchErrorOf(t testing.TB, err error) (be *throttle.BatchError, failed string) {
	t.Helper()
	if !errors.As(err, &be) {
		t.Fatalf("error %v: not a *throttle.BatchError", err)
	}
	var idx []string
	for i, e := range be.Errs {
		if e != nil {
			idx = append(idx, fmt.Sprint(i))
		}
	}
	return be, strings.Join(idx, ",")
}

// CheckBatchCalls checks, on l (a limit of 2 per key, on its own store so
// that scriptCalls counts its calls alone, its script loaded) where the
// key "poison" holds another program's value: a batch of 90 requests over
// 30 keys is one script call, deciding exactly 2 per key, in order; and a
// batch beside the foreign key fails only that key's requests, with the
// store's WRONGTYPE, their Decisions zero.
func CheckBatchCalls(t *testing.T, l throttle.BatchLimiter, scriptCalls func() int) {
	t.Helper()
	ctx := context.Background()
	var reqs []throttle.Request
	for i := range 90 {
		reqs = append(reqs, throttle.Request{Key: fmt.Sprint("k", i%30), N: 1})
	}
	before := scriptCalls()
	ds, err := l.AllowBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if calls := scriptCalls() - before; calls != 1 {
		t.Fatalf("a batch of 90 requests over 30 keys took %d script calls; want 1", calls)
	}
	for i, d := range ds {
		if want := i < 60; d.Allowed != want || d.Source != throttle.SourceRedis {
			t.Fatalf("reqs[%d] (%q, its %d. request): %+v; want allowed %v (2 per key)", i, reqs[i].Key, i/30+1, d, want)
		}
	}

	reqs = []throttle.Request{{Key: "x", N: 1}, {Key: "poison", N: 1}, {Key: "y", N: 2}, {Key: "poison", N: 1}}
	ds, err = l.AllowBatch(ctx, reqs)
	be, failed := BatchErrorOf(t, err)
	if failed != "1,3" || !strings.Contains(be.Errs[1].Error(), "WRONGTYPE") || !strings.Contains(err.Error(), "2 of 4") {
		t.Fatalf("batch with a foreign key: %v (failed %s); want reqs 1 and 3 failed with WRONGTYPE", err, failed)
	}
	if !ds[0].Allowed || !ds[2].Allowed || ds[1] != (throttle.Decision{}) {
		t.Fatalf("batch with a foreign key: %+v; want x and y admitted, the foreign key's Decisions zero", ds)
	}
}

package bucket

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestHeadDecidesAsBucketLua: bucket_head.lua's lone AllowN against
// bucket.lua's whole path (the same call with one more argument, which
// the head leaves alone and bucket.lua ignores), on 400 random states of
// two keys set alike: missing (brand-new, or lost: held ahead), the
// current layout with credit from a debt to full and its ts up to two
// periods back or ahead of now, another period (a quota that changed),
// the text layout, paused or not; n from 1 to the burst. Both answer the
// same tokens and, refilled to the same instant, the same credit, and
// store the same bucket, expiring when it is full again (to the ms).
func TestHeadDecidesAsBucketLua(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	prefix := freshPrefix()
	rng := rand.New(rand.NewPCG(28, 96))
	const burst = 10
	per, count := int64(100_000), int64(1) // 10 tokens a second: one token is 100,000 units, one µs adds 1
	capacity := burst * per
	call := func(key string, held string, n int, whole bool) []int64 {
		args := append(takeScript.Start(nil), "2", key, key+":pause", "", "1", strconv.FormatInt(per, 10), strconv.FormatInt(count, 10), strconv.FormatInt(capacity, 10), held, "1", strconv.Itoa(n))
		if whole {
			args = append(args, "")
		}
		cmd := redis.NewIntSliceCmd(ctx, args...)
		if err := takeScript.Run(ctx, client, cmd); err != nil {
			t.Fatal(err)
		}
		return cmd.Val()
	}
	for i := range 400 {
		now := time.Now().UnixMicro()
		head, whole := prefix+"{h"+strconv.Itoa(i)+"}", prefix+"{w"+strconv.Itoa(i)+"}"
		held := "0"
		var value string
		switch state := rng.IntN(6); state {
		case 0: // missing, brand-new
		case 1: // missing, lost
			held = strconv.FormatInt(now+int64(rng.IntN(2_000_000))+1_000_000, 10)
		case 2, 3: // the current layout
			credit := rng.Int64N(capacity+3*per) - 3*per
			ts := now + rng.Int64N(4*per) - 2*per
			value = packedBucket(float64(credit), float64(ts), float64(per))
			held = strconv.FormatInt(ts+1, 10)
		case 4: // another period
			value = packedBucket(float64(rng.Int64N(burst)*2*per), float64(now-rng.Int64N(per)), float64(2*per))
		case 5: // the text layout
			value = strconv.FormatInt(rng.Int64N(capacity), 10) + " " + strconv.FormatInt(now-rng.Int64N(per), 10) + " " + strconv.FormatInt(per, 10)
		}
		paused := rng.IntN(8) == 0
		for _, k := range []string{head, whole} {
			if value != "" {
				client.Set(ctx, k, value, time.Minute)
			}
			if paused {
				client.Set(ctx, k+":pause", strconv.FormatInt(now+5_000_000, 10), time.Minute)
			}
		}
		n := 1 + rng.IntN(burst)
		h := call(head, held, n, false)
		w := call(whole, held, n, true)
		if len(h) != 3 || len(w) != 3 {
			t.Fatalf("case %d: replies %v and %v, want 3 integers each", i, h, w)
		}
		// The later call found the credit the earlier one found, plus at
		// most count per µs between them (less while ts is ahead), up to
		// the capacity; each took n tokens if that credit held them.
		elapsed := w[2] - h[2]
		before := func(r []int64) int64 { return r[1] + max(r[0], 0)*per }
		took := func(r []int64) bool { // n tokens if the credit held them, else none; or paused
			want := int64(0)
			if before(r) >= int64(n)*per {
				want = int64(n)
			}
			return r[0] < 0 || r[0] == want
		}
		refused := h[0] < 0 // paused: -h[0] is the µs left, fewer by the time between
		switch {
		case refused != (w[0] < 0), refused && w[0] != h[0]+elapsed, !took(h), !took(w),
			before(w) < before(h), before(w) > min(before(h)+elapsed*count, capacity) && before(w) != before(h):
			t.Fatalf("case %d (n %d, held %s, value %q): head %v, whole %v (%d µs apart)", i, n, held, value, h, w, elapsed)
		}
		hv, wv := client.Get(ctx, head).Val(), client.Get(ctx, whole).Val()
		if len(hv) != 25 || len(wv) != 25 { // missing, or another layout left as it was
			if hv != wv {
				t.Fatalf("case %d: stored %q by the head, %q by the whole path", i, hv, wv)
			}
			continue
		}
		hc, hts, hper, hok := storedBucket(t, client, head)
		wc, wts, wper, wok := storedBucket(t, client, whole)
		if hok != wok || hper != wper || (hok && hts-h[2] != wts-w[2] && hts != wts) {
			t.Fatalf("case %d: stored %d %d %d %v by the head, %d %d %d %v by the whole path", i, hc, hts, hper, hok, wc, wts, wper, wok)
		}
		if h[0] > 0 || value == "" { // written: tokens taken, or a missing bucket started
			// Each expires when it is full again: its instant plus
			// (cap - credit) / count, rounded up to the ms.
			for _, k := range []struct {
				key    string
				now    int64
				credit int64
			}{{head, h[2], hc}, {whole, w[2], wc}} {
				d := count * 1000
				want := time.Duration(k.now/1000+(capacity-k.credit+d-1)/d) * time.Millisecond
				if got := client.PExpireTime(ctx, k.key).Val(); got-want > 10*time.Millisecond || want-got > 10*time.Millisecond { // (Redis's cached ms clock)
					t.Fatalf("case %d: %s expires at %v, want %v (full again)", i, k.key, got, want)
				}
			}
		}
	}
}

// TestLoneCallFindsLostBucket: a lone AllowN (bucket_head.lua) on a
// bucket this process took from, after FLUSHALL, starts it empty: it
// refuses, and admits again a token's time later; a key no process took
// from is a brand-new bucket, full.
func TestLoneCallFindsLostBucket(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	l, err := NewRedis(client, throttle.PerSecond(10), 10, WithPrefix(freshPrefix()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if d, err := l.AllowN(ctx, "k", 3); err != nil || !d.Allowed {
		t.Fatalf("first AllowN(3) = %+v, %v; want admitted", d, err)
	}
	srv.FlushAll(t)
	d, err := l.AllowN(ctx, "k", 1)
	if err != nil || d.Allowed {
		t.Fatalf("AllowN(1) after FLUSHALL = %+v, %v; want refused: the bucket was lost, not full", d, err)
	}
	if d.RetryAfter <= 0 || d.RetryAfter > 100*time.Millisecond {
		t.Fatalf("RetryAfter %v after the loss, want up to a token's time (100ms)", d.RetryAfter)
	}
	if d, err := l.AllowN(ctx, "fresh", 10); err != nil || !d.Allowed {
		t.Fatalf("AllowN(10) on a brand-new key = %+v, %v; want admitted (full)", d, err)
	}
	time.Sleep(d.RetryAfter + 5*time.Millisecond)
	if d, err := l.AllowN(ctx, "k", 1); err != nil || !d.Allowed {
		t.Fatalf("AllowN(1) a token's time after the loss = %+v, %v; want admitted", d, err)
	}
}

package quota_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/queuethrottle/queuethrottle/bucket"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/quota"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
	"github.com/queuethrottle/queuethrottle/window"
)

func newHash(t *testing.T, c quota.Client, key string, opts ...quota.Option) *quota.RedisHash {
	t.Helper()
	h, err := quota.NewRedisHash(context.Background(), c, key, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	return h
}

func TestNewRedisHashErrors(t *testing.T) {
	c := redistest.Shared(t).Client(t)
	var nilClient *redis.Client
	for _, tt := range []struct {
		name  string
		c     quota.Client
		key   string
		opts  []quota.Option
		field string
	}{
		{"nil client", nil, "k", nil, "client"},
		{"typed nil client", nilClient, "k", nil, "client"},
		{"empty key", c, "", nil, "key"},
		{"refresh", c, "k", []quota.Option{quota.WithRefresh(0)}, "WithRefresh"},
		{"timeout", c, "k", []quota.Option{quota.WithTimeout(-1)}, "WithTimeout"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := quota.NewRedisHash(context.Background(), tt.c, tt.key, tt.opts...)
			var oe *throttle.OptionError
			require.ErrorAs(t, err, &oe)
			assert.Equal(t, tt.field, oe.Field)
			assert.ErrorIs(t, err, throttle.ErrInvalidOption)
		})
	}
}

// TestRedisHashSeenWithinASecond: a change made with HSET, as redis-cli
// makes it, reaches two processes' sources within 1 s (the default
// refresh is 250 ms).
func TestRedisHashSeenWithinASecond(t *testing.T) {
	srv := redistest.Shared(t)
	key := freshKey()
	admin := srv.Client(t)
	ctx := context.Background()
	require.NoError(t, admin.HSet(ctx, key, "gold", "100/1s burst 200").Err())
	a, b := newHash(t, srv.Client(t), key), newHash(t, srv.Client(t), key)
	gold := throttle.Quota{Rate: throttle.PerSecond(100), Burst: 200}
	assert.Equal(t, gold, a.Quota("gold"), "read before NewRedisHash returns")
	assert.Equal(t, throttle.Quota{}, a.Quota("other"))

	for i, v := range []string{"5/1s", "7/1m burst 1"} {
		want, err := throttle.ParseQuota(v)
		require.NoError(t, err)
		start := time.Now()
		require.NoError(t, admin.HSet(ctx, key, "gold", v).Err())
		require.Eventually(t, func() bool { return a.Quota("gold") == want && b.Quota("gold") == want },
			time.Second, 5*time.Millisecond, "change %d not seen within 1 s", i)
		t.Logf("HSET gold %q seen by both in %v", v, time.Since(start).Round(time.Millisecond))
	}
	// The last field deleted from redis-cli: with the marker left in, the
	// hash reads emptied, not lost (see TestRedisHashLost).
	require.NoError(t, admin.HSet(ctx, key, quota.Marker, "1").Err())
	require.NoError(t, admin.HDel(ctx, key, "gold").Err())
	require.Eventually(t, func() bool { return a.Quota("gold").IsZero() && b.Quota("gold").IsZero() }, time.Second, 5*time.Millisecond)

	// Set: at once here, and in the hash for the others.
	q := throttle.Quota{Rate: throttle.PerMinute(60), Burst: 10}
	require.NoError(t, a.Set(ctx, "silver", q))
	assert.Equal(t, q, a.Quota("silver"))
	assert.Equal(t, "60/1m0s burst 10", admin.HGet(ctx, key, "silver").Val())
	require.NoError(t, b.Refresh(ctx))
	assert.Equal(t, map[string]throttle.Quota{"silver": q}, b.Quotas())
	require.NoError(t, a.Delete(ctx, "silver"))
	assert.True(t, a.Quota("silver").IsZero())
	require.ErrorIs(t, a.Set(ctx, "x", throttle.Quota{Rate: throttle.Rate{Count: -1, Per: time.Second}}), throttle.ErrInvalidOption)
	require.ErrorIs(t, a.Set(ctx, "x", throttle.Quota{Rate: throttle.PerSecond(1), Burst: -1}), throttle.ErrInvalidOption)
}

// TestRedisHashBadValues: a bad value is skipped and reported once,
// naming the field; the other fields stay in force.
func TestRedisHashBadValues(t *testing.T) {
	srv := redistest.Shared(t)
	key := freshKey()
	admin := srv.Client(t)
	ctx := context.Background()
	require.NoError(t, admin.HSet(ctx, key, "good", "10/1s", "bad", "ten per second").Err())
	var mu sync.Mutex
	var errs []error
	h := newHash(t, srv.Client(t), key, quota.WithRefresh(20*time.Millisecond), quota.WithErrorHandler(func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}))
	assert.Equal(t, throttle.Quota{Rate: throttle.PerSecond(10)}, h.Quota("good"))
	assert.True(t, h.Quota("bad").IsZero())
	for range 5 { // more reads: still one report
		require.NoError(t, h.Refresh(ctx))
	}
	mu.Lock()
	require.Len(t, errs, 1)
	var fe *quota.FieldError
	require.ErrorAs(t, errs[0], &fe)
	assert.Equal(t, "bad", fe.Field)
	assert.Equal(t, "ten per second", fe.Value)
	assert.ErrorIs(t, errs[0], throttle.ErrInvalidOption)
	assert.Contains(t, errs[0].Error(), `field "bad"`)
	mu.Unlock()

	require.NoError(t, admin.HSet(ctx, key, "bad", "3/1s burst 0").Err())
	require.NoError(t, h.Refresh(ctx))
	require.NoError(t, admin.HSet(ctx, key, "bad", "3/1s").Err())
	require.NoError(t, h.Refresh(ctx))
	assert.Equal(t, throttle.Quota{Rate: throttle.PerSecond(3)}, h.Quota("bad"))
	mu.Lock()
	assert.Len(t, errs, 2, "a new bad value is reported again")
	mu.Unlock()

	// A typo in a key that had a good quota keeps it: never the default.
	require.NoError(t, admin.HSet(ctx, key, "bad", "3/1ss").Err())
	for range 3 {
		require.NoError(t, h.Refresh(ctx))
	}
	assert.Equal(t, throttle.Quota{Rate: throttle.PerSecond(3)}, h.Quota("bad"), "the last good quota")
	mu.Lock()
	require.Len(t, errs, 3)
	require.ErrorAs(t, errs[2], &fe)
	assert.Equal(t, "3/1ss", fe.Value)
	assert.Equal(t, throttle.Quota{Rate: throttle.PerSecond(3)}, fe.Kept)
	assert.Contains(t, errs[2].Error(), `keeping the last good quota "3/1s"`)
	mu.Unlock()
}

// TestRedisHashZeroBlocks: "0/1s" rejects every request of its key, in
// a window and a bucket alike, with the refresh interval as retry-after
// and nothing charged; another value unblocks it with its whole limit.
func TestRedisHashZeroBlocks(t *testing.T) {
	srv := redistest.Shared(t)
	key := freshKey()
	ctx := context.Background()
	admin := srv.Client(t)
	require.NoError(t, admin.HSet(ctx, key, "t", "0/1s").Err())
	c := srv.Client(t)
	h := newHash(t, c, key, quota.WithRefresh(40*time.Millisecond))
	assert.True(t, h.Quota("t").IsBlocked())
	w, err := window.NewRedis(c, throttle.PerSecond(100), window.WithQuotas(h.Func()), window.WithPrefix(redistest.Prefix("quota-w")), window.WithTimeout(redistest.CallTimeout))
	require.NoError(t, err)
	b, err := bucket.NewRedis(c, throttle.PerSecond(100), 100, bucket.WithQuotas(h.Func()), bucket.WithPrefix(redistest.Prefix("quota-b")), bucket.WithTimeout(redistest.CallTimeout))
	require.NoError(t, err)
	gw, err := throttle.NewGate(w, throttle.WithFailurePolicy(throttle.FailOpen))
	require.NoError(t, err)
	for range 50 {
		for _, l := range []throttle.Limiter{w, b} {
			d, err := l.AllowN(ctx, "t", 1)
			require.NoError(t, err)
			require.False(t, d.Allowed, "0/1s admits nothing")
			require.Equal(t, 40*time.Millisecond, d.RetryAfter, "the refresh interval")
		}
		d, err := gw.AdmitID(ctx, "t", 1, "m-1")
		require.NoError(t, err)
		require.False(t, d.Allowed, "a blocked key is a rejection, not a store failure for FailOpen")
		require.Nil(t, d.Err)
	}
	require.NoError(t, admin.HSet(ctx, key, "t", "5/1s").Err())
	require.NoError(t, h.Refresh(ctx))
	for _, l := range []throttle.Limiter{w, b} {
		d, err := l.AllowN(ctx, "t", 5)
		require.NoError(t, err)
		assert.True(t, d.Allowed, "unblocked with the whole 5: the block charged nothing")
	}
}

// TestRedisHashLost: a hash that vanishes (as after FLUSHALL) keeps every
// quota last read, reported once, until it is written again; a hash that
// Delete emptied is empty, not lost.
func TestRedisHashLost(t *testing.T) {
	srv := redistest.Shared(t)
	key := freshKey()
	ctx := context.Background()
	admin := srv.Client(t)
	require.NoError(t, admin.HSet(ctx, key, "a", "2/1s", "b", "0/1s").Err())
	var mu sync.Mutex
	var errs []error
	h := newHash(t, srv.Client(t), key, quota.WithErrorHandler(func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}))
	require.NoError(t, admin.Del(ctx, key).Err())
	for range 3 {
		require.NoError(t, h.Refresh(ctx))
	}
	assert.Equal(t, throttle.Quota{Rate: throttle.PerSecond(2)}, h.Quota("a"))
	assert.True(t, h.Quota("b").IsBlocked(), "a blocked key stays blocked")
	mu.Lock()
	require.Len(t, errs, 1)
	var le *quota.LostError
	require.ErrorAs(t, errs[0], &le)
	assert.Equal(t, 2, le.Kept)
	mu.Unlock()

	// Set while lost writes back every quota kept, beside its own.
	require.NoError(t, h.Set(ctx, "c", throttle.Quota{Rate: throttle.PerSecond(7)}))
	require.NoError(t, h.Refresh(ctx))
	assert.Equal(t, throttle.Quota{Rate: throttle.PerSecond(2)}, h.Quota("a"))
	assert.True(t, h.Quota("b").IsBlocked(), "one Set does not drop the kept quotas")
	assert.Equal(t, throttle.Quota{Rate: throttle.PerSecond(7)}, h.Quota("c"))
	assert.Equal(t, "0/1s", admin.HGet(ctx, key, "b").Val())
	require.NoError(t, admin.Del(ctx, key).Err())
	require.NoError(t, h.Refresh(ctx))
	mu.Lock()
	require.Len(t, errs, 2, "lost again after it was written: reported again")
	require.ErrorAs(t, errs[1], &le)
	assert.Equal(t, 3, le.Kept)
	mu.Unlock()

	// Written again from elsewhere: the hash is what it says.
	require.NoError(t, admin.HSet(ctx, key, "a", "4/1s").Err())
	require.NoError(t, h.Refresh(ctx))
	assert.Equal(t, throttle.Quota{Rate: throttle.PerSecond(4)}, h.Quota("a"))
	assert.True(t, h.Quota("b").IsZero())

	// Emptied on purpose.
	require.NoError(t, h.Delete(ctx, "a"))
	require.NoError(t, h.Refresh(ctx))
	assert.Empty(t, h.Quotas())
	n, err := admin.HLen(ctx, key).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "the marker keeps the hash")
	mu.Lock()
	assert.Len(t, errs, 2, "an emptied hash is not reported lost")
	mu.Unlock()
	err = h.Set(ctx, quota.Marker, throttle.Quota{Rate: throttle.PerSecond(1)})
	assert.ErrorIs(t, err, throttle.ErrInvalidOption)
}

// TestRedisHashRedisDown: while Redis is down the last quotas stay, the
// failure is reported (not at every read), and Close still returns.
func TestRedisHashRedisDown(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	srv := redistest.Start(t)
	key := freshKey()
	ctx := context.Background()
	admin := srv.Client(t)
	require.NoError(t, admin.HSet(ctx, key, "t", "10/1s").Err())
	var reports atomic.Int64
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	h, err := quota.NewRedisHash(ctx, c, key, quota.WithRefresh(10*time.Millisecond), quota.WithTimeout(time.Second),
		quota.WithErrorHandler(func(err error) {
			assert.Contains(t, err.Error(), "quota: redis")
			reports.Add(1)
		}))
	require.NoError(t, err)
	srv.Stop()
	require.Eventually(t, func() bool { return reports.Load() > 0 }, 5*time.Second, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // ~30 failed reads
	assert.Equal(t, int64(1), reports.Load(), "one report per 5 s while reads fail")
	assert.Equal(t, throttle.Quota{Rate: throttle.PerSecond(10)}, h.Quota("t"), "the last quotas read stay")
	require.Error(t, h.Refresh(ctx))

	require.NoError(t, srv.Restart()) // empty: the hash is gone
	require.NoError(t, admin.HSet(ctx, key, "t", "20/1s").Err())
	require.Eventually(t, func() bool { return h.Quota("t").Rate.Count == 20 }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, h.Close())
	require.NoError(t, h.Close())
	require.NoError(t, c.Close())
	goleak.VerifyNone(t, append([]goleak.Option{ignore},
		goleak.IgnoreAnyFunction("github.com/queuethrottle/queuethrottle/internal/redistest.(*Server).start.func1"),
		goleak.IgnoreAnyFunction("os/exec.(*Cmd).Start.func2"))...)
}

// commandCounter is a go-redis hook counting the commands sent, by name.
type commandCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.mu.Lock()
		c.n[cmd.Name()]++
		c.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.mu.Lock()
		for _, cmd := range cmds {
			c.n[cmd.Name()]++
		}
		c.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (c *commandCounter) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

// TestRedisHashNoExtraRoundTrip: with quotas from the hash, a Redis
// limiter's decision is still one command (the script), on the client
// the source shares; the source's reads are the only others.
func TestRedisHashNoExtraRoundTrip(t *testing.T) {
	srv := redistest.Shared(t)
	key := freshKey()
	ctx := context.Background()
	c := srv.Client(t)
	counter := &commandCounter{n: map[string]int{}}
	c.AddHook(counter)
	require.NoError(t, c.HSet(ctx, key, "gold", "50/1s burst 60", "free", "5/1s").Err())
	h := newHash(t, c, key)
	b, err := bucket.NewRedis(c, throttle.PerSecond(1), 1, bucket.WithQuotas(h.Func()), bucket.WithPrefix(redistest.Prefix("quota-b")), bucket.WithTimeout(redistest.CallTimeout))
	require.NoError(t, err)
	w, err := window.NewRedis(c, throttle.PerSecond(1), window.WithQuotas(h.Func()), window.WithPrefix(redistest.Prefix("quota-w")), window.WithTimeout(redistest.CallTimeout))
	require.NoError(t, err)
	for _, l := range []throttle.Limiter{b, w} { // loads the scripts
		_, err := l.AllowN(ctx, "warm", 1)
		require.NoError(t, err)
	}
	counter.take()
	const decisions = 200
	admitted := map[string]int{}
	for i := range decisions {
		l := throttle.Limiter(b)
		if i%2 == 1 {
			l = w
		}
		for _, tenant := range []string{"gold", "free"} {
			d, err := l.AllowN(ctx, tenant, 1)
			require.NoError(t, err)
			want := map[string]int{"gold": 50, "free": 5}[tenant]
			require.Equal(t, want, d.Limit, "the quota from the hash")
			if d.Allowed {
				admitted[tenant]++
			}
		}
	}
	n := counter.take()
	// The refresh's reads, and the handshake of a connection the pool
	// dials when a refresh finds the only one busy (HELLO, CLIENT SETINFO),
	// are the source's, not the decisions'.
	other := map[string]int{}
	for _, cmd := range []string{"hgetall", "hello", "client"} {
		if n[cmd] > 0 {
			other[cmd] = n[cmd]
		}
		delete(n, cmd)
	}
	assert.Equal(t, map[string]int{"evalsha": 2 * decisions}, n, "one script call per decision, nothing else")
	t.Logf("%d decisions: %v, and the source's %v; admitted %v", 2*decisions, n, other, admitted)
}

// TestRedisHashShrink: once every process has seen a smaller quota, none
// admits over it, window and bucket alike.
func TestRedisHashShrink(t *testing.T) {
	srv := redistest.Shared(t)
	key := freshKey()
	ctx := context.Background()
	admin := srv.Client(t)
	require.NoError(t, admin.HSet(ctx, key, "t", "20/1s").Err())
	clock := throttletest.NewClock(throttletest.T0)
	wPrefix, bPrefix := redistest.Prefix("quota-w"), redistest.Prefix("quota-b")
	type worker struct {
		h    *quota.RedisHash
		w, b throttle.Limiter
	}
	var workers []worker
	for range 2 {
		c := srv.Client(t)
		h := newHash(t, c, key)
		w, err := window.NewRedis(c, throttle.PerSecond(100), window.WithQuotas(h.Func()), window.WithClock(clock), window.WithPrefix(wPrefix), window.WithTimeout(redistest.CallTimeout))
		require.NoError(t, err)
		b, err := bucket.NewRedis(c, throttle.PerSecond(100), 100, bucket.WithQuotas(h.Func()), bucket.WithClock(clock), bucket.WithPrefix(bPrefix), bucket.WithTimeout(redistest.CallTimeout))
		require.NoError(t, err)
		workers = append(workers, worker{h, w, b})
	}
	for _, l := range []throttle.Limiter{workers[0].w, workers[0].b} {
		d, err := l.AllowN(ctx, "t", 3)
		require.NoError(t, err)
		require.True(t, d.Allowed)
		require.Equal(t, 20, d.Limit)
	}
	require.NoError(t, admin.HSet(ctx, key, "t", "5/1s").Err())
	require.Eventually(t, func() bool {
		return workers[0].h.Quota("t").Rate.Count == 5 && workers[1].h.Quota("t").Rate.Count == 5
	}, time.Second, 5*time.Millisecond)
	clock.Advance(100 * time.Millisecond)
	admitted := map[string]int{}
	for range 10 {
		for _, wk := range workers {
			for name, l := range map[string]throttle.Limiter{"window": wk.w, "bucket": wk.b} {
				d, err := l.AllowN(ctx, "t", 1)
				require.NoError(t, err)
				require.Equal(t, 5, d.Limit)
				if d.Allowed {
					admitted[name]++
				}
			}
		}
	}
	// Window: 3 of the old quota still in the window, 5 - 3 more. Bucket:
	// 17 tokens left, capped at the new burst of 5 (0.5 refilled since).
	assert.Equal(t, map[string]int{"window": 2, "bucket": 5}, admitted)
	var err error
	_, err = workers[0].w.AllowN(ctx, "t", 6)
	assert.True(t, errors.Is(err, throttle.ErrInvalidCost), "a cost above the new limit: %v", err)
}

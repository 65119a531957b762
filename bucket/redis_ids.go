package bucket

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/blocked"
	"github.com/queuethrottle/queuethrottle/internal/pause"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redisopt"
	"github.com/queuethrottle/queuethrottle/throttle"
)

var (
	//go:embed bucket_id.lua
	bucketIDLua string
	// idScript runs with EVALSHA, and is reloaded with EVAL on NOSCRIPT.
	idScript = redis.NewScript(convertLua + bucketIDLua)
)

// idsSuffix names a key's ids set beside its bucket: after the hash
// tag, so in the same slot; a bucket key always ends with the tag's '}',
// so none ends with it.
const idsSuffix = ":ids"

// AllowID is AllowN for a request with identity id (opaque bytes, scoped
// to key), as throttle.IDLimiter describes, with Local.AllowID's rules,
// decided in one Lua script (bucket_id.lua) per call at the Redis
// server's TIME (or the WithClock clock). Ids live in a sorted set beside
// the key's bucket (see the package documentation).
//
// Errors: one wrapping throttle.ErrInvalidCost for n < 1 or n > burst, and
// one wrapping throttle.ErrInvalidOption (naming "horizon") for horizon <
// 0 or (WithQuotas) an invalid quota, both before any Redis call;
// otherwise a Redis or context error (including the WithTimeout deadline),
// wrapped as "bucket: redis: ...". After such an error the request may or
// may not have been decided: presenting the same id again never charges
// it twice. With the server's TIME, a script that runs after ctx's
// deadline less one round trip applies nothing, so the id is not found
// admitted later on a decision nobody saw; that error matches
// context.DeadlineExceeded.
func (l *Redis) AllowID(ctx context.Context, key string, n int, id string, horizon time.Duration) (throttle.Decision, error) {
	return l.allowID(ctx, key, n, id, horizon, 0)
}

// AllowIDAfter is AllowID for a request that must not start before now +
// after (in Redis's clock, or the WithClock clock), with Local.AllowIDAfter's
// rules (see throttle.SlotLimiter), in the same one script call. after
// is rounded up to the µs. Errors: those of AllowID, and one wrapping
// throttle.ErrInvalidOption for after < 0, before any Redis call.
func (l *Redis) AllowIDAfter(ctx context.Context, key string, n int, id string, horizon, after time.Duration) (throttle.Decision, error) {
	return l.allowID(ctx, key, n, id, horizon, after)
}

func (l *Redis) allowID(ctx context.Context, key string, n int, id string, horizon, after time.Duration) (throttle.Decision, error) {
	lim, err := l.lims.of(key)
	if err != nil {
		return blocked.Or(err, throttle.SourceLocal)
	}
	if n < 1 || n > lim.p.burst {
		return throttle.Decision{}, throttle.CheckCost(n, lim.p.burst)
	}
	if horizon < 0 {
		return throttle.Decision{}, errHorizon(horizon)
	}
	us, err := throttle.AfterMicros(after)
	if err != nil {
		return throttle.Decision{}, err
	}
	ctx, cancel := l.rt.Bound(ctx)
	defer cancel()
	if err := l.ready(ctx); err != nil {
		return throttle.Decision{}, err
	}
	k := rediskey.Key(l.prefix, key)
	keys := []string{k, k + idsSuffix, k + pause.Suffix}
	h := strconv.FormatInt(horizonMicros(horizon), 10)
	start := time.Now()
	cmd := idScript.Run(ctx, l.client, keys, lim.argPer, lim.argCount, lim.argCap, l.arg(n), id, h, lim.argMaxDebt, lim.argMem, l.now(), l.held.Arg(k), l.expiry(ctx), strconv.FormatInt(us, 10))
	res, err := cmd.Result()
	if err != nil {
		err = l.rt.Done(start, -1, err)
		return throttle.Decision{}, fmt.Errorf("bucket: redis: %w", redisopt.Explain("bucket", err))
	}
	vals, ok := res.([]any)
	if ok && len(vals) == 2 && vals[0] == int64(-1) { // {-1, now}: ran too late, applied nothing
		now, _ := vals[1].(int64)
		l.rt.Done(start, now, nil)
		return throttle.Decision{}, l.rt.Explain(errLate)
	}
	if !ok || len(vals) != 6 {
		return throttle.Decision{}, fmt.Errorf("%w: %v", errReply, res)
	}
	var v [6]int64
	for i, x := range vals {
		if v[i], ok = x.(int64); !ok {
			return throttle.Decision{}, fmt.Errorf("%w: %v", errReply, res)
		}
	}
	allowed, credit, wait, reserved, paused, now := v[0] == 1, v[1], v[2], v[3] == 1, v[4] == 1, v[5]
	l.rt.Done(start, now, nil)
	if credit < -lim.p.maxDebt || credit > lim.p.cap || wait < 0 {
		return throttle.Decision{}, fmt.Errorf("%w: %v", errReply, res)
	}
	if !paused {
		l.noteShort(k, &lim.p, credit, now)
	}
	d := lim.p.decision(allowed, n, credit, lim.limit, throttle.SourceRedis)
	if paused { // wait is the time left of the pause
		if allowed || reserved || wait < 1 {
			return throttle.Decision{}, fmt.Errorf("%w: %v", errReply, res)
		}
		return pause.Decision(d, micros(wait)), nil
	}
	if allowed {
		d.AlreadyAdmitted = reserved
	} else {
		d.RetryAfter = max(micros(wait), time.Millisecond)
		d.Reserved = reserved
	}
	return d, nil
}

var _ throttle.IDLimiter = (*Redis)(nil)

var argNoExpiry any = ""

// errLate is the error of an AllowID whose script ran after its caller's
// deadline less its grace (see deadline.RoundTrip.Expiry) and so applied
// nothing. It matches context.DeadlineExceeded: the call came too late.
var errLate = fmt.Errorf("bucket: redis: the script ran after its caller's deadline and applied nothing (Redis was slow or stalled): %w", context.DeadlineExceeded)

// expiry returns bucket_id.lua's ARGV[11]: the instant after which it
// applies nothing (deadline.RoundTrip.Expiry of ctx's deadline), so that
// a script that runs only after its caller gave up admits no id that its
// redelivery would find admitted, later. A client clock, or no deadline:
// none (the script cannot tell that it runs late).
func (l *Redis) expiry(ctx context.Context) any {
	dl, ok := ctx.Deadline()
	if !ok || l.clock != nil {
		return argNoExpiry
	}
	return strconv.FormatInt(l.rt.Expiry(dl), 10)
}

// ready makes sure the WithServerClock estimate exists (see
// redisclock.Clock.Ready); without WithServerClock it does nothing.
func (l *Redis) ready(ctx context.Context) error {
	if l.server == nil {
		return nil
	}
	if err := l.server.Ready(ctx); err != nil {
		return fmt.Errorf("bucket: redis: %w", err)
	}
	return nil
}

package bucket

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/blocked"
	"github.com/queuethrottle/queuethrottle/internal/coalesce"
	"github.com/queuethrottle/queuethrottle/internal/pause"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redisopt"
	"github.com/queuethrottle/queuethrottle/internal/redisscript"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// takeScript runs with EVALSHA, and is reloaded with EVAL on NOSCRIPT.
var takeScript = redisscript.New(bucketHeadLua + convertLua + bucketLua)

// takeReq is one request of bucket.lua: take at least min tokens of key's
// bucket, at most max.
type takeReq struct {
	key            string     // the Redis key of the bucket
	pause          string     // and of its pause (key + pause.Suffix, one allocation with key)
	lim            *keyLimits // the key's quota's (see WithQuotas)
	argMin, argMax any        // the request's ARGV: n (argMax nil) when min = max = n, else -min and max
	min, max       int
}

// taken is bucket.lua's answer to one request: the tokens taken (0 or
// min..max), the credit left (or there, when nothing was taken) and, when
// the key is paused, the µs left of the pause (else 0).
type taken struct {
	granted int
	credit  int64
	paused  int64
}

type takeCall = coalesce.Call[takeReq, taken]

// maxBatch bounds the requests of one flush.
const maxBatch = 256

var (
	argKeys2 any = "2"
	argOne   any = "1"
	// ARGV[2] of bucket.lua's compact form (see oneTokenEach).
	argCompact any = "-1"
	argTime    any = "" // now: the server's TIME

	pauseSuffix = []byte(pause.Suffix) // for rediskey.KeyAnd
)

// takeReq is the request that takes min to max tokens of key's bucket
// under lim. l.batch.Do coalesces it with the calls of other goroutines:
// the requests queued behind a flush in flight go together (package
// internal/coalesce; see takeMany).
func (l *Redis) takeReq(key string, lim *keyLimits, min, max int) takeReq {
	k, p := rediskey.KeyAnd(l.prefix, key, pauseSuffix)
	r := takeReq{key: k, pause: p, lim: lim, argMin: l.arg(min), min: min, max: max}
	if min != max {
		r.argMin, r.argMax = strconv.Itoa(-min), l.arg(max)
	}
	return r
}

// AllowBatch decides reqs as AllowN would, one after another in order,
// on the caller's goroutine, as throttle.BatchLimiter says (errors
// included): in one script call per 256 requests on a *redis.Client (one
// call per hash slot on a *redis.ClusterClient, per key on a *redis.Ring
// or with WithOneKeyPerCall, and per run of a key whose quota changed
// within the batch), pipelined. Errors before any Redis call wrap
// throttle.ErrInvalidCost (a bad cost) or, with WithQuotas,
// throttle.ErrInvalidOption (a bad quota); Redis errors are wrapped as
// "bucket: redis: ...".
func (l *Redis) AllowBatch(ctx context.Context, reqs []throttle.Request) ([]throttle.Decision, error) {
	rs := make([]takeReq, 0, len(reqs))
	var held map[int]throttle.Decision // the requests of blocked keys, decided here
	for i, q := range reqs {
		lim, err := l.lims.of(q.Key)
		if d, ok := blocked.Decision(err, throttle.SourceLocal); ok {
			if held == nil {
				held = map[int]throttle.Decision{}
			}
			held[i] = d
			continue
		}
		if err == nil && (q.N < 1 || q.N > lim.p.burst) {
			err = throttle.CheckCost(q.N, lim.p.burst)
		}
		if err != nil {
			return nil, fmt.Errorf("reqs[%d]: %w", i, err)
		}
		rs = append(rs, l.takeReq(q.Key, lim, q.N, q.N))
	}
	ts, errs := l.batch.DoAll(ctx, rs)
	ds := make([]throttle.Decision, len(rs))
	for i, t := range ts {
		if errs == nil || errs[i] == nil {
			ds[i] = allowDecision(rs[i].lim, rs[i].min, t)
		}
	}
	if held != nil {
		ds, errs = blocked.Merge(held, ds, errs)
	}
	return ds, throttle.NewBatchError(errs)
}

// takeOne decides a lone request: one script call.
func (l *Redis) takeOne(ctx context.Context, r takeReq) (taken, error) {
	if err := l.ready(ctx); err != nil {
		return taken{}, err
	}
	args := append(takeScript.Start(make([]any, 0, 13)), argKeys2, r.key, r.pause, l.now(), argOne)
	args = append(args, r.lim.argPer, r.lim.argCount, r.lim.argCap, l.held.Arg(r.key), argOne)
	cmd := redis.NewIntSliceCmd(ctx, r.appendArgs(args)...)
	if err := takeScript.RunTimed(ctx, l.client, cmd, l.rt); err != nil {
		return taken{}, fmt.Errorf("bucket: redis: %w", redisopt.Explain("bucket", err))
	}
	var t [1]taken
	v := cmd.Val()
	if len(v) == 3 { // and now
		l.noteTaken(&r, v[:2], v[2])
		v = v[:2]
	}
	err := l.results(v, t[:], []takeReq{r})
	return t[0], err
}

// takeMany decides a batch: its requests grouped by key, in arrival order
// within each key, in one script call or one per key (see Redis.calls).
func (l *Redis) takeMany(ctx context.Context, calls []*takeCall) {
	if err := l.ready(ctx); err != nil {
		for _, c := range calls {
			c.Err = err
		}
		return
	}
	// A key under two quotas (one changed meanwhile) goes in a group per
	// quota, and then in calls of its own: each group is decided and
	// settled under its own quota.
	groups := coalesce.Group(calls, func(r takeReq) bucketID { return bucketID{r.key, r.lim.quota} }, takeKey)
	l.calls.Run(ctx, groups, coalesce.Distinct(groups, takeKey))
}

// bucketID is what the requests of one group share: the key, and its
// quota when the request was made.
type bucketID struct {
	key   string
	quota throttle.Quota
}

func takeKey(r takeReq) string { return r.key }

// groupKey returns the key a group's script call is routed by: its
// bucket's (its pause shares its slot).
func groupKey(g []*takeCall) string { return g[0].Req.key }

// appendArgs appends r's ARGV to args (see argMin).
func (r *takeReq) appendArgs(args []any) []any {
	if r.argMax == nil {
		return append(args, r.argMin)
	}
	return append(args, r.argMin, r.argMax)
}

// command builds bucket.lua's call for groups: the bucket of each key,
// then the pause of each, now, the quotas of the groups (each once), then
// each key's quota (when there are several), what is known of it (held)
// and its requests (a group's requests share their quota: see takeMany).
func (l *Redis) command(ctx context.Context, groups [][]*takeCall) *redis.IntSliceCmd {
	n := coalesce.Len(groups)
	args := takeScript.Start(make([]any, 0, 10+5*len(groups)+2*n))
	args = append(args, strconv.Itoa(2*len(groups)))
	for _, g := range groups {
		args = append(args, g[0].Req.key)
	}
	for _, g := range groups {
		args = append(args, g[0].Req.pause)
	}
	args = append(args, l.now())
	// The quotas, in order of first use; usually one.
	lims := make([]*keyLimits, 0, 1)
	var index []int // each group's place in lims, from 1; nil with one quota
	for i, g := range groups {
		lim := g[0].Req.lim
		q := slices.Index(lims, lim)
		if q < 0 {
			q = len(lims)
			lims = append(lims, lim)
		}
		if q > 0 && index == nil {
			index = make([]int, len(groups))
			for j := range i {
				index[j] = 1
			}
		}
		if index != nil {
			index[i] = q + 1
		}
	}
	if len(lims) == 1 && oneTokenEach(groups) {
		// The compact form (see bucket.lua): held alone for each bucket.
		lim := lims[0]
		args = append(args, argCompact, lim.argPer, lim.argCount, lim.argCap)
		for _, g := range groups {
			args = append(args, l.held.Arg(g[0].Req.key))
		}
		return redis.NewIntSliceCmd(ctx, args...)
	}
	args = append(args, l.arg(len(lims)))
	for _, lim := range lims {
		args = append(args, lim.argPer, lim.argCount, lim.argCap)
	}
	for i, g := range groups {
		if index != nil {
			args = append(args, l.arg(index[i]))
		}
		args = append(args, l.held.Arg(g[0].Req.key), l.arg(len(g)))
		for _, c := range g {
			args = c.Req.appendArgs(args)
		}
	}
	return redis.NewIntSliceCmd(ctx, args...)
}

// oneTokenEach reports whether each group is one request of one token
// (AllowN(1), the most flushes over many keys): bucket.lua's compact
// form, which sends one argument a bucket where the whole form sends
// three (each costs Redis about 1,000 instructions).
func oneTokenEach(groups [][]*takeCall) bool {
	for _, g := range groups {
		if len(g) != 1 || g[0].Req.min != 1 || g[0].Req.max != 1 {
			return false
		}
	}
	return true
}

// settle hands each call of groups its result from cmd's reply (two
// integers per request, group after group), or the call's error. It
// returns the groups whose bucket failed in a call of several (listed
// after the replies; see bucket.lua), which it leaves unsettled.
func (l *Redis) settle(groups [][]*takeCall, cmd *redis.IntSliceCmd, err error) (failed [][]*takeCall) {
	if err != nil {
		err = fmt.Errorf("bucket: redis: %w", redisopt.Explain("bucket", err))
	}
	v := cmd.Val()
	var skip map[int]bool
	now := int64(-1) // the script's instant, its last integer
	if n := 2 * coalesce.Len(groups); err == nil && len(v) > n {
		now = v[len(v)-1]
		if len(v) > n+1 {
			skip = make(map[int]bool, len(v)-n-1)
			for _, g := range v[n : len(v)-1] {
				skip[int(g)-1] = true
			}
		}
		v = v[:n]
	}
	for i, g := range groups {
		t := make([]taken, len(g))
		gerr := err
		if gerr == nil {
			reqs := make([]takeReq, len(g))
			for j, c := range g {
				reqs[j] = c.Req
				reqs[j].lim = g[0].Req.lim
			}
			k := min(2*len(g), len(v))
			if now >= 0 && !skip[i] {
				for j := range reqs {
					l.noteTaken(&reqs[j], v[2*j:k], now)
				}
			}
			gerr = l.results(v[:k], t, reqs)
			v = v[k:]
		}
		if skip[i] {
			failed = append(failed, g)
			continue
		}
		for j, c := range g {
			c.Res, c.Err = t[j], gerr
		}
	}
	return failed
}

// now is bucket.lua's ARGV[1]: the client's clock in µs, or "" for the
// server's TIME.
func (l *Redis) now() any {
	if l.clock == nil {
		return argTime
	}
	return strconv.FormatInt(l.clock.Now().UnixMicro(), 10)
}

// results checks and converts bucket.lua's reply, two integers per
// request, into t.
func (l *Redis) results(v []int64, t []taken, reqs []takeReq) error {
	if len(v) != 2*len(t) {
		return fmt.Errorf("%w: %d integers for %d requests", errReply, len(v), len(t))
	}
	for i, r := range reqs {
		granted, credit := v[2*i], v[2*i+1]
		var paused int64
		if granted < 0 { // paused: -granted is the µs left (bucket.lua)
			paused, granted = -granted, 0
		}
		if granted > int64(r.max) || (granted > 0 && granted < int64(r.min)) || credit < -r.lim.p.maxDebt || credit > r.lim.p.cap {
			return fmt.Errorf("%w: %v", errReply, v[2*i:2*i+2])
		}
		t[i] = taken{int(granted), credit, paused}
	}
	return nil
}

// noteTaken records what bucket.lua's reply v (granted, credit) to r, at
// its now, proves of r's bucket (see noteShort); a paused reply proves
// nothing.
func (l *Redis) noteTaken(r *takeReq, v []int64, now int64) {
	if len(v) >= 2 && v[0] >= 0 {
		l.noteShort(r.key, &r.lim.p, v[1], now)
	}
}

// noteShort records that the bucket at key held credit (under p) at now:
// short of full, its key exists until it is full again, at now + (cap -
// credit) / count, since no script ever shortens its life. See "Lost
// buckets" in the package documentation.
func (l *Redis) noteShort(key string, p *params, credit, now int64) {
	if short := p.cap - credit; short > 0 {
		l.held.Note(key, now+(short+p.count-1)/p.count, now)
	}
}

package bucket

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/coalesce"
	"github.com/queuethrottle/queuethrottle/internal/pause"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redisopt"
	"github.com/queuethrottle/queuethrottle/internal/redisscript"
)

// takeScript runs with EVALSHA, and is reloaded with EVAL on NOSCRIPT.
var takeScript = redisscript.New(convertLua + bucketLua)

// takeReq is one request of bucket.lua: take at least min tokens of key's
// bucket, at most max.
type takeReq struct {
	key            string     // the Redis key of the bucket's hash
	pause          string     // and of its pause (key + pause.Suffix, one allocation with key)
	lim            *keyLimits // the key's quota's (see WithQuotas)
	argMin, argMax any
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
	argTime  any = "" // now: the server's TIME

	pauseSuffix = []byte(pause.Suffix) // for rediskey.KeyAnd
)

// take takes tokens of key's bucket (see takeReq), coalesced with the
// calls of other goroutines: one script call per key for every request
// queued behind a flush in flight (package internal/coalesce).
func (l *Redis) take(ctx context.Context, key string, lim *keyLimits, min, max int) (int, int64, int64, error) {
	k, p := rediskey.KeyAnd(l.prefix, key, pauseSuffix)
	t, err := l.batch.Do(ctx, takeReq{key: k, pause: p, lim: lim, argMin: l.arg(min), argMax: l.arg(max), min: min, max: max})
	return t.granted, t.credit, t.paused, err
}

// takeOne decides a lone request: one script call.
func (l *Redis) takeOne(ctx context.Context, r takeReq) (taken, error) {
	if err := l.ready(ctx); err != nil {
		return taken{}, err
	}
	args := l.header(make([]any, 0, 11), r)
	cmd := redis.NewIntSliceCmd(ctx, append(args, r.argMin, r.argMax)...)
	if err := takeScript.Run(ctx, l.client, cmd); err != nil {
		return taken{}, fmt.Errorf("bucket: redis: %w", redisopt.Explain("bucket", err))
	}
	var t [1]taken
	err := l.results(cmd.Val(), t[:], []takeReq{r})
	return t[0], err
}

// takeMany decides a batch: one script call per key, carrying that key's
// requests in arrival order, pipelined when there are several.
func (l *Redis) takeMany(ctx context.Context, calls []*takeCall) {
	if err := l.ready(ctx); err != nil {
		for _, c := range calls {
			c.Err = err
		}
		return
	}
	groups := coalesce.Group(calls, func(r takeReq) string { return r.key })
	cmds := make([]*redis.IntSliceCmd, len(groups))
	for i, g := range groups {
		// A key's requests go under the first one's quota: they differ
		// only if the quota changed while they were queued.
		args := l.header(make([]any, 0, 9+2*len(g)), g[0].Req)
		for _, c := range g {
			args = append(args, c.Req.argMin, c.Req.argMax)
		}
		cmds[i] = redis.NewIntSliceCmd(ctx, args...)
	}
	errs := takeScript.RunAll(ctx, l.client, cmds)
	for i, g := range groups {
		err := errs[i]
		t := make([]taken, len(g))
		if err != nil {
			err = fmt.Errorf("bucket: redis: %w", redisopt.Explain("bucket", err))
		} else {
			reqs := make([]takeReq, len(g))
			for j, c := range g {
				reqs[j] = c.Req
				reqs[j].lim = g[0].Req.lim
			}
			err = l.results(cmds[i].Val(), t, reqs)
		}
		for j, c := range g {
			c.Res, c.Err = t[j], err
		}
	}
}

// header starts bucket.lua's EVALSHA for r's key under its quota: keys
// (the hash and its pause) and ARGV[1] to ARGV[4].
func (l *Redis) header(args []any, r takeReq) []any {
	args = append(takeScript.Start(args), argKeys2, r.key, r.pause, r.lim.argPer, r.lim.argCount, r.lim.argCap)
	if l.clock == nil {
		return append(args, argTime)
	}
	return append(args, strconv.FormatInt(l.clock.Now().UnixMicro(), 10))
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

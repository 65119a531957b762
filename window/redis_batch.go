package window

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/coalesce"
	"github.com/queuethrottle/queuethrottle/internal/redisopt"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// request is one decision of a Redis window, as window.lua takes it.
type request struct {
	key      string // the Redis key of the sorted set
	argWin   any    // window, µs, and limit: the key's quota, as strings
	argLimit any
	limit    int
	argN     any
	member   string // AllowN: a fresh member; AllowID: the id
	horizon  any    // argAllowN, argPeek or AllowID's horizon in µs
}

type call = coalesce.Call[request, throttle.Decision]

// maxBatch bounds the requests of one flush: with the largest cost
// (MaxCost) a script call still ends within a few milliseconds.
const maxBatch = 256

var (
	argEvalSha any = "evalsha"
	argEval    any = "eval"
	argSha     any = windowScript.Hash()
	argSrc     any = windowLua
	argKeys1   any = "1"
	argKeys2   any = "2"
	argTime    any = "" // now: the server's TIME
	argExact   any = "0"
)

// one decides a lone request: one script call.
func (l *Redis) one(ctx context.Context, r request) (throttle.Decision, error) {
	if err := l.ready(ctx); err != nil {
		return throttle.Decision{}, err
	}
	args := l.header(make([]any, 0, 12), r)
	args = append(args, r.argN, r.member, r.horizon)
	cmd := redis.NewIntSliceCmd(ctx, args...)
	if err := l.run(ctx, cmd); err != nil {
		return throttle.Decision{}, fmt.Errorf("window: redis: %w", redisopt.Explain("window", err))
	}
	var d [1]throttle.Decision
	err := decisions(cmd.Val(), d[:], r.limit)
	return d[0], err
}

// many decides a batch: one script call per key (and quota), carrying
// that key's requests in arrival order, pipelined when there are several.
func (l *Redis) many(ctx context.Context, calls []*call) {
	if err := l.ready(ctx); err != nil {
		for _, c := range calls {
			c.Err = err
		}
		return
	}
	groups := group(calls)
	cmds := make([]*redis.IntSliceCmd, len(groups))
	for i, g := range groups {
		args := l.header(make([]any, 0, 7+3*len(g)), g[0].Req)
		for _, c := range g {
			args = append(args, c.Req.argN, c.Req.member, c.Req.horizon)
		}
		cmds[i] = redis.NewIntSliceCmd(ctx, args...)
	}
	errs := l.runAll(ctx, cmds)
	for i, g := range groups {
		err := errs[i]
		d := make([]throttle.Decision, len(g))
		if err != nil {
			err = fmt.Errorf("window: redis: %w", redisopt.Explain("window", err))
		} else {
			err = decisions(cmds[i].Val(), d, g[0].Req.limit)
		}
		for j, c := range g {
			c.Res, c.Err = d[j], err
		}
	}
}

// group splits calls by key and quota, keeping arrival order within each.
func group(calls []*call) [][]*call {
	if len(calls) == 1 {
		return [][]*call{calls}
	}
	type id struct {
		key        string
		win, limit any
	}
	index := make(map[id]int, len(calls))
	var groups [][]*call
	for _, c := range calls {
		k := id{c.Req.key, c.Req.argWin, c.Req.argLimit}
		i, ok := index[k]
		if !ok {
			i = len(groups)
			index[k] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], c)
	}
	return groups
}

func (l *Redis) ready(ctx context.Context) error {
	if l.server == nil {
		return nil
	}
	if err := l.server.Ready(ctx); err != nil {
		return fmt.Errorf("window: redis: %w", err)
	}
	return nil
}

// header starts the EVALSHA of r's key: the script, its keys and ARGV[1]
// to ARGV[4] (window, limit, now, whether the reading was inexact).
func (l *Redis) header(args []any, r request) []any {
	args = append(args, argEvalSha, argSha)
	if l.clock == nil {
		return append(args, argKeys1, r.key, r.argWin, r.argLimit, argTime, argExact)
	}
	now, slack := instant(l.clock.Now(), 0)
	inexact := argExact
	if slack != 0 {
		inexact = argOne
	}
	return append(args, argKeys2, r.key, r.key+floorSuffix, r.argWin, r.argLimit, strconv.FormatInt(now, 10), inexact)
}

// processor is what a client needs for typed replies (a *redis.Client,
// *redis.ClusterClient, *redis.Ring or go-redis's AutoPipeliner).
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// pipeliner is what a client needs to send several script calls at once.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// run sends cmd (an EVALSHA), and again as an EVAL if the server does not
// have the script (NOSCRIPT: the script cache was flushed or the server
// restarted), which also loads it.
func (l *Redis) run(ctx context.Context, cmd *redis.IntSliceCmd) error {
	err := l.process(ctx, cmd)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		asEval(cmd)
		err = l.process(ctx, cmd)
	}
	return err
}

func (l *Redis) process(ctx context.Context, cmd *redis.IntSliceCmd) error {
	if p, ok := l.client.(processor); ok {
		return p.Process(ctx, cmd)
	}
	// Any other redis.Scripter: the generic reply, converted.
	args := cmd.Args()
	keys := make([]string, 0, 2)
	nkeys, _ := strconv.Atoi(args[2].(string))
	for _, k := range args[3 : 3+nkeys] {
		keys = append(keys, k.(string))
	}
	var res *redis.Cmd
	if args[0] == argEval {
		res = l.client.Eval(ctx, windowLua, keys, args[3+nkeys:]...)
	} else {
		res = l.client.EvalSha(ctx, windowScript.Hash(), keys, args[3+nkeys:]...)
	}
	vals, err := res.Int64Slice()
	cmd.SetVal(vals)
	cmd.SetErr(err)
	return err
}

// runAll sends cmds in one pipeline where the client has one (else one
// after another) and returns the error of each, after re-sending those
// that met NOSCRIPT as EVALs.
func (l *Redis) runAll(ctx context.Context, cmds []*redis.IntSliceCmd) []error {
	errs := make([]error, len(cmds))
	p, ok := l.client.(pipeliner)
	if len(cmds) == 1 || !ok {
		for i, c := range cmds {
			errs[i] = l.run(ctx, c)
		}
		return errs
	}
	pipelined := func(cmds []*redis.IntSliceCmd) {
		pipe := p.Pipeline()
		for _, c := range cmds {
			_ = pipe.Process(ctx, c)
		}
		_, _ = pipe.Exec(ctx) // each command carries its own error
	}
	pipelined(cmds)
	var again []*redis.IntSliceCmd
	for _, c := range cmds {
		if err := c.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			asEval(c)
			again = append(again, c)
		}
	}
	if again != nil {
		pipelined(again)
	}
	for i, c := range cmds {
		errs[i] = c.Err()
	}
	return errs
}

// asEval turns cmd, an EVALSHA that failed, into an EVAL of the script's
// source, to be sent again.
func asEval(cmd *redis.IntSliceCmd) {
	args := cmd.Args()
	args[0], args[1] = argEval, argSrc
	cmd.SetErr(nil)
}

// decisions converts the script's reply, five integers per request
// ({allowed, remaining, retry µs, reset µs, reserved}), into d.
func decisions(v []int64, d []throttle.Decision, limit int) error {
	if len(v) != 5*len(d) {
		return fmt.Errorf("%w: %d integers for %d requests", errReply, len(v), len(d))
	}
	for i := range d {
		r := v[5*i : 5*i+5]
		d[i] = throttle.Decision{
			Allowed:    r[0] == 1,
			Limit:      limit,
			Remaining:  int(max(r[1], 0)),
			ResetAfter: micros(max(r[3], 0)),
			Source:     throttle.SourceRedis,
		}
		if !d[i].Allowed {
			// > 0 by construction (the slot is after now); kept > 0
			// whatever the store says, as the Decision contract asks.
			d[i].RetryAfter = max(micros(r[2]), time.Millisecond)
			d[i].Reserved = r[4] == 1
		}
	}
	return nil
}

package window

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/coalesce"
	"github.com/queuethrottle/queuethrottle/internal/redisopt"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// request is one decision of a Redis window, as window.lua takes it.
type request struct {
	key      string // the Redis key of the sorted set
	pause    string // and of its pause
	hint     string // and of its hint (see window.lua)
	newest   string // and of its newest reservation (see window.lua)
	argWin   any    // window, µs, and limit: the key's quota, as strings
	argLimit any
	limit    int
	argN     any
	member   string // AllowN: a fresh member; AllowID: the id
	horizon  any    // argAllowN, argPeek or AllowID's horizon in µs
}

type call = coalesce.Call[request, throttle.Decision]

// errLate is the error of decisions whose script ran after their caller's
// deadline (plus lateSlack) and so applied nothing.
var errLate = errors.New("window: redis: the script ran after its caller's deadline and applied nothing (Redis was stalled, or its clock is ahead of this machine's by more than 1s)")

// groupID is what the requests of one script call share: the key, and
// its quota when the request was made.
type groupID struct {
	key        string
	win, limit any
}

// maxBatch bounds the requests of one flush: with the largest cost
// (MaxCost) a script call still ends within a few milliseconds.
const maxBatch = 256

var (
	argKeys4 any = "4"
	argKeys5 any = "5"
	argTime  any = "" // now: the server's TIME
	argExact any = "0"
)

// argsPool holds the argument slices of lone calls (one allocation less
// per decision).
var argsPool = sync.Pool{New: func() any { s := make([]any, 0, 16); return &s }}

// one decides a lone request: one script call.
func (l *Redis) one(ctx context.Context, r request) (throttle.Decision, error) {
	if err := l.ready(ctx); err != nil {
		return throttle.Decision{}, err
	}
	buf := argsPool.Get().(*[]any)
	args := l.header(ctx, (*buf)[:0], r)
	args = append(args, r.argN, r.member, r.horizon)
	defer func() { // the command is done with its arguments
		clear(args)
		*buf = args[:0]
		argsPool.Put(buf)
	}()
	cmd := redis.NewIntSliceCmd(ctx, args...)
	if err := windowScript.Run(ctx, l.client, cmd); err != nil {
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
	groups := coalesce.Group(calls, func(r request) groupID { return groupID{r.key, r.argWin, r.argLimit} })
	cmds := make([]*redis.IntSliceCmd, len(groups))
	for i, g := range groups {
		args := l.header(ctx, make([]any, 0, 10+3*len(g)), g[0].Req)
		for _, c := range g {
			args = append(args, c.Req.argN, c.Req.member, c.Req.horizon)
		}
		cmds[i] = redis.NewIntSliceCmd(ctx, args...)
	}
	errs := windowScript.RunAll(ctx, l.client, cmds)
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

func (l *Redis) ready(ctx context.Context) error {
	if l.server == nil {
		return nil
	}
	if err := l.server.Ready(ctx); err != nil {
		return fmt.Errorf("window: redis: %w", err)
	}
	return nil
}

// header starts the EVALSHA of r's key: the script, the keys (the sorted
// set, its hint, its pause, its newest reservation and, with a client
// clock, its floor) and ARGV[1]
// to ARGV[5] (window, limit, now, whether the reading was inexact, and
// the instant after which the script must apply nothing).
func (l *Redis) header(ctx context.Context, args []any, r request) []any {
	args = windowScript.Start(args)
	if l.clock == nil {
		return append(args, argKeys4, r.key, r.hint, r.pause, r.newest, r.argWin, r.argLimit, argTime, argExact, l.expiry(ctx))
	}
	now, slack := instant(l.clock.Now(), 0)
	inexact := argExact
	if slack != 0 {
		inexact = argOne
	}
	// A client clock: the script does not read TIME, so it cannot tell
	// that it runs late.
	return append(args, argKeys5, r.key, r.hint, r.pause, r.newest, r.key+floorSuffix, r.argWin, r.argLimit, strconv.FormatInt(now, 10), inexact, argNoExpiry)
}

// lateSlack is how late, after its caller's deadline, a script may still
// apply its decisions: it covers the difference between this machine's
// clock and the Redis server's.
const lateSlack = time.Second

var argNoExpiry any = ""

// expiry returns ARGV[5]: ctx's deadline plus lateSlack, in µs since the
// Unix epoch, so that a script that runs only after its caller gave up
// (Redis was stalled: paused, swapping, blocked by a slow command) applies
// nothing, rather than count an admission nobody knows of. The boxed
// string is kept for the next call with the same deadline (the calls that
// share one deadline context).
func (l *Redis) expiry(ctx context.Context) any {
	dl, ok := ctx.Deadline()
	if !ok {
		return argNoExpiry
	}
	if e := l.lastExpiry.Load(); e != nil && e.at.Equal(dl) {
		return e.arg
	}
	e := &expiryArg{at: dl, arg: strconv.FormatInt(dl.Add(lateSlack).UnixMicro(), 10)}
	l.lastExpiry.Store(e)
	return e.arg
}

type expiryArg struct {
	at  time.Time
	arg any
}

// decisions converts the script's reply, five integers per request
// ({allowed, remaining, retry µs, reset µs, reserved}), into d.
func decisions(v []int64, d []throttle.Decision, limit int) error {
	if len(v) == 1 && v[0] == -1 {
		return errLate
	}
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

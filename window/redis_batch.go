package window

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/blocked"
	"github.com/queuethrottle/queuethrottle/internal/coalesce"
	"github.com/queuethrottle/queuethrottle/internal/redisopt"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// request is one decision of a Redis window, as window.lua takes it.
type request struct {
	key      string // the Redis key of the sorted set
	pause    string // and of its pause
	hint     string // and of its schedule (see window.lua)
	argWin   any    // window, µs, and limit: the key's quota, as strings
	argLimit any
	win      int64 // and as numbers
	limit    int
	argN     any
	n        int
	member   string // AllowN: a fresh member; AllowID: the id
	horizon  any    // argAllowN, argPeek or AllowID's horizon in µs
}

type call = coalesce.Call[request, throttle.Decision]

// errLate is the error of decisions whose script ran after their caller's
// deadline less its grace (see deadline.RoundTrip.Expiry) and so applied
// nothing. It matches context.DeadlineExceeded: the call came too late.
var errLate = fmt.Errorf("window: redis: the script ran after its caller's deadline and applied nothing (Redis was slow or stalled): %w", context.DeadlineExceeded)

// groupID is what the requests of one script call share: the key, and
// its quota when the request was made.
type groupID struct {
	key        string
	win, limit any
}

// maxBatch bounds the requests of one flush, and maxUnits their units
// (sorted-set members to write): one AllowN of MaxCost took 23 ms, so a
// flush of cost beyond MaxCost would outlast the default timeout.
const (
	maxBatch = 256
	maxUnits = MaxCost
)

var (
	argNumKeys     = [...]any{3: "3", 4: "4"} // numkeys of a lone call, boxed once
	argTime    any = ""                       // now: the server's TIME
	argExact   any = "0"
	// ARGV[2] with WithSpacedReservations: exact, or not (see clockArgs).
	argExactSpaced   any = "0s"
	argInexactSpaced any = "1s"
	argCompact       any = "p" // ARGV[2] of the compact forms (see compactForm)
	argGrouped       any = "q"
)

// argCounts holds the counts of keys and requests up to maxBatch (a
// flush's most), boxed once (see argCount).
var argCounts = func() (a [maxBatch + 1]any) {
	for i := range a {
		a[i] = strconv.Itoa(i)
	}
	return a
}()

// argCount returns n as a script argument (a count of keys or requests).
func argCount(n int) any {
	if n < len(argCounts) {
		return argCounts[n]
	}
	return strconv.Itoa(n)
}

// argsPool holds the argument slices of script calls (one allocation less
// per decision).
var argsPool = sync.Pool{New: func() any { s := make([]any, 0, 16); return &s }}

// putArgs clears args, the arguments of a script call that is done, and
// keeps them in argsPool in buf.
func putArgs(buf *[]any, args []any) {
	clear(args)
	*buf = args[:0]
	argsPool.Put(buf)
}

// one decides a lone request: one script call.
func (l *Redis) one(ctx context.Context, r request) (throttle.Decision, error) {
	if err := l.ready(ctx); err != nil {
		return throttle.Decision{}, err
	}
	buf := argsPool.Get().(*[]any)
	args := l.calls.Script.Start((*buf)[:0])
	args = l.keys(append(args, argNumKeys[l.keysPerWindow()]), r)
	if l.clock == nil && r.n == 1 && r.horizon == argAllowN && !l.wholeArgs {
		// The short form of a lone AllowN (see window_head.lua).
		args = append(args, l.expiry(ctx), r.argWin, r.argLimit, l.held.Arg(r.key), r.member)
	} else {
		args = append(l.clockArgs(ctx, args), r.argWin, r.argLimit, l.held.Arg(r.key), argOne, r.argN, r.member, r.horizon)
	}
	defer putArgs(buf, args) // the command is done with its arguments
	cmd := redis.NewIntSliceCmd(ctx, args...)
	if err := l.calls.Script.RunTimed(ctx, l.client, cmd, l.rt); err != nil {
		return throttle.Decision{}, fmt.Errorf("window: redis: %w", redisopt.Explain("window", err))
	}
	var d [1]throttle.Decision
	v := cmd.Val()
	if len(v) == 2 && v[0] > 0 { // the short form's admission: {code, now} (see window_head.lua)
		whole := [replyInts + 1]int64{v[0], 0, r.win, v[1]}
		v = whole[:]
	}
	if len(v) == replyInts+1 { // and now
		l.noteReply(&r, v, v[replyInts])
		v = v[:replyInts]
	}
	err := decisions(v, d[:], r.limit)
	return d[0], l.rt.Explain(err)
}

// AllowBatch decides reqs as AllowN would, one after another in order,
// on the caller's goroutine, as throttle.BatchLimiter says (errors
// included): in one script call per 256 requests and MaxCost units on a
// *redis.Client (one call per hash slot on a *redis.ClusterClient, per key
// on a *redis.Ring or with WithOneKeyPerCall, and per run of a key whose
// quota changed within the batch), pipelined. Errors before any Redis call
// wrap throttle.ErrInvalidCost (a bad cost) or, with WithQuotas,
// throttle.ErrInvalidOption (a bad quota); Redis errors are wrapped as
// "window: redis: ...".
func (l *Redis) AllowBatch(ctx context.Context, reqs []throttle.Request) ([]throttle.Decision, error) {
	rs := make([]request, 0, len(reqs))
	var held map[int]throttle.Decision // the requests of blocked keys, decided here
	for i, q := range reqs {
		r, err := l.request(q.Key, q.N, "", argAllowN)
		if d, ok := blocked.Decision(err, throttle.SourceLocal); ok {
			if held == nil {
				held = map[int]throttle.Decision{}
			}
			held[i] = d
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reqs[%d]: %w", i, err)
		}
		rs = append(rs, r)
	}
	ds, errs := l.batch.DoAll(ctx, rs)
	if held != nil {
		ds, errs = blocked.Merge(held, ds, errs)
	}
	return ds, throttle.NewBatchError(errs)
}

// many decides a batch: its requests grouped by key (and quota), in
// arrival order within each key, in one script call or one per key (see
// Redis.calls).
func (l *Redis) many(ctx context.Context, calls []*call) {
	if err := l.ready(ctx); err != nil {
		for _, c := range calls {
			c.Err = err
		}
		return
	}
	groups := coalesce.Group(calls, func(r request) groupID { return groupID{r.key, r.argWin, r.argLimit} }, requestKey)
	// A key twice (its quota changed while queued) goes in calls of its
	// own: the script reads each key's schedule once, at its start.
	l.calls.Run(ctx, groups, coalesce.Distinct(groups, requestKey))
}

func requestKey(r request) string { return r.key }

// groupKey returns the key a group's script call is routed by: its sorted
// set's, the first of its KEYS (every key of a group shares its slot).
func groupKey(g []*call) string { return g[0].Req.key }

// command builds the script call of groups: the keys of each, the
// clock's arguments, then each key's window, limit and requests.
func (l *Redis) command(ctx context.Context, groups [][]*call) *redis.IntSliceCmd {
	n := coalesce.Len(groups)
	per := l.keysPerWindow()
	buf := argsPool.Get().(*[]any) // back in the pool once settled (see settle)
	args := l.calls.Script.Start(slices.Grow((*buf)[:0], 6+(per+4)*len(groups)+3*n))
	args = append(args, argCount(per*len(groups)))
	for _, g := range groups {
		args = l.keys(args, g[0].Req)
	}
	if form := l.compactForm(groups); form != nil {
		r := groups[0][0].Req
		args = append(args, argTime, form, l.expiry(ctx), r.argWin, r.argLimit)
		for _, g := range groups {
			args = append(args, l.held.Arg(g[0].Req.key))
			if form == argGrouped {
				args = append(args, argCount(len(g)))
			}
			for _, c := range g {
				args = append(args, c.Req.member)
			}
		}
		return redis.NewIntSliceCmd(ctx, args...)
	}
	args = l.clockArgs(ctx, args)
	for _, g := range groups {
		args = append(args, g[0].Req.argWin, g[0].Req.argLimit, l.held.Arg(g[0].Req.key), argCount(len(g)))
		for _, c := range g {
			args = append(args, c.Req.argN, c.Req.member, c.Req.horizon)
		}
	}
	return redis.NewIntSliceCmd(ctx, args...)
}

// compactForm returns ARGV[2] of the compact form groups go in, or nil
// for the whole form: with the server's clock, no spaced reservations,
// and only AllowN requests of one unit under the same window and limit
// (the most flushes), the window and limit are sent once, and each key's
// held and members only. argCompact when each key has one request (two
// arguments a key where the whole form takes seven; each costs Redis
// about 1,000 instructions, a fifth of a ZCOUNT), argGrouped when a key
// has several (2 + m arguments where the whole form takes 4 + 3m: a hot
// key's flush). Both are answered compactly (see plain.lua).
func (l *Redis) compactForm(groups [][]*call) any {
	if l.clock != nil || l.spaced || l.wholeArgs {
		return nil
	}
	form, first := argCompact, groups[0][0].Req
	for _, g := range groups {
		if len(g) > 1 {
			form = argGrouped
		}
		for _, c := range g {
			r := c.Req
			if r.n != 1 || r.horizon != argAllowN || r.argWin != first.argWin || r.argLimit != first.argLimit {
				return nil
			}
		}
	}
	return form
}

// settle hands each call of groups its decision from cmd's reply (three
// integers per request, group after group; in a compact form, one for
// each of the leading groups the script admitted whole: see plain.lua),
// or the call's error. It
// returns the groups whose key failed in a call of several keys (listed
// after the replies; see window.lua), which it leaves unsettled.
func (l *Redis) settle(groups [][]*call, cmd *redis.IntSliceCmd, err error) (failed [][]*call) {
	args := cmd.Args() // from argsPool (see command)
	defer putArgs(&args, args)
	v := cmd.Val()
	if err != nil {
		err = fmt.Errorf("window: redis: %w", redisopt.Explain("window", err))
	} else if late(v) {
		err = l.rt.Explain(errLate)
	}
	// The leading groups a compact form's reply answers with one integer
	// each (see plain.lua): the reply's first integer.
	compact := 0
	if err == nil && l.compactForm(groups) != nil {
		if len(v) == 0 || v[0] < 0 || v[0] > int64(min(len(groups), len(v)-1)) {
			err = fmt.Errorf("%w: %v for %d keys in the compact form", errReply, v, len(groups))
		} else {
			compact, v = int(v[0]), v[1:]
		}
	}
	var skip map[int]bool
	now := int64(-1) // the script's instant, its last integer
	if n := compact + replyInts*coalesce.Len(groups[compact:]); err == nil && len(v) > n {
		now = v[len(v)-1]
		if len(v) > n+1 {
			skip = make(map[int]bool, len(v)-n-1)
			for _, g := range v[n : len(v)-1] {
				skip[int(g)-1] = true
			}
		}
		v = v[:n]
	}
	var buf [16]throttle.Decision // most groups: no allocation
	for i, g := range groups {
		if i < compact {
			l.settlePlain(g, v[0], now)
			v = v[1:]
			continue
		}
		d := buf[:0]
		if len(g) > len(buf) {
			d = make([]throttle.Decision, len(g))
		}
		d = d[:len(g)]
		gerr := err
		if gerr == nil {
			k := min(replyInts*len(g), len(v))
			if now >= 0 && !skip[i] {
				for j, c := range g {
					l.noteReply(&c.Req, v[j*replyInts:k], now)
				}
			}
			gerr = decisions(v[:k], d, g[0].Req.limit)
			v = v[k:]
		}
		if skip[i] {
			failed = append(failed, g)
			continue
		}
		for j, c := range g {
			c.Res, c.Err = d[j], gerr
		}
	}
	return failed
}

// settlePlain settles the requests of a key answered in a compact reply:
// each admitted now, the first with code, the j-th with code - j (see
// plain.lua), and the window as its reset.
func (l *Redis) settlePlain(g []*call, code, now int64) {
	for j, c := range g {
		v := [replyInts]int64{code - int64(j), 0, c.Req.win}
		var d [1]throttle.Decision
		if v[0] < 1 {
			c.Err = fmt.Errorf("%w: code %d for the %d requests of a plain key", errReply, code, len(g))
			continue
		}
		if now >= 0 {
			l.noteReply(&c.Req, v[:], now)
		}
		c.Err = decisions(v[:], d[:], c.Req.limit)
		c.Res = d[0]
	}
}

// keysPerWindow is how many KEYS window.lua takes per window key: its
// sorted set, schedule and pause, and with a client clock its floor.
func (l *Redis) keysPerWindow() int {
	if l.clock == nil {
		return 3
	}
	return 4
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

// keys appends r's keys for window.lua: its sorted set, schedule, pause
// and, with a client clock, its floor.
func (l *Redis) keys(args []any, r request) []any {
	args = append(args, r.key, r.hint, r.pause)
	if l.clock != nil {
		args = append(args, r.key+floorSuffix)
	}
	return args
}

// clockArgs appends window.lua's ARGV[1] to ARGV[3]: now ("" for the
// server's TIME), whether the reading was inexact (with an "s" after it
// for WithSpacedReservations), and the instant after which the script
// must apply nothing.
func (l *Redis) clockArgs(ctx context.Context, args []any) []any {
	exact, inexact := argExact, argOne
	if l.spaced {
		exact, inexact = argExactSpaced, argInexactSpaced
	}
	if l.clock == nil {
		return append(args, argTime, exact, l.expiry(ctx))
	}
	now, slack := instant(l.clock.Now(), 0)
	if slack == 0 {
		inexact = exact
	}
	// A client clock: the script does not read TIME, so it cannot tell
	// that it runs late.
	return append(args, strconv.FormatInt(now, 10), inexact, argNoExpiry)
}

var argNoExpiry any = ""

// expiry returns ARGV[3]: the instant after which the script applies
// nothing (see deadline.RoundTrip.Expiry: about the call's deadline less
// one round trip, in the server's clock), so that a script that runs only
// after its caller gave up (Redis was slow or stalled: far away, paused,
// swapping, blocked by a slow command) applies nothing, rather than count
// an admission nobody knows of. The boxed string is kept for the next
// call with the same deadline (the calls that share one deadline
// context).
func (l *Redis) expiry(ctx context.Context) any {
	dl, ok := ctx.Deadline()
	if !ok {
		return argNoExpiry
	}
	if e := l.lastExpiry.Load(); e != nil && e.at.Equal(dl) {
		return e.arg
	}
	e := &expiryArg{at: dl, arg: strconv.FormatInt(l.rt.Expiry(dl), 10)}
	l.lastExpiry.Store(e)
	return e.arg
}

type expiryArg struct {
	at  time.Time
	arg any
}

// late reports whether v is the reply of a script that ran after its
// expiry and applied nothing: {-1, now} (every other reply has at least
// replyInts+1 integers).
func late(v []int64) bool { return len(v) == 2 && v[0] == -1 }

// replyInts is the number of integers window.lua (and joint.lua) reply
// per request: {code, retry µs, reset µs}; code = remaining + 1 when
// admitted, -(remaining + 1) when rejected; retry negated when reserved,
// and -1 when admitted on an id admitted before (AlreadyAdmitted).
const replyInts = 3

// decisions converts the script's reply, replyInts integers per request,
// into d.
func decisions(v []int64, d []throttle.Decision, limit int) error {
	if late(v) {
		return errLate
	}
	if len(v) != replyInts*len(d) {
		return fmt.Errorf("%w: %d integers for %d requests", errReply, len(v), len(d))
	}
	for i := range d {
		code, retry, reset := v[replyInts*i], v[replyInts*i+1], v[replyInts*i+2]
		d[i] = throttle.Decision{
			Allowed:    code > 0,
			Limit:      limit,
			Remaining:  int(max(code, -code, 1) - 1),
			ResetAfter: micros(max(reset, 0)),
			Source:     throttle.SourceRedis,
		}
		if d[i].Allowed {
			d[i].AlreadyAdmitted = retry < 0
		} else {
			// > 0 by construction (the slot is after now); kept > 0
			// whatever the store says, as the Decision contract asks.
			d[i].Reserved = retry < 0
			d[i].RetryAfter = max(micros(max(retry, -retry)), time.Millisecond)
		}
	}
	return nil
}

package redisscript

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Warm opens up to conns connections of c (at most its pool's size),
// holding them all at once, loads s on each (SCRIPT LOAD) and leaves them idle in c's pool,
// so that a limiter's first calls, up to conns in flight at once, find an
// open connection and the script loaded. A connection opened inside a
// call spends the call's timeout on TCP and go-redis's handshake (a round
// trip more): in a burst of goroutines on a starved CPU each step waits
// for the caller to run again, and the call fails, sometimes the calls
// after it too (each dials again).
//
// It waits at most bound and reports nothing: a failure leaves the
// connections to be opened by the calls, as without it. It does nothing
// for a c other than a *redis.Client (a cluster client holds a pool per
// node, opened as its keys are used) and for a pool that already has
// conns idle connections. The connections live as long as c's pool keeps
// idle ones (see redis.Options.ConnMaxIdleTime, and MinIdleConns to keep
// some open).
func (s *Script) Warm(c redis.Scripter, conns int, bound time.Duration) {
	rc, ok := c.(*redis.Client)
	if !ok {
		return
	}
	o := rc.Options()
	conns = min(conns, o.PoolSize)
	if o.MaxActiveConns > 0 {
		conns = min(conns, o.MaxActiveConns)
	}
	if st := rc.PoolStats(); int(st.IdleConns) >= conns {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	// Each connection is held until every one is open: released at once,
	// it would serve the next load instead of another being opened. One
	// after another: go-redis v9.23 races on its options when the first
	// connections of a client hand-shake at once (with a server that
	// refuses its maintenance notifications).
	held := make([]*redis.Conn, 0, conns)
	for range conns {
		cn := rc.Conn()
		held = append(held, cn)
		if cn.ScriptLoad(ctx, s.src).Err() != nil {
			break
		}
		s.loaded.Store(true)
	}
	for _, cn := range held {
		_ = cn.Close() // back to the pool, unless it failed
	}
}

package window

import (
	"context"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redisscript"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestRollingUpgradeF017374 runs the script of commit f017374
// (testdata/window_f017374.lua, before plain keys had a path of their
// own) and today's on the same keys, one call each in turn, as processes
// of both versions would during a rolling upgrade, and checks that they
// decide every call as today's script alone does on keys of its own, and
// that it decides as f017374's alone:
// AllowN of one and two units, alone and coalesced (with another key, and
// with a second request of the same key: today's compact forms "p" and
// "q"), and AllowID with
// reservations (the slots lie a minute ahead, so the outcomes do not
// depend on when the calls run).
func TestRollingUpgradeF017374(t *testing.T) {
	client := redistest.Shared(t).Client(t)
	ctx := context.Background()
	rate := throttle.Rate{Count: 10, Per: time.Minute}
	mixed, alone := freshPrefix(), freshPrefix()
	limiter := func(prefix string, script *redisscript.Script) *Redis {
		l, err := NewRedis(client, rate, WithPrefix(prefix), WithTimeout(redistest.CallTimeout))
		if err != nil {
			t.Fatal(err)
		}
		if script != nil {
			l.calls.Script, l.wholeArgs = script, true
		}
		return l
	}
	script := redisscript.New(windowF017374Lua)
	old, cur, ref := limiter(mixed, script), limiter(mixed, nil), limiter(alone, nil)
	oldRef := limiter(freshPrefix(), script) // f017374's alone, as ref
	type step struct {
		n  int
		id string // "": AllowN
	}
	steps := []step{{1, ""}, {2, ""}, {1, "a"}, {1, ""}, {2, "b"}, {1, ""}, {1, ""}, {1, "c"}, {1, ""}, {2, ""}, {1, "d"}, {1, ""}, {1, "a"}, {1, ""}, {2, "e"}, {1, ""}}
	decide := func(l *Redis, key string, s step) throttle.Decision {
		var d throttle.Decision
		var err error
		if s.id == "" {
			d, err = l.AllowN(ctx, key, s.n)
		} else {
			d, err = l.AllowID(ctx, key, s.n, s.id, 5*time.Minute)
		}
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	rejected, reserved := 0, 0
	for round, key := range []string{"lone", "batch", "hot"} {
		for i, s := range steps {
			l := cur
			if (i+round)%2 == 0 {
				l = old
			}
			var got, want throttle.Decision
			if key == "lone" {
				got, want = decide(l, key, s), decide(ref, key, s)
				if was := decide(oldRef, key, s); !decidesAlike(was, want) {
					t.Errorf("%s step %d: today's script alone %+v, f017374's alone %+v", key, i, want, was)
				}
			} else {
				// Requests coalesced in one call: AllowBatch.
				reqs := []throttle.Request{{Key: key, N: 1}, {Key: key + "-other", N: s.n}}
				if key == "hot" {
					reqs = []throttle.Request{{Key: key, N: 1}, {Key: key + "-other", N: s.n}, {Key: key, N: 1}}
				}
				g, err := l.AllowBatch(ctx, reqs)
				if err != nil {
					t.Fatal(err)
				}
				w, err := ref.AllowBatch(ctx, reqs)
				if err != nil {
					t.Fatal(err)
				}
				was, err := oldRef.AllowBatch(ctx, reqs)
				if err != nil {
					t.Fatal(err)
				}
				for j := range w {
					if !decidesAlike(was[j], w[j]) {
						t.Errorf("%s step %d, request %d: today's script alone %+v, f017374's alone %+v", key, i, j, w[j], was[j])
					}
				}
				for _, j := range []int{0, len(g) - 1} { // key's
					if g[j].Allowed != w[j].Allowed || g[j].Remaining != w[j].Remaining {
						t.Errorf("%s step %d, request %d: got allowed %v remaining %d, want %v %d", key, i, j, g[j].Allowed, g[j].Remaining, w[j].Allowed, w[j].Remaining)
					}
				}
				got, want = g[1], w[1]
			}
			if !decidesAlike(got, want) {
				t.Errorf("%s step %d (n=%d id=%q, %s): got %+v, want %+v", key, i, s.n, s.id, scriptName(l == old), got, want)
			}
			if !got.Allowed {
				rejected++
			}
			if got.Reserved {
				reserved++
			}
			if !got.Allowed && (got.RetryAfter <= 0 || got.RetryAfter > 3*rate.Per) {
				t.Errorf("%s step %d: retry after %v", key, i, got.RetryAfter)
			}
		}
	}
	if rejected == 0 || reserved == 0 {
		t.Errorf("%d rejections and %d reservations: the steps should make both", rejected, reserved)
	}
}

// decidesAlike reports whether a and b decide alike: the same outcome,
// and retry-afters within a second (the calls run milliseconds apart,
// the slots lie a minute ahead).
func decidesAlike(a, b throttle.Decision) bool {
	return a.Allowed == b.Allowed && a.Remaining == b.Remaining && a.Reserved == b.Reserved && a.AlreadyAdmitted == b.AlreadyAdmitted &&
		(a.RetryAfter-b.RetryAfter).Abs() <= time.Second
}

func scriptName(old bool) string {
	if old {
		return "f017374's script"
	}
	return "today's script"
}

// Package redisopt holds the rules every Redis limiter of this module
// applies to the go-redis client it is given, and the hints it adds to the
// Redis errors whose cause is a setting rather than an outage.
package redisopt

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// CheckContextTimeout returns an error wrapping throttle.ErrInvalidOption
// (Field "client") for a *redis.Client, *redis.ClusterClient or
// *redis.Ring created without ContextTimeoutEnabled whose ReadTimeout or
// WriteTimeout is not in (0, timeout]: go-redis would ignore the context
// deadline that bounds each call by timeout (the limiter's WithTimeout),
// and a hung Redis would hold every decision for the client's own
// timeouts (5 s by default, and go-redis may retry). Other clients (a
// wrapper type, a test double) are accepted: their timeouts cannot be
// read. A nil client is the caller's to refuse.
func CheckContextTimeout(c any, timeout time.Duration) error {
	var enabled bool
	var rt, wt time.Duration
	switch cl := c.(type) {
	case *redis.Client:
		o := cl.Options()
		enabled, rt, wt = o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout
	case *redis.ClusterClient:
		o := cl.Options()
		enabled, rt, wt = o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout
	case *redis.Ring:
		o := cl.Options()
		enabled, rt, wt = o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout
	default:
		return nil
	}
	if enabled || (rt > 0 && rt <= timeout && wt > 0 && wt <= timeout) {
		return nil
	}
	return &throttle.OptionError{Field: "client", Reason: fmt.Sprintf(
		"the go-redis client must be created with ContextTimeoutEnabled: true (or ReadTimeout and WriteTimeout <= %v, the limiter's WithTimeout) so that the per-call timeout bounds Redis calls; it has ReadTimeout %v, WriteTimeout %v",
		timeout, rt, wt)}
}

// MaxExact is the largest integer a Lua number (a float64) holds exactly:
// 2^53. Counts, capacities and sums the scripts compute must stay within it.
const MaxExact = 1 << 53

// HintError is a Redis error whose cause is known to be a setting (of the
// server or of the limiter) rather than an outage: every call fails the
// same way until the setting changes. Advice says how to get out of it;
// the throttle.Gate logs it once (see throttle.WithLogger), found through
// the Hint method.
type HintError struct {
	Err    error
	Advice string
}

func (e *HintError) Error() string { return e.Err.Error() + " (" + e.Advice + ")" }

// Hint returns Advice.
func (e *HintError) Hint() string { return e.Advice }

// Unwrap returns the Redis error.
func (e *HintError) Unwrap() error { return e.Err }

// Explain returns err wrapped in a *HintError when its text is one of the
// Redis replies that no retry cures (a script may not call TIME, scripting
// is disabled or forbidden by an ACL, a script error, the key holds another
// type, keys across slots), naming the limiter family fam ("window",
// "bucket", "concurrency") in the hint; otherwise err itself. nil stays nil.
func Explain(fam string, err error) error {
	if err == nil {
		return nil
	}
	var he *HintError
	if errors.As(err, &he) {
		return err
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return err
	}
	msg := re.Error()
	var hint string
	timeWay := "by default the script calls TIME: use " + fam + ".WithServerClock() to decide on the Redis server's clock estimated from the TIME command, or " + fam + ".WithClock; see the package documentation"
	switch {
	case strings.Contains(msg, "TIME") || strings.Contains(msg, "non deterministic"):
		hint = "this Redis does not let scripts call TIME: " + timeWay
	case strings.Contains(msg, "Unknown Redis command called from script"):
		hint = "a command the script calls is unknown or renamed on this Redis; " + timeWay
	case strings.Contains(msg, "can't run this command or subcommand script"):
		hint = "the Redis user's ACL forbids a command the script calls; grant it, or, if it is TIME, " + timeWay
	case strings.HasPrefix(msg, "NOSCRIPT"):
		hint = "the script cache is flushed on every call or EVAL is refused: check the server's script settings (SCRIPT FLUSH loops, a proxy that does not forward EVAL)"
	case strings.HasPrefix(msg, "NOPERM"):
		hint = "the Redis user's ACL forbids a command the limiter needs (EVAL, EVALSHA and the commands its script calls): grant them"
	case strings.HasPrefix(msg, "WRONGTYPE"):
		hint = "another program uses a key under the limiter's prefix: choose another prefix with " + fam + ".WithPrefix"
	case strings.HasPrefix(msg, "CROSSSLOT"):
		hint = "the script's keys are in different cluster slots: a proxy may be rewriting keys"
	case strings.Contains(strings.ToLower(msg), "unknown command") && strings.Contains(strings.ToLower(msg), "eval"):
		hint = "this Redis service does not offer Lua scripting, which the " + fam + " Redis limiters need"
	case strings.HasPrefix(msg, "ERR") && strings.Contains(strings.ToLower(msg), "script"):
		hint = "the limiter's script fails on this Redis: the " + fam + " Redis limiters need Redis 7.0 or newer with Lua scripting"
	default:
		return err
	}
	return &HintError{Err: err, Advice: hint}
}

// CheckExact returns an error wrapping throttle.ErrInvalidOption, naming
// field, when n is above MaxExact: a Lua number (a float64) would round
// it, and the script's counts and Remaining would be wrong.
func CheckExact(field string, n int64) error {
	if n > MaxExact {
		return &throttle.OptionError{Field: field, Reason: fmt.Sprintf(
			"must be at most 2^53 (%d) for a Redis limiter, whose Lua script computes with doubles; got %d", int64(MaxExact), n)}
	}
	return nil
}

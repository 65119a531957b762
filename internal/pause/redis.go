package pause

import (
	"context"
	_ "embed"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed pause.lua
var pauseLua string

// script runs with EVALSHA, and is reloaded with EVAL on NOSCRIPT.
var script = redis.NewScript(pauseLua)

// Redis records in c a pause of d for the data key dataKey (its pause key
// is dataKey + Suffix) and returns how long the key stays paused: d, or
// the longer pause already recorded. now is the client's clock in µs, or
// < 0 for the server's TIME. With window, dataKey is a window's sorted
// set, and its expiry markers are dropped (see pause.lua). The caller has
// checked d and bounds ctx.
func Redis(ctx context.Context, c redis.Scripter, dataKey string, window bool, d time.Duration, now int64) (time.Duration, error) {
	keys := []string{dataKey + Suffix}
	if window {
		keys = append(keys, dataKey)
	}
	arg := strconv.FormatInt(Micros(d), 10)
	var cmd *redis.Cmd
	if now < 0 {
		cmd = script.Run(ctx, c, keys, arg)
	} else {
		cmd = script.Run(ctx, c, keys, arg, strconv.FormatInt(now, 10))
	}
	left, err := cmd.Int64()
	if err != nil {
		return 0, err
	}
	return time.Duration(left) * time.Microsecond, nil
}

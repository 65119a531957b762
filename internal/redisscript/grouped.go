package redisscript

import (
	"context"
	_ "embed"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/deadline"
)

// GroupedLua is the prelude of the scripts Grouped sends: eachKey, their
// outer loop over the keys of a call (see grouped.lua).
//
//go:embed grouped.lua
var GroupedLua string

// Grouped sends the script calls of a coalesced flush whose requests are
// grouped by key (see package internal/coalesce): one call carrying every
// group, or one call per group, pipelined, where the client routes by key
// (a cluster) or a server refused keys of several cluster slots in one
// call (CROSSSLOT, as a proxy in front of a cluster does).
type Grouped[G any] struct {
	Script *Script
	Client redis.Scripter
	// Build makes the script call of groups. Settle hands each group its
	// results from cmd (or err) and returns those whose key failed in a
	// call of several, unsettled: they are sent again alone, for their own
	// errors.
	Build  func(ctx context.Context, groups []G) *redis.IntSliceCmd
	Settle func(groups []G, cmd *redis.IntSliceCmd, err error) (failed []G)
	// RoundTrip records each call's round trip and the server's instant
	// that ends its reply (see Script.RunTimed).
	RoundTrip *deadline.RoundTrip

	oneKey atomic.Bool
}

// OneKeyPerCall makes every later Run send one call per group.
func (g *Grouped[G]) OneKeyPerCall() { g.oneKey.Store(true) }

// Run sends groups: together in one call when there are several, together
// is true (the script may read them together: say, no key twice) and
// OneKeyPerCall is off, else one call per group.
func (g *Grouped[G]) Run(ctx context.Context, groups []G, together bool) {
	if len(groups) > 1 && together && !g.oneKey.Load() {
		cmd := g.Build(ctx, groups)
		err := g.Script.RunTimed(ctx, g.Client, cmd, g.RoundTrip)
		if err == nil || !redis.HasErrorPrefix(err, "CROSSSLOT") {
			if failed := g.Settle(groups, cmd, err); failed != nil {
				g.oneByOne(ctx, failed)
			}
			return
		}
		// Refused before anything ran: one key per call from now on.
		g.oneKey.Store(true)
	}
	g.oneByOne(ctx, groups)
}

// oneByOne sends one call per group, pipelined.
func (g *Grouped[G]) oneByOne(ctx context.Context, groups []G) {
	if len(groups) == 0 {
		return
	}
	cmds := make([]*redis.IntSliceCmd, len(groups))
	for i := range groups {
		cmds[i] = g.Build(ctx, groups[i:i+1])
	}
	start := time.Now()
	errs := g.Script.RunAll(ctx, g.Client, cmds)
	last := len(cmds) - 1 // one pipeline, one round trip: recorded once
	for i := range last {
		errs[i] = g.RoundTrip.Explain(errs[i])
	}
	errs[last] = Observe(g.RoundTrip, start, cmds[last].Val(), errs[last])
	for i := range groups {
		g.Settle(groups[i:i+1], cmds[i], errs[i])
	}
}

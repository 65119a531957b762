package redisscript

import (
	"context"
	_ "embed"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/deadline"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
)

// GroupedLua is eachKey, the outer loop over the keys of a call that
// window.lua is prepended with (see grouped.lua). bucket.lua has a loop of
// its own with the same failure rule: its requests differ in length (a
// lease takes two arguments), which eachKey's fixed stride cannot walk.
//
//go:embed grouped.lua
var GroupedLua string

// Grouped sends the script calls of a coalesced flush whose requests are
// grouped by key (see package internal/coalesce), in the fewest calls the
// client and server take (see Mode):
//
//   - on a *redis.Client, one call carrying every group (Together): one
//     server holds every key;
//   - on a *redis.ClusterClient, one call per Redis Cluster hash slot
//     (PerSlot), pipelined: a script's keys must share a slot, and the
//     client routes a call by its first key;
//   - on a *redis.Ring or any other client, one call per group (PerKey),
//     pipelined: a Ring shards keys by its own hash, not by slot.
//
// A server that refuses a call of several keys with CROSSSLOT (nothing
// ran: a cluster node behind a plain client, a proxy in front of a
// cluster) moves the Grouped to the next mode for good, Together to
// PerSlot, PerSlot to PerKey, and the refused groups are sent again so.
// OneKeyPerCall sets PerKey from the start, for proxies that refuse
// scripts of several keys otherwise, or run them on the node of the first
// key whatever the others.
//
// The fields are set before the first Run and not changed after; Run is
// safe for concurrent use.
type Grouped[G any] struct {
	Script *Script
	Client redis.Scripter
	// Build makes the script call of groups. Settle hands each group its
	// results from cmd (or err) and returns those whose key failed in a
	// call of several, unsettled: they are sent again alone, for their own
	// errors.
	Build  func(ctx context.Context, groups []G) *redis.IntSliceCmd
	Settle func(groups []G, cmd *redis.IntSliceCmd, err error) (failed []G)
	// Key returns the Redis key a group's call is routed by (its first
	// key): its hash slot is the group's in PerSlot. Nil makes PerSlot
	// PerKey.
	Key func(G) string
	// RoundTrip records each call's round trip and the server's instant
	// that ends its reply (see Script.RunTimed).
	RoundTrip *deadline.RoundTrip

	mode atomic.Int32 // a Mode; 0 until set: ModeFor(Client)
}

// Mode is how Grouped splits a flush into script calls.
type Mode int32

// The modes, from the fewest calls to the most.
const (
	Together Mode = iota + 1 // one call for every group
	PerSlot                  // one call per cluster hash slot of the groups' keys
	PerKey                   // one call per group
)

// ModeFor returns the mode Grouped starts in on c: Together on a
// *redis.Client, PerSlot on a *redis.ClusterClient, PerKey on any other.
func ModeFor(c redis.Scripter) Mode {
	switch c.(type) {
	case *redis.Client:
		return Together
	case *redis.ClusterClient:
		return PerSlot
	default:
		return PerKey
	}
}

// Mode returns the mode the next Run sends in.
func (g *Grouped[G]) Mode() Mode {
	if m := Mode(g.mode.Load()); m != 0 {
		return m
	}
	return ModeFor(g.Client)
}

// OneKeyPerCall makes every later Run send one call per group (PerKey).
func (g *Grouped[G]) OneKeyPerCall() { g.mode.Store(int32(PerKey)) }

// raise moves g to the mode after from, unless it is already further, and
// returns the mode it is in.
func (g *Grouped[G]) raise(from Mode) Mode {
	next := min(from+1, PerKey)
	for {
		old := g.mode.Load()
		cur := Mode(old)
		if cur == 0 {
			cur = ModeFor(g.Client)
		}
		if cur >= next {
			return cur
		}
		if g.mode.CompareAndSwap(old, int32(next)) {
			return next
		}
	}
}

// Run sends groups in as few calls as g's mode allows (see Grouped) when
// together is true (the script may read them together: say, no key
// twice), else one call per group.
func (g *Grouped[G]) Run(ctx context.Context, groups []G, together bool) {
	m := g.Mode()
	if !together {
		m = PerKey
	}
	g.send(ctx, m, groups)
}

// send sends groups in mode m, pipelined, settles them, and sends again
// those refused with CROSSSLOT (in the next mode) and those that failed in
// a call of several keys (alone).
func (g *Grouped[G]) send(ctx context.Context, m Mode, groups []G) {
	if len(groups) == 0 {
		return
	}
	parts := g.split(m, groups)
	cmds := make([]*redis.IntSliceCmd, len(parts))
	for i, p := range parts {
		cmds[i] = g.Build(ctx, p)
	}
	var errs []error
	if len(cmds) == 1 {
		errs = []error{g.Script.RunTimed(ctx, g.Client, cmds[0], g.RoundTrip)}
	} else {
		start := time.Now()
		errs = g.Script.RunAll(ctx, g.Client, cmds)
		last := len(cmds) - 1 // one pipeline, one round trip: recorded once
		for i := range last {
			errs[i] = g.RoundTrip.Explain(errs[i])
		}
		errs[last] = Observe(g.RoundTrip, start, cmds[last].Val(), errs[last])
	}
	var refused, failed []G
	for i, p := range parts {
		if len(p) > 1 && errs[i] != nil && redis.HasErrorPrefix(errs[i], "CROSSSLOT") {
			// Refused before anything ran: the next mode, from now on.
			refused = append(refused, p...)
			continue
		}
		if len(p) > 1 {
			failed = append(failed, g.Settle(p, cmds[i], errs[i])...)
		} else {
			g.Settle(p, cmds[i], errs[i])
		}
	}
	if refused != nil {
		g.send(ctx, g.raise(m), refused)
	}
	g.send(ctx, PerKey, failed)
}

// split returns the groups of each call of mode m, in the order of their
// first group; within a call, groups keep their order.
func (g *Grouped[G]) split(m Mode, groups []G) [][]G {
	if len(groups) == 1 || m == Together {
		return [][]G{groups}
	}
	if m == PerSlot && g.Key != nil {
		parts := make([][]G, 0, len(groups))
		index := make(map[int]int, len(groups)) // slot -> part
		for _, gr := range groups {
			s := rediskey.Slot(g.Key(gr))
			i, ok := index[s]
			if !ok {
				i = len(parts)
				index[s] = i
				parts = append(parts, nil)
			}
			parts[i] = append(parts[i], gr)
		}
		return parts
	}
	parts := make([][]G, len(groups))
	for i := range groups {
		parts[i] = groups[i : i+1 : i+1]
	}
	return parts
}

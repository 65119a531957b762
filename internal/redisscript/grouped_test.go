package redisscript_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/deadline"
	"github.com/queuethrottle/queuethrottle/internal/rediskey"
	"github.com/queuethrottle/queuethrottle/internal/redisscript"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// incrLua adds to a counter per key, through grouped.lua's eachKey. KEYS:
// one counter per key. ARGV[1]: "1" to refuse a call of several keys with
// CROSSSLOT before running anything, as a proxy that refuses multi-key
// scripts does. Then, per key: m, and m increments. It replies the
// counter after each increment, key after key, the places of failed keys,
// then now (µs).
const incrLua = `
if ARGV[1] == "1" and #KEYS > 1 then
	return redis.error_reply("CROSSSLOT Keys in request don't hash to the same slot (refused by the test script)")
end
local out = {}
eachKey(out, 1, 2, 1, 1, 1, function(s, a, g)
	for i = 1, tonumber(ARGV[a]) do
		out[#out + 1] = redis.call("INCRBY", KEYS[s + 1], ARGV[a + i])
	end
end)
local t = redis.call("TIME")
out[#out + 1] = t[1] * 1000000 + t[2]
return out
`

// group is the requests of one key: increments, and what they got.
type group struct {
	key  string
	incs []int
	got  []int64
	err  error
}

// newGrouped returns a Grouped of the increment script on c; refuse makes
// the script refuse calls of several keys.
func newGrouped(c redis.Scripter, script *redisscript.Script, refuse bool) *redisscript.Grouped[*group] {
	argRefuse := "0"
	if refuse {
		argRefuse = "1"
	}
	return &redisscript.Grouped[*group]{
		Script: script,
		Client: c,
		Key:    func(g *group) string { return g.key },
		Build: func(ctx context.Context, groups []*group) *redis.IntSliceCmd {
			args := script.Start(nil)
			args = append(args, strconv.Itoa(len(groups)))
			for _, g := range groups {
				args = append(args, g.key)
			}
			args = append(args, argRefuse)
			for _, g := range groups {
				args = append(args, strconv.Itoa(len(g.incs)))
				for _, n := range g.incs {
					args = append(args, strconv.Itoa(n))
				}
			}
			return redis.NewIntSliceCmd(ctx, args...)
		},
		Settle: func(groups []*group, cmd *redis.IntSliceCmd, err error) (failed []*group) {
			v := cmd.Val()
			for _, g := range groups {
				if err != nil {
					g.err = err
					continue
				}
				g.got, v = v[:len(g.incs)], v[len(g.incs):]
			}
			return nil
		},
		RoundTrip: deadline.NewRoundTrip(time.Second),
	}
}

var incrScript = redisscript.New(redisscript.GroupedLua + incrLua)

// load loads the increment script on every server of c, so that the calls
// counted meet no NOSCRIPT (and its EVAL again).
func load(t *testing.T, c redis.Scripter) {
	t.Helper()
	if err := c.ScriptLoad(context.Background(), redisscript.GroupedLua+incrLua).Err(); err != nil {
		t.Fatal(err)
	}
}

// slotted returns keys per tag for each tag, "prefix{tag}:i": keys in
// len(tags) hash slots, per key a group of two increments, 1 and 2, slot
// after slot interleaved (so a call per slot gathers groups that are not
// next to each other).
func slotted(prefix string, tags []string, perTag int) []*group {
	var groups []*group
	for i := range perTag {
		for _, tag := range tags {
			groups = append(groups, &group{key: fmt.Sprintf("%s{%s}:%d", prefix, tag, i), incs: []int{1, 2}})
		}
	}
	return groups
}

// checkGroups checks that every group got its increments' counters: 1
// and 3 on a fresh key.
func checkGroups(t *testing.T, groups []*group, round int) {
	t.Helper()
	for _, g := range groups {
		if g.err != nil {
			t.Fatalf("round %d: key %s: %v", round, g.key, g.err)
		}
		base := int64(3 * (round - 1))
		if len(g.got) != 2 || g.got[0] != base+1 || g.got[1] != base+3 {
			t.Fatalf("round %d: key %s got %v, want [%d %d]", round, g.key, g.got, base+1, base+3)
		}
		g.got = nil
	}
}

// checkCalls checks the calls that ran: want of them, each of keys of
// one slot, every key of groups once.
func checkCalls(t *testing.T, calls []redistest.ScriptCall, groups []*group, want int) {
	t.Helper()
	if len(calls) != want {
		t.Fatalf("%d script calls ran, want %d", len(calls), want)
	}
	seen := map[string]int{}
	for _, c := range calls {
		for _, k := range c.Keys {
			if rediskey.Slot(k) != rediskey.Slot(c.Keys[0]) && want > 1 {
				t.Fatalf("a call of keys in several slots: %q", c.Keys)
			}
			seen[k]++
		}
	}
	for _, g := range groups {
		if seen[g.key] != 1 {
			t.Fatalf("key %s in %d calls, want 1", g.key, seen[g.key])
		}
	}
}

// TestGroupedCalls sends 20 keys in 4 hash slots through each kind of
// client: one script call on a *redis.Client, one per slot on a
// *redis.ClusterClient, one per key on a *redis.Ring, with OneKeyPerCall
// and when the groups may not go together.
func TestGroupedCalls(t *testing.T) {
	srv := redistest.Start(t)
	cluster := redistest.StartCluster(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"one": srv.Addr()}})
	t.Cleanup(func() { _ = ring.Close() })
	type client interface {
		redis.Scripter
		AddHook(redis.Hook)
	}
	tags := []string{"a", "b", "c", "d"}
	cases := []struct {
		name   string
		client client
		oneKey bool
		apart  bool // Run's together is false
		mode   redisscript.Mode
		calls  int
	}{
		{name: "client", client: srv.Client(t), mode: redisscript.Together, calls: 1},
		{name: "cluster", client: cluster.Client(t), mode: redisscript.PerSlot, calls: 4},
		{name: "ring", client: ring, mode: redisscript.PerKey, calls: 20},
		{name: "client, OneKeyPerCall", client: srv.Client(t), oneKey: true, mode: redisscript.PerKey, calls: 20},
		{name: "cluster, OneKeyPerCall", client: cluster.Client(t), oneKey: true, mode: redisscript.PerKey, calls: 20},
		{name: "client, not together", client: srv.Client(t), apart: true, mode: redisscript.Together, calls: 20},
		{name: "cluster, not together", client: cluster.Client(t), apart: true, mode: redisscript.PerSlot, calls: 20},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			load(t, tc.client)
			rec := redistest.RecordScripts(tc.client)
			g := newGrouped(tc.client, incrScript, false)
			if tc.oneKey {
				g.OneKeyPerCall()
			}
			groups := slotted(fmt.Sprintf("calls:%d:", i), tags, 5)
			for round := 1; round <= 2; round++ {
				rec.Reset()
				g.Run(context.Background(), groups, !tc.apart)
				checkGroups(t, groups, round)
				checkCalls(t, rec.Calls(), groups, tc.calls)
			}
			if m := g.Mode(); m != tc.mode {
				t.Fatalf("Mode %d, want %d", m, tc.mode)
			}
		})
	}
}

// TestGroupedCrossSlot: a server that refuses a call of several keys
// with CROSSSLOT (nothing ran) moves the Grouped to the next mode for
// good, and every group is decided once: a script that refuses every call
// of several keys (a proxy that refuses multi-key scripts) on a
// *redis.Client (Together, then PerSlot, then PerKey) and on a
// *redis.ClusterClient (PerSlot, then PerKey); a cluster node behind a
// *redis.Client refuses keys of several slots, and takes a call per slot.
func TestGroupedCrossSlot(t *testing.T) {
	srv := redistest.Start(t)
	cluster := redistest.StartCluster(t)
	// Four tags whose slots node 0 serves.
	var own []string
	for i := 0; len(own) < 4; i++ {
		if tag := fmt.Sprint("n", i); cluster.MasterFor("{"+tag+"}") == 0 {
			own = append(own, tag)
		}
	}
	type client interface {
		redis.Scripter
		AddHook(redis.Hook)
	}
	cases := []struct {
		name    string
		client  client
		refuse  bool
		tags    []string
		refused int // calls refused in the first round
		mode    redisscript.Mode
		calls   int // calls that ran in each round
	}{
		{name: "proxy, client", client: srv.Client(t), refuse: true, tags: []string{"a", "b", "c", "d"}, refused: 1 + 4, mode: redisscript.PerKey, calls: 20},
		{name: "proxy, cluster", client: cluster.Client(t), refuse: true, tags: []string{"a", "b", "c", "d"}, refused: 4, mode: redisscript.PerKey, calls: 20},
		{name: "cluster node", client: cluster.Node(0).Client(t), tags: own, refused: 1, mode: redisscript.PerSlot, calls: 4},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			load(t, tc.client)
			rec := redistest.RecordScripts(tc.client)
			g := newGrouped(tc.client, incrScript, tc.refuse)
			groups := slotted(fmt.Sprintf("crossslot:%d:", i), tc.tags, 5)
			for round := 1; round <= 2; round++ {
				rec.Reset()
				g.Run(context.Background(), groups, true)
				checkGroups(t, groups, round)
				checkCalls(t, rec.Ran(), groups, tc.calls)
				refused := 0
				for _, c := range rec.Calls() {
					if c.Err != nil {
						if !redis.HasErrorPrefix(c.Err, "CROSSSLOT") {
							t.Fatalf("round %d: a call failed with %v", round, c.Err)
						}
						refused++
					}
				}
				if want := map[int]int{1: tc.refused, 2: 0}[round]; refused != want {
					t.Fatalf("round %d: %d calls refused, want %d", round, refused, want)
				}
				if m := g.Mode(); m != tc.mode {
					t.Fatalf("round %d: Mode %d, want %d", round, m, tc.mode)
				}
			}
		})
	}
}

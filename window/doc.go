// Package window implements the sliding window log: a key may be admitted at
// most Count units (a request of cost n is n units) in any window of length
// Per. [Redis] keeps the log in Redis, shared by every process that uses the
// same Redis; [Memory] is its in-process twin with the same semantics, for
// one process and for tests.
//
// # Rules
//
// An admission at instant t counts during [t, t+Per): at t+Per-1µs it is
// still counted, at t+Per it is gone. Time is kept in whole microseconds
// and Per is rounded up to a whole microsecond.
//
// A request of cost n is admitted if the units counted at that instant plus
// n are at most Count; it is then recorded as n units at that instant. A
// rejected AllowN is never recorded, so clients that retry early do not
// push their own admission back.
//
// A rejection's RetryAfter is the time until enough of the oldest counted
// units leave the window for n to fit: with count units counted, the k-th
// oldest (k = count + n - Count), at score s, leaves at s + Per, so
// RetryAfter = s + Per - now, rounded up to the millisecond. It is never 0,
// and presenting the same request RetryAfter later admits it if nobody took
// the room first. ResetAfter is the newest counted admission + Per - now
// (Per for an admission). Durations in a Decision are never rounded down.
//
// Exactness holds in real time, not only on the microsecond grid: a clock
// reading with a part below the microsecond is rounded up for the record
// and decided with a window one microsecond longer, so two admissions can
// never lie less than Per apart in real time while Count others sit
// between them. The Redis server's TIME (whole microseconds of a real
// instant) is treated the same way. RetryAfter may then be Per plus a
// millisecond.
//
// # Reservations and ids (scheduled admission)
//
// AllowID (throttle.IDLimiter) decides a request that carries an identity
// (a stream sequence, a task ID), so that a rejection is a schedule rather
// than a bounce:
//
//   - A rejection reserves the request's own slot when it lies within the
//     horizon: n units recorded at the earliest instant s at which n more
//     units keep every window containing s within Count, reservations
//     included. Decision.Reserved is true and RetryAfter is s - now. With
//     unit costs this is first come, first served per key; with mixed
//     costs a small request may take a gap before a larger reservation
//     (backfilling, however far ahead the gap lies), never delaying it.
//     Beyond the horizon nothing is reserved and RetryAfter is when the
//     request would fit.
//   - A request admitted now must keep every window within Count,
//     reservations included: it never delays a reservation. AllowN obeys
//     the same rule, so its rejections wait behind the reservations too.
//   - The same id presented again: still counted after an admission, it
//     is admitted without a charge (a redelivery, another worker, a retry
//     after a lost reply), and stays counted at its first admission;
//     before its slot, rejected with the time left to it, nothing new
//     reserved; at or after its slot, admitted on it. (So when the reply
//     of an admission is lost to a timeout and the message runs only on
//     its next delivery, it runs later than it is counted: keep
//     WithTimeout well above the Redis round trip.)
//   - A claim is judged on the last window alone, and only on what is
//     ahead of it: admissions, and reservations for earlier slots. It is
//     recorded at the instant it is decided, so a message that comes back
//     late never makes a burst; if the window is full (others ahead came
//     late too) it is re-reserved where the window allows it, usually
//     milliseconds later. A reservation claimed after its window has
//     passed keeps this priority for the smaller of its horizon and 10 s.
//   - A reservation never claimed counts as an admission at its slot and
//     passes with its window, as any admission does; nothing grows without
//     bound: the key expires after its newest unit's window plus that
//     grace.
//
// Ids are opaque bytes, scoped to the key. The same id should be presented
// with the same n. An id admitted before is admitted with
// Decision.AlreadyAdmitted set.
//
// AllowIDAfter (throttle.SlotLimiter) is AllowID for a slot no earlier
// than now + after: the same search, from that instant; it gives up a
// reservation the id holds before then and never admits now. throttle.All
// uses it to hold one slot in every part.
//
// This is the sliding window log of the rate-limiting literature (see, for
// example, Figma's "An alternative approach to rate limiting", 2017):
// unlike a fixed window or a sliding window counter it is exact, at the
// cost of one log entry per admitted unit.
//
// # Redis
//
// Each key is one sorted set whose members are the units (AllowN: unique
// identities, a random 64-bit id per limiter plus a counter; AllowID:
// "A<i>:<id>" for admitted and "R<i>:<id>" for reserved units) scored by
// their instant in microseconds: the admission, or the reserved slot. A
// Lua script (window.lua, run with EVALSHA and reloaded on NOSCRIPT)
// counts the members in the window and, if n more fit, adds n members and
// makes sure the key's expiry covers its newest member; a rejection of
// AllowN, or of AllowID beyond its horizon, adds nothing and does not
// renew the expiry. On a plain key (no pause, no reservation, the server's
// clock) an AllowN that fits is one ZCOUNT and one ZADD: the set also
// holds an expiry marker (the member "~e" and the window in µs, scored
// below every unit at E - 2^53, E being the instant, in ms, the key is
// known to live until), rounded up to the next half window, and the expiry
// (PEXPIREAT) and the drop of the members that left the window are written
// only when the marker moves, at most twice a window; a set with no unit
// in the window (a key seen less than once a window) is deleted and
// written anew, its units, marker and expiry. A call run twice (a
// client's retry) moves its unit to the later instant and still tells
// whether the marker moved; a window that shrinks has a marker of its own,
// and a marker that moves drops the others (with the members that left the
// window) and is written back, so a key keeps one even when its window
// changes at every decision. Other decisions drop the members that left
// the window (the markers with them) before they count. Processes on
// earlier versions drop the markers the same way and keep their own
// expiry, so both decide correctly on the same keys.
//
// The marker also tells that the key is plain: a set holds one only
// while its key has neither pause nor schedule (every path that writes a
// marker looks first; Pause, a reservation and the loss of a set drop or
// find none), so a lone AllowN whose marker is in place reads neither.
// One that finds it missing or moved looks, and when the key has either,
// takes its unit back and decides on the full path. A pause recorded by
// a process of an earlier version (its Pause left the marker) is seen by
// today's lone calls within half a window, as the marker moves, and by
// every other decision at once; no decision goes over the limit
// meanwhile.
//
// Decisions are coalesced (group commit): a call that finds no other in
// flight goes at once, alone; while calls are in flight, the decisions
// of other goroutines queue, and the next flush sends them together, at
// most 256 requests and MaxCost units per flush (a call of more units
// would outlast the default timeout), each key's requests in arrival
// order; when every request is an AllowN of one unit under one quota
// the call sends a compact form, answered compactly: two arguments a key
// instead of seven when each key has one (most flushes over many keys),
// 2 + m instead of 4 + 3m when a key has m (a hot key's flush), and one
// integer back for each key admitted whole instead of three a request. On a
// *redis.Client one script call carries every key of the flush; on a
// *redis.ClusterClient one script call per Redis Cluster hash slot carries
// the keys of that slot, the calls pipelined (see Redis Cluster below); on
// a *redis.Ring (which shards by its own hash, not by slot) or any other
// client, and with [WithOneKeyPerCall], there is one script call per key,
// pipelined. A server that refuses keys of several slots in one call
// (CROSSSLOT: a cluster node behind a plain client, a proxy in front of a
// cluster; nothing ran) moves the limiter for good to the next of these,
// from one call to one per slot, from one per slot to one per key, and the
// refused keys are sent again so. The script decides the
// requests one after another at one instant, with exactly the results of
// the same calls made one by one then. A flush whose requests all fit
// (AllowN, and AllowID with new ids) takes a fast path: one ZMSCORE for
// the ids, one ZADD and one PEXPIRE per key (plain keys: see above); a
// lone AllowID on a key with
// no reservation in its last window and 10 s (its schedule, a second key
// of the slot, says so) needs no ZMSCORE: its ZADD NX tells whether the
// id is known. That relies on the schedule living as long as its
// reservations: run Redis with maxmemory-policy noeviction, as the sets
// themselves need (an evicted schedule can waste a reserved unit or let
// its id in before its slot, never over the limit). So under load Redis
// runs the script once per flush, not once per decision: with 500
// goroutines on one key, 500 decisions took 4 script calls. A slot search
// (for a rejection behind reservations) starts where the last one found
// no room, kept in a third key of the slot (the hint), so a flood of
// reservations does not search the same full windows again at every
// request; a claim that comes late and is reserved again marks only the
// window its units left as to be searched again. A claim reads only the
// members between its slot and now, not its whole window. The instant is
// the Redis
// server's TIME, so every worker shares one clock, unless [WithClock] is
// given: then the client's time is sent and clamped to the newest
// admission of the key (kept in a second key of the same slot), so stored
// time never moves backwards. The script uses PEXPIRE with NX and GT:
// Redis 7.0 or newer.
//
// A caller that holds many requests at once decides them with
// [Redis.AllowBatch] (throttle.BatchLimiter): as AllowN one after another,
// on its own goroutine, in one script call per 256 requests and MaxCost
// units (per hash slot on a cluster, per key on a Ring or with
// WithOneKeyPerCall), without the queue and beside it.
//
// # Pause
//
// Pause(ctx, key, d) makes every decision for key a rejection for d
// (throttle.Pauser): AllowN, AllowID and Peek reject with Remaining 0 and a
// RetryAfter of the time left of the pause, recording and reserving
// nothing; a longer pause extends, a shorter one never shortens, and Reset
// ends it. Consumers call it, through throttle.Gate.Pause, when a partner
// answers 429 (natsthrottle.Backoff, asynqthrottle.Backoff). [Redis] keeps
// the pause in a string key beside the sorted set, prefix + "{" + tag +
// "}:pause", holding the instant the pause ends, so every process sharing
// the Redis sees it; window.lua reads it with the schedule of each key
// (the hint of slot searches and the newest reservation, so that an
// admission's ResetAfter needs no look at the set when nothing is
// reserved) in one MGET per script call, and it expires when the pause
// ends. [Memory] keeps
// its pauses apart from the logs, so the sweep of idle keys never forgets
// one. Pause refuses d <= 0 with an error naming "d".
//
// # Lost sets
//
// Redis can lose a key's set while its units still count: FLUSHALL, a
// restart without persistence, eviction under maxmemory, a failover to a
// replica that lacked it. Admitting on the empty set would let a second
// limit's worth through within one window. [Redis] remembers, per key
// (up to 100,000 keys), until when the set must hold a unit it saw
// admitted (the script's instant plus the reply's reset, at most a
// window: reservations ahead are a schedule, and their loss needs no
// pause beyond the one window), and passes it
// with every script call for the key; window.lua answers with its instant,
// so this costs no extra round trip. A set gone before then, with the key
// not paused, was lost: the script pauses the key until now + Per, in the
// pause key (same cluster slot), so every process honours it, and decides
// the request as paused. Whenever the loss happened, the units before it
// have left by then; nothing beyond the limit is admitted. A brand-new
// key (a fresh deploy, a first message) is not a loss and costs nothing:
// only a process that saw the key admit recently can tell. Nor is a set
// whose units all left a window that shrank since (a quota changed): it
// still holds them, or its expiry marker, when the script looks.
//
// What a loss can still cost: a process that has not seen an admission on
// the key within the last window cannot tell (after a restart of every
// process, say), nor can its calls already on their way when the loss took
// an admission whose reply had not come back yet (up to that admission's
// units again: Count + 1 once, with FLUSHALL every 600 ms under a flood of
// 24 goroutines), and a partial loss (a failover to a replica behind by a
// few writes, appendfsync everysec) leaves a set that is not empty, so it
// is not seen either: up to the units lost may be admitted again. Bound
// that with persistence (appendfsync always) or, for failovers, with
// replicas acknowledged before a decision counts (WAIT; not done by this
// package). A Refund or Reset in another process can make a set look lost:
// the key then pauses for one window (never admits more). AllowJoint
// (stacked windows in one script) checks each of its windows the same way.
// With WithClock the check is off: Redis expires keys on its own time, so
// under a client clock slower than it an expiry would look like a loss.
//
// # Keys
//
// A key maps to the Redis key prefix + "{" + tag + "}" (prefix default
// "throttle:window:", see [WithPrefix]). The braces are a Redis Cluster hash
// tag, so every Redis key of one identity sits in one slot. The tag is the
// key with '%', '{' and '}' escaped as "%25", "%7B" and "%7D"; "" becomes
// "%E", and a key longer than 256 bytes becomes "%H" + the hex SHA-256 of
// it. No key can break out of its tag, and two different keys never share
// a Redis key (except for a SHA-256 collision between two long keys). Any
// string is a valid key, including binary ones.
//
// # Timeouts and cost
//
// Every Redis call is bounded by [WithTimeout] (default 50 ms) as a context
// deadline, which go-redis honours only on clients created with
// ContextTimeoutEnabled: true; [NewRedis] refuses a client without it
// unless its ReadTimeout and WriteTimeout are both within the timeout. The
// timeout bounds the Redis round trip of a call or flush, not the time a
// decision waits queued behind the limiter's own flushes: that is bounded
// by the caller's context alone. A caller whose context ends while its
// decision is queued gets the context's error and is charged nothing;
// once its decision is in a flush, it gets the context's error at once
// and Redis may still apply the decision (as with any lost reply; ids
// make a retry of AllowID free), unless the script runs after the
// caller's deadline less one round trip (Redis was slow or stalled), in
// Redis's clock (the offset is estimated from the replies, each of which
// carries the server's instant): with the server's TIME it then applies
// nothing, and the decision fails with an error matching
// context.DeadlineExceeded. Since a limiter has at most two calls in
// flight, its decisions do not wait for pooled connections either. A
// flush that times out is an error for every decision in it, and the
// throttle.Gate's failure policy decides. One call may charge at most
// [MaxCost] units: the log stores one member per unit, so a large n would
// hold the Redis server for O(n). For weights such as bytes, use a token
// bucket.
//
// # Redis Cluster
//
// [NewRedis] takes a redis.Scripter, which *redis.Client,
// *redis.ClusterClient and *redis.Ring all satisfy. On a Redis Cluster
// each script call runs on the master that holds its keys' slot (go-redis
// routes EVALSHA by its first key): the keys of one identity (its sorted
// set, hint, pause and clock floor) all lie in the identity's slot, and a
// coalesced flush or a batch puts the identities of one slot in one call
// (their slot from the hash tag, the CRC16 of the escaped identity, as
// Redis computes it), the calls of different slots pipelined, so no
// decision fails with CROSSSLOT, and Redis runs one script per slot of a
// flush rather than one per key. A proxy in front of a cluster that
// refuses scripts of several keys, or that routes a script by its first
// key alone, needs [WithOneKeyPerCall]; one that answers CROSSSLOT needs
// nothing (see above). Processes with and without it, and releases before
// it (one key per call on a cluster), decide the same keys together
// exactly: a call of several keys decides each key as a call of its own
// would, atomically per key. If a master is
// down, AllowN returns an error for the keys in its slots only, and the
// throttle.Gate's failure policy decides for them; keys on the other
// masters are decided as before. Run the cluster with
// cluster-require-full-coverage no if the keys of the live masters should
// keep working while one master is down: with the default, every node
// refuses every key once the cluster notices.
//
// # Memory
//
// A Redis window holds one sorted-set member (an 8-byte identity for
// AllowN, the id and a unit number for AllowID, and its score) per
// admitted unit in the last Per. Measured on Redis 7.0
// (BenchmarkRedisBytesPerUnit: 1,000 keys, each full at a limit of 100):
// 21.4 bytes per unit, all keys counted, while a key holds at most 128
// members (a listpack, the zset-max-listpack-entries default; 36.7 with
// the 20-byte members of earlier versions, which a key may hold beside
// these during a rolling upgrade: both count alike), about 120-130 bytes
// per member above that (a skiplist), and the expiry marker, one member
// per window the key was decided under. Keys expire one window to a window and a half after their
// last admission (the marker's rounding), so an idle key costs nothing; a
// busy key holds at most a window and a half of units. [Memory] holds at
// most Count entries per key and window up to its furthest reservation
// (fewer when admissions share a microsecond), forgets a key only once its
// log is empty (on decisions, and every JanitorPeriod without them), and
// holds at most WithMaxKeys keys (default DefaultMaxKeys): a new key
// beyond them is refused with throttle.ErrTooManyKeys, never by resetting
// a key that still counts.
//
// Reservations are units too: a key holds at most Count units per window
// up to its furthest reservation (horizon / Per + 1 windows of them).
//
// Both limiters are safe for concurrent use and implement
// throttle.Limiter, throttle.IDLimiter, throttle.Refunder and
// throttle.Algorithmer ("sliding_window_log"). Refund takes an id's units
// (or its reservation) out of the log, as if the request had never been
// made; throttle.All uses it to give back a request that another limit
// rejected. Redis also implements throttle.JointLimiter: AllowJoint
// decides one request in several Redis windows on one client (keys on one
// server, or in one Redis Cluster slot) in one script, joint.lua, which
// admits it in all of them or in none; throttle.All of such windows costs
// one round trip.
package window

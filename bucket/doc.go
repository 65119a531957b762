// Package bucket provides token-bucket limiters: [Local], in process;
// [Redis], shared by every process through Lua scripts; and [Hybrid],
// which decides most admissions locally on tokens leased from the Redis
// bucket. The guide is docs/limits-and-quotas.md ("Token buckets") in the
// repository; failure handling is in docs/failure-and-faults.md.
//
// # Algorithm
//
// The classic token bucket (golang.org/x/time/rate; the meters of RFC
// 2697). A bucket per key holds up to burst tokens and refills at Count
// tokens per Per. A request of cost n is admitted if n tokens are there,
// and takes them. Refill is computed at each decision; there are no
// timers. A rejection takes nothing and does not move the refill
// timeline. A new or forgotten key starts full.
//
// Time is whole microseconds and the arithmetic exact integers, so Local
// and Redis decide identically at the same instants: 5 per 2s waits
// exactly 400ms between tokens. burst × Per must not exceed 2^53 µs.
//
// # Decisions
//
//   - Limit: Count.
//   - Remaining: whole tokens left after the decision.
//   - RetryAfter: (n - tokens) / rate, rounded up to the millisecond; 0
//     when admitted.
//   - ResetAfter: time until the bucket is full again, rounded up to the
//     millisecond.
//   - Source: throttle.SourceLocal for Local, throttle.SourceRedis for
//     Redis.
//
// With 10 per second and a burst of 3, three requests at once are
// admitted with Remaining 2, 1, 0; a fourth is rejected with RetryAfter
// 100ms.
//
// # Reservations and ids
//
// Local and Redis implement throttle.IDLimiter (AllowID), throttle.Refunder
// (Refund) and throttle.SlotLimiter (AllowIDAfter); the Hybrid does not.
//
//   - A reservation takes its tokens ahead of time, as x/time/rate's
//     ReserveN: the credit goes negative, a debt the refill repays, and
//     the id holds the instant it is repaid. It is made only if that lies
//     within the horizon; beyond it nothing is taken.
//   - An id holding a slot is rejected with the time to it, then admitted
//     on it, taking nothing more. An admitted id is admitted again, taking
//     nothing, with Decision.AlreadyAdmitted set.
//   - AllowN never goes ahead of reservations: while the bucket is in debt
//     it rejects.
//   - Ids are remembered for burst × Per / Count after their admission or
//     slot, then forgotten: a forgotten id is a new request.
//   - AllowIDAfter reserves the later of the request's own slot and now +
//     after, a later one only while the bucket without the request would
//     not be full again by then (else nothing is taken, RetryAfter =
//     after): throttle.All uses it for one slot in every part.
//   - Refund gives back what an id holds, capped at burst, without moving
//     the refill timeline; refunding twice gives back once.
//
// With 2 per second and a burst of 2, ids a and b at once are admitted;
// c, d and e at once, with a horizon of 5 s, are reserved at 500ms, 1s
// and 1.5s.
//
// # Quotas, Peek, Reset, Pause
//
//   - WithQuotas gives each key its own Rate and burst, read at every
//     decision. A change keeps the tokens held, capped at the new burst. A
//     quota of 0 (throttle.Blocked) rejects every request of the key.
//   - Peek returns what AllowN would, taking nothing.
//   - Reset forgets a key: full again, its ids forgotten.
//   - Pause (throttle.Pauser) rejects every decision of a key for d,
//     nothing taken; a longer pause extends, a shorter one never shortens.
//     The consumers call it on a partner's 429.
//
// # Errors
//
//   - Constructors: errors wrapping throttle.ErrInvalidOption, naming the
//     field (Rate.Count, Rate.Per, burst, client, or the option).
//   - n < 1 or n > burst: an error wrapping throttle.ErrInvalidCost,
//     before any store access. Such a request can never be admitted.
//   - A negative horizon or after: throttle.ErrInvalidOption, naming it.
//   - A key whose quota is invalid: throttle.ErrInvalidOption, naming the
//     key.
//   - Local and Redis beyond WithMaxKeys live keys: throttle.ErrTooManyKeys
//     for a new key; no live key is ever forgotten to make room.
//   - Redis failures and timeouts: wrapped as "bucket: redis: ...".
//
// # Redis
//
//   - Each key's bucket is one 25-byte string under prefix + "{" + escaped
//     key + "}" (default prefix "throttle:bucket:"), its ids a sorted set
//     beside it (+ ":ids") and its pause a string (+ ":pause"), all in one
//     Redis Cluster slot: no script can fail with CROSSSLOT. Keys are
//     escaped as in package window. Older text and hash encodings are read
//     and replaced; an older process fails with WRONGTYPE on a newer key.
//   - NewRedis and NewHybrid take a redis.Scripter (*redis.Client,
//     *redis.ClusterClient, *redis.Ring). A master down fails only its
//     slots' keys.
//   - The scripts use Redis's TIME, so every process shares one clock;
//     WithClock sends the client's time instead.
//   - A bucket Redis lost (FLUSHALL, a restart without data, a failover)
//     while a process knows it was short of full starts empty, not full,
//     for every process. A partial loss can still cost a bucket's worth;
//     bound it with persistence or WAIT.
//   - Redis.AllowN and the Hybrid's leases are coalesced: while calls are
//     in flight, the others go together in the next flush: one script call
//     for every key on a *redis.Client, one per Redis Cluster hash slot on
//     a *redis.ClusterClient (the keys of one slot together, the calls
//     pipelined), one per key on a *redis.Ring (it shards by its own hash)
//     or any other client. AllowID is one script call per decision;
//     Redis.AllowBatch decides many requests in one call per 256 (per
//     slot on a cluster). A call whose buckets share one quota and take
//     one token each (AllowN(1): most flushes) sends one argument a
//     bucket instead of three. A lone AllowN on the server's clock, of a
//     bucket not paused and missing or of the current layout, is decided
//     at the script's head, before its functions are made: it costs Redis
//     a quarter less (bench/callgrind.sh).
//   - WithOneKeyPerCall sends one key per script call whatever the
//     client, for a proxy that refuses scripts of several keys or routes
//     them by their first key alone. A server that answers CROSSSLOT to a
//     call of several keys (a cluster node behind a plain client, a proxy;
//     nothing ran) moves the limiter for good from one call to one per
//     slot, and from one per slot to one per key, sending the refused keys
//     again so. Processes with and without the option, and releases
//     before per-slot calls, decide the same keys together exactly.
//
// # Timeouts
//
// Every Redis call carries a deadline of WithTimeout (default 50 ms).
// go-redis honours context deadlines only on clients built with
// ContextTimeoutEnabled: true:
//
//	client := redis.NewClient(&redis.Options{
//		Addr:                  "localhost:6379",
//		ContextTimeoutEnabled: true, // required for WithTimeout to bound calls
//	})
//
// NewRedis and NewHybrid refuse a client without it unless its
// ReadTimeout and WriteTimeout are both within WithTimeout.
package bucket

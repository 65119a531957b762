// Package bucket provides token-bucket limiters: [Local], in process;
// [Redis], shared by every process through a Lua script, coalesced
// across goroutines (see "Coalescing" below);
// and the Hybrid, which decides most admissions locally on tokens leased
// from the Redis bucket.
//
// # Algorithm
//
// The classic token bucket (as in golang.org/x/time/rate, or the meters of
// RFC 2697): a bucket per key holds up to burst tokens and refills at
// Count tokens per Per; a request of cost n is admitted if n tokens are
// there, and takes them. Refill is lazy, computed from the elapsed time at
// each decision; there are no timers. A rejection takes nothing and does
// not move the refill timeline, so a client that retries faster than the
// refill is still admitted at the refill rate. A new (or forgotten) key
// starts full.
//
// Time is kept in whole microseconds, and the arithmetic is exact
// integers: a token is worth Per (in µs) units of credit and every
// microsecond adds Count units. Waits therefore come out exact before
// being rounded up to the millisecond; 5 per 2s waits 400ms between
// tokens, never 0 and never 401ms. Local and Redis decide identically at
// the same instants. burst × Per must not exceed 2^53 µs (about 285 years).
//
// # Decisions
//
// Limit is Count; Remaining is the whole tokens left after the decision;
// RetryAfter is (n - tokens) / rate, rounded up to the millisecond (0 when
// admitted); ResetAfter is the time until the bucket is full again,
// rounded up to the millisecond. Source is throttle.SourceLocal for Local
// and throttle.SourceRedis for Redis.
//
// For example, with 10 per second and a burst of 3, three requests at once
// are admitted with Remaining 2, 1, 0 and ResetAfter 100ms, 200ms, 300ms; a
// fourth is rejected with RetryAfter 100ms.
//
// # Reservations and ids
//
// Local and Redis implement throttle.IDLimiter: AllowID(ctx, key, n, id,
// horizon) decides a request that carries an identity (a stream sequence,
// a task ID; opaque bytes, scoped to key), so that a rejection is a
// schedule rather than a bounce, and admission is idempotent. As
// golang.org/x/time/rate's ReserveN does, a reservation takes its tokens
// ahead of time: the bucket's credit goes negative, a debt that the refill
// repays. A new id is admitted if n tokens are there, as AllowN; if not,
// and the debt after taking them now would be repaid within horizon (wait
// = (n - tokens) / rate, exactly, in µs), they are taken, the id holds the
// slot now + wait, and the rejection has Reserved set and RetryAfter =
// wait rounded up to the millisecond. Beyond the horizon nothing is taken,
// and RetryAfter is AllowN's. Presented again, an id holding a slot is
// rejected with the time to it until the slot comes, and then admitted on
// its reservation (late or not, it takes nothing more); an admitted id is
// admitted again, taking nothing (a redelivery, another worker, a retry
// after a lost reply). AllowN never goes ahead of reservations: while the
// bucket is in debt it rejects, with a RetryAfter that includes the debt.
// Debt is at most horizon × rate (plus the last request's n), and never
// more than 2^53 µs minus burst × Per of credit, so the arithmetic stays
// exact.
//
// For example, with 2 per second and a burst of 2, ids a and b at once are
// admitted; c, d and e at once, with a horizon of 5 s, are reserved at
// 500ms, 1s and 1.5s (RetryAfter 500ms, 1s, 1.5s), and an AllowN then
// waits 2s; c presented at 250 ms is rejected with RetryAfter 250ms, and
// at 500 ms (or later) admitted.
//
// Ids are remembered for the time the bucket takes from empty to full,
// burst × Per / Count (1 s in the example), after their admission or their
// slot; then they are forgotten, and a forgotten id is a new request. Local
// keeps them beside each key's bucket and forgets them lazily, in
// amortized O(1) per id, at the key's next AllowID; a key is forgotten
// only once its bucket is full and its ids forgotten, never to make room
// (see Local: a new key beyond WithMaxKeys is refused with
// throttle.ErrTooManyKeys). Redis keeps them in a sorted set beside the
// key's bucket, prefix + "{" + escaped key + "}" + ":ids" (the same Cluster
// slot), with members "A:" + id (admitted, scored by the admission
// instant in µs since the Unix epoch) and "R:" + id (reserved, scored by
// the slot in µs); the set expires when its newest id is forgotten, and
// the bucket, which holds the debt as negative credit, when it would
// be full again. One Lua script (bucket_id.lua) decides each AllowID;
// AllowN's script is unchanged.
//
// AllowIDAfter (throttle.SlotLimiter) is AllowID for a slot no earlier
// than now + after, for throttle.All's one slot in every part: the tokens
// are taken now and the later of the request's own slot and now + after
// reserved, a later one only while the bucket without the request would
// not refill to its burst by then (else nothing is taken, RetryAfter =
// after). An id admitted before is admitted with Decision.AlreadyAdmitted.
//
// The Hybrid does not implement throttle.IDLimiter; see Hybrid.
//
// # Quotas, Peek and Reset
//
// WithQuotas gives each key a quota of its own (plan tiers, an override
// for one big tenant): Quota.Rate refills it and Quota.Burst is its
// capacity (0 means Rate.Count); Decision.Limit is the key's Rate.Count.
// The QuotaFunc runs on every decision, so a change applies from the next
// one: the key's bucket keeps the tokens it holds, capped at the new burst,
// and refills at the new rate from then on; a new Per keeps the whole
// tokens (a partial one is dropped). Redis stores the period a key's
// credit is counted in beside it (the per of its string), so that every
// process converts the same way, and a Hybrid drops (never returns) the
// tokens it leased under a quota that changed. The quota package keeps
// quotas in a Redis hash, cached in process.
//
// Peek(ctx, key, n) returns what AllowN would return and takes nothing
// (Local reads its state, Redis runs peek.lua, which writes nothing and
// renews no expiry, and the Hybrid runs AllowN's decision on a copy of the
// key's local state, reading Redis where AllowN would lease). Reset(ctx,
// key) forgets a key: its bucket is full again and its ids forgotten; an
// unknown key is not an error. Every limiter here passes
// throttletest.RunBucketQuotas and throttletest.RunPeekReset.
//
// # Refunds
//
// Local and Redis implement throttle.Refunder: Refund(ctx, key, n, id)
// gives back the n tokens that AllowID took for id (its admission, while
// the bucket remembers the id, or its reservation) without moving the
// refill timeline, capped at burst, and forgets the id, so that refunding
// twice gives back once. throttle.All uses it to give back a request that
// another limit rejected. The Hybrid has no Refund: in a throttle.All it
// may be the one part that cannot give back, which is asked last.
//
// # Pause
//
// Pause(ctx, key, d) on Local, Redis and Hybrid makes every decision for
// key a rejection for d (throttle.Pauser): Remaining 0, a RetryAfter of at
// least the time left of the pause (the refill's wait when longer),
// nothing taken and nothing reserved; a longer pause extends, a shorter
// one never shortens. Consumers call it, through throttle.Gate.Pause, when
// a partner answers 429 (natsthrottle.Backoff, asynqthrottle.Backoff).
// Redis keeps the pause in a string key beside the bucket, prefix + "{" +
// escaped key + "}:pause", holding the instant it ends; bucket.lua and
// bucket_id.lua read it with one GET per script call, and it expires when the
// pause ends. A Hybrid sees another process's pause at its next lease call
// on the key, within 500 ms (see Hybrid). Pause refuses d <= 0 with an
// error naming "d".
//
// # Errors
//
// Constructors return errors wrapping throttle.ErrInvalidOption that name
// the field (Rate.Count, Rate.Per, burst, client, or the option); with
// WithQuotas, a decision for a key whose quota is invalid returns one too,
// naming the key. AllowN
// and AllowID return an error wrapping throttle.ErrInvalidCost for n < 1
// or n > burst, before any store access: such a request could never be
// admitted and must not be retried. AllowID returns one wrapping
// throttle.ErrInvalidOption, naming "horizon", for a negative horizon. Redis errors, including timeouts, are wrapped as
// "bucket: redis: ...".
//
// # Redis
//
// Each key's bucket is one string of 25 bytes under prefix + "{" +
// escaped key + "}" (default prefix "throttle:bucket:"): the byte 1, then
// its credit in integer units at ts, ts in µs since the Unix epoch, and
// the period per it is counted in, as little-endian doubles (exact up to
// 2^53; see Redis). Binary because Lua's struct reads and writes it at a
// fraction of the cost of parsing and formatting text.
//
// Upgrading: earlier versions stored a bucket as the text "credit ts per"
// or, before that, as a hash {tokens, ts, per}. Both are read and
// replaced at the next write, so the upgrade keeps every bucket (until
// then each read of a hash counts in Redis's INFO errorstats as a
// WRONGTYPE reply, which the script catches). An older process, though,
// fails with WRONGTYPE on a key a newer one wrote: stop the older
// processes before starting newer ones, or give the newer ones their own
// WithPrefix (their buckets start full). A key of another type, or a hash
// or string not of these forms (another program's key under the prefix),
// is a WRONGTYPE error: never read as a full bucket, never overwritten.
//
// The key sits inside a Redis Cluster hash tag, escaped so that no key
// can break out of the tag or collide with another: "" becomes "%E"; '%',
// '{' and '}' become "%25", "%7B" and "%7D"; a key longer than 256 bytes
// becomes "%H" + its hex SHA-256. The key expires when the bucket would be
// full again.
//
// Redis Cluster: NewRedis and NewHybrid take a redis.Scripter, which
// *redis.Client, *redis.ClusterClient and *redis.Ring all satisfy. Each
// script touches only the keys of one identity (its bucket, ids and pause,
// all in one slot), so it runs on the
// master of that key's slot and can never fail with CROSSSLOT. If a
// master is down, only the keys in its slots fail: Redis.AllowN returns
// an error for them and the throttle.Gate's failure policy decides; the
// Hybrid keeps one circuit breaker per master, so only those keys go to
// its degraded mode. Run the cluster with cluster-require-full-coverage no if
// the other masters' keys should keep working meanwhile: with the
// default, every node refuses every key once the cluster notices.
//
// The Lua scripts read the Redis server's TIME by default, so every
// process shares one clock; WithClock makes the client send its own time
// instead (for tests, or for services that forbid TIME). Either way stored
// time never moves backwards.
//
// # Lost buckets
//
// A missing key reads as a full bucket, so a bucket Redis lost (FLUSHALL,
// a restart without persistence, eviction, a failover to a replica that
// lacked it) would hand out a second burst. [Redis] (and the Hybrid,
// through it) remembers, per key (up to 100,000 keys), until when the
// bucket is short of full, from the credit and instant every reply
// carries: no script shortens a key's life (a give-back or refund keeps
// its expiry), so the key must exist until then. bucket.lua and
// bucket_id.lua take that instant, and a key missing before it, while not
// paused, was lost: the bucket starts empty at now instead of full,
// written so that every process sees it. A brand-new key costs nothing.
// What a loss can still cost: a process that has not decided on the key
// since it was last full cannot tell, a partial loss (a replica a few
// writes behind, appendfsync everysec) leaves an older bucket, and a
// Reset in another process or a quota change can make a bucket look lost
// (it then starts empty: never more tokens). Bound partial losses with
// persistence or WAIT, as for windows (see the window package). With
// WithClock the check is off, as for windows.
//
// # Coalescing
//
// Redis.AllowN and the Hybrid's lease calls are coalesced as the window's
// (see package window): a lone call goes at once; while calls are in
// flight, the others queue and the next flush sends them together, each
// key's requests in arrival order, decided one after another at one
// instant (a bucket from which nothing is taken is not written): one
// bucket.lua call for every key of the flush on a *redis.Client, one per
// key, pipelined, on a *redis.ClusterClient, a *redis.Ring or any other
// client, and on a *redis.Client once a server refuses keys of several
// cluster slots in one call (CROSSSLOT, as a proxy in front of a cluster
// does; nothing ran, so the flush is sent again key by key). WithTimeout bounds the round trip of a call or flush, not the
// time queued behind it, which only the caller's context bounds; a caller
// that leaves while queued is charged nothing. AllowID (bucket_id.lua) is
// one script call per decision. [Redis.AllowBatch] (throttle.BatchLimiter)
// decides a caller's many requests as AllowN one after another, on its own
// goroutine, in one script call per 256 requests (per key on a cluster),
// without the queue.
//
// # Timeouts
//
// Every Redis call carries a deadline of WithTimeout (default 50 ms). go-redis
// only honours context deadlines on clients built with
// ContextTimeoutEnabled: true:
//
//	client := redis.NewClient(&redis.Options{
//		Addr:                  "localhost:6379",
//		ContextTimeoutEnabled: true, // required for WithTimeout to bound calls
//	})
//
// Without it a hung Redis would block a decision for the client's
// ReadTimeout (default 5 s) instead, so NewRedis and NewHybrid refuse a
// *redis.Client, *redis.ClusterClient or *redis.Ring without it unless its
// ReadTimeout and WriteTimeout are both within WithTimeout.
package bucket

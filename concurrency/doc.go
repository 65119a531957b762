// Package concurrency implements in-flight limits: at most limit ids
// (message ids, task ids, worker ids) hold a slot of a key at once, each
// until it releases the slot or its lease runs out. [Redis] keeps the
// slots in Redis, shared by every process that uses the same Redis;
// [Memory] is its in-process twin with the same semantics, for one process
// and for tests.
//
// Where a rate limit (packages window and bucket) bounds how many jobs
// start per period, an in-flight limit bounds how many run at once,
// whatever they take: the shape of a downstream that allows N open
// connections or N concurrent requests.
//
// # Rules
//
// Acquire(key, id, lease) admits id if it already holds a slot of key (its
// lease is then renewed: Acquire is idempotent and never takes a second
// slot) or if fewer than limit ids hold one; otherwise it rejects, taking
// nothing. Renew(key, id, lease) moves the end of a held lease to lease
// from now. Release(key, id) frees the slot.
//
// A slot is held until it is released or its lease ends: a lease ending
// at instant e is held at e-1µs and free at e, so a holder that died is
// reclaimed when its lease ends, never earlier. Time is kept in whole
// microseconds and a lease is rounded up to a whole microsecond. Pick a
// lease longer than the longest job and Renew it from long jobs; a job
// that outlives its lease has lost its slot (Renew says so with
// [ErrNotHeld]) and another may take it.
//
// The Decision of an Acquire: Limit is limit; Remaining is the slots free
// after the call; ResetAfter is the time until the last lease of the key
// ends (Remaining is then limit if nothing else is acquired); a
// rejection's RetryAfter is the time until the earliest lease ends. That
// RetryAfter is an upper bound, since a holder may Release sooner, and
// like every duration of a Decision it is rounded up to the millisecond;
// it is never 0 and never negative.
//
// This is the concurrent limiter of Sidekiq Enterprise
// (Sidekiq::Limiter.concurrent, whose lock_timeout is the lease) and the
// Redis counting semaphore with timed-out holders of "Redis in Action"
// (§6.3): a sorted set of holders scored by time, from which the stale are
// dropped before counting. Here the score is the lease deadline rather
// than the acquisition time, so each holder may carry its own lease and
// renew it.
//
// # Errors
//
// A lease <= 0 (or longer than 2^52 µs, about 142 years) is refused with
// an error wrapping throttle.ErrInvalidCost before any store access: the
// throttle.Gate treats it as a usage error (throttle.IsUsageError), never
// admitted and not to be retried. Renew of an id that holds no slot (never
// acquired, released, or its lease ended) returns an error wrapping
// [ErrNotHeld]. Release of an id that holds no slot is not an error. Redis
// and context errors (including the [WithTimeout] deadline) are wrapped as
// "concurrency: redis: ..." and mean the limiter could not decide. A
// rejection is a Decision with Allowed false, not an error. Constructors
// return errors wrapping throttle.ErrInvalidOption (a *throttle.OptionError
// naming the field: "limit", "client", "WithPrefix", "WithTimeout").
//
// # Redis
//
// Each key is one sorted set: member = the id, as given (any bytes,
// including "" and binary), score = the end of its lease in microseconds
// since the Unix epoch. One Lua script per call (slots.lua, run with
// EVALSHA and reloaded on NOSCRIPT) acquires, renews or releases, after
// dropping the members with score <= now. Beside the holders, the set
// keeps one member "\x00alive" (not a holder, never counted) scored by the
// latest lease end it ever gave, and the key expires then (PEXPIREAT,
// rounded up to the millisecond): a Release never deletes it sooner, and
// nothing is left behind after the last lease. A rejection adds nothing.
//
// Lost slots: a process that was given a lease remembers, per key (up to
// 100,000 keys), until when the set must exist, and passes it with every
// call. A set Redis lost before then (FLUSHALL, a restart without
// persistence, eviction) still has holders, unseen: the first acquire or
// renew to find it gone fills every slot with a placeholder until now +
// lease, so no slot is given beside them (tested: 3 limiters x 8
// goroutines, 5 slots, Redis restarted empty and flushed: at most 5 held,
// 8 without). A brand-new key costs nothing; a process that was given no
// lease within the last lease cannot tell. With WithClock the check is
// off: Redis expires keys on its own time.
// The instant is the Redis server's TIME, so every worker shares one
// clock, unless [WithClock] is given: then the client's time is sent, and
// the script keeps the latest instant used on the key in a second key (the
// key's Redis key + ":clock", in the same slot, expiring with it) and
// clamps later calls to it, so stored time never moves backwards; the
// expiry is then a PEXPIRE of the time left plus 1 ms, since the client's
// clock is not the server's. The expiry runs on the server's clock either
// way, so a client clock must keep real speed (a test clock that stands
// still for longer than a lease sees the key expire).
//
// # Keys
//
// A key maps to the Redis key prefix + "{" + tag + "}" (prefix default
// "throttle:concurrency:", see [WithPrefix]). The braces are a Redis
// Cluster hash tag, so every Redis key of one identity sits in one slot.
// The tag is the key with '%', '{' and '}' escaped as "%25", "%7B" and
// "%7D"; "" becomes "%E", and a key longer than 256 bytes becomes "%H" +
// the hex SHA-256 of it. No key can break out of its tag, and two
// different keys never share a Redis key (except for a SHA-256 collision
// between two long keys).
//
// # Timeouts and Redis Cluster
//
// Every Redis call is bounded by [WithTimeout] (default 50 ms) as a
// context deadline, which go-redis honours only on clients created with
// ContextTimeoutEnabled: true ([NewRedis] refuses a client without it
// unless its ReadTimeout and WriteTimeout are both within the timeout).
// [NewRedis] takes a redis.Scripter, which
// *redis.Client, *redis.ClusterClient and *redis.Ring all satisfy. On a
// Redis Cluster each call is one script run on the master that holds the
// key's slot, and the script touches only the keys of that one slot, so
// no call can fail with CROSSSLOT.
//
// # Memory
//
// A Redis key holds one sorted-set member per id holding a slot, so at
// most limit members. [Memory] holds at most limit ids per key, deletes a
// key when its last slot is released and sweeps keys whose leases have all
// ended; each call scans the ids of its key (O(limit)).
//
// Both limiters are safe for concurrent use.
//
// # Consumers
//
// Both limiters satisfy throttle.InFlightLimiter, which the consumers take
// beside their Gate: natsthrottle.WithInFlight and
// asynqthrottle.WithInFlight acquire a slot for each admitted message with
// the message's id (JetStream: stream name + ":" + stream sequence;
// asynq: the task ID), renew it every third of the lease while the
// handler runs, and release it when the handler is done with the message;
// a message refused a slot goes back to its broker like a rate rejection,
// after the rejection's RetryAfter. See the packages' documentation.
package concurrency

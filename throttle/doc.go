// Package throttle is the vocabulary of queuethrottle: the [Rate] a limiter
// enforces, the [Decision] it returns for one message, the [Limiter]
// interface every algorithm satisfies, and the [Gate] that consumers call.
//
// A Gate turns a key into a Decision: it asks its Limiter, applies the
// [FailurePolicy] when the limiter's store fails, and records one span, one
// decisions-counter increment and one latency sample per decision with
// OpenTelemetry. The package imports the standard library and the
// OpenTelemetry API only; limiters live in the window and bucket packages and
// broker adapters under consumers/.
//
// # Scheduled admission
//
// A limiter that implements [IDLimiter] decides requests by identity. A
// Gate built with [WithReservations] asks it through [Gate.AdmitID]: a
// rejected message then reserves its own future slot (Decision.Reserved),
// goes back to its broker once with exactly the delay to that slot, and is
// admitted on its reservation when it comes back; an id already admitted
// is never charged twice. Without reservations AdmitID is still
// idempotent. This follows golang.org/x/time/rate's Reservation for token
// buckets, and for the sliding window log places each reservation at the
// earliest instant that keeps every window within the limit.
//
// # Stacked limits
//
// [All] stacks limits: a request is admitted only if every [Part] admits
// it (a tenant's window AND a partner API's global quota AND one
// endpoint's), each part asked with its own key. Parts that implement
// [Refunder] are charged under an id unique to the request, and when one
// part rejects, what the others charged is given back by that id, so a
// rejected request consumes nothing and no part is ever over its own
// limit. Parts that implement [JointLimiter] (Redis windows on one client
// and slot) are decided together in one atomic script call instead.
// RetryAfter is the largest of the rejecting parts'; Limit and Remaining
// are the tightest part's.
//
// # Pause
//
// A limiter that implements [Pauser] can stop admitting one key for a
// while: [Gate.Pause] pauses the key in every process sharing the
// limiter's store, and until the pause ends every decision for it is a
// rejection with a RetryAfter of at least the time left. The consumers'
// Backoff helpers (natsthrottle.Backoff, asynqthrottle.Backoff) call it
// when a handler reports that the partner answered 429 with a
// Retry-After, the feedback BullMQ's rateLimit(ms) gives. With [WithAIMD]
// a pause also halves the key's limit in an [AIMD], which grows it back by
// a step per Per (a QuotaFunc for the limiter): fewer 429s from a partner
// whose quota is below the configured limit, at some cost in throughput
// (see TestAIMDHiddenQuota for figures).
//
// # Batches
//
// A limiter that implements [BatchLimiter] decides many requests in one
// call, as AllowN one after another, for callers that hold them at once
// (a JetStream Fetch of many tenants' messages). Its error is a
// *[BatchError] when only some of them could not be decided.
package throttle

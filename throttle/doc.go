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
package throttle

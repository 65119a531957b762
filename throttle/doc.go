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
package throttle

package throttle

import (
	"context"
	"fmt"
)

// Request is one request of a batch (see BatchLimiter): cost N for Key.
type Request struct {
	Key string
	N   int
}

// BatchLimiter is an optional Limiter capability for callers that hold
// many requests at once (a JetStream Fetch of many tenants' messages, a
// scheduler's tick): AllowBatch decides them together, on the caller's
// goroutine, in as few store round trips as the store allows.
// window.Redis and bucket.Redis have it.
//
// Concurrent AllowN calls are coalesced anyway (see window.Redis); a batch
// skips what coalescing costs per request (a queued call, a goroutine to
// wake) and fills each script call: on 1,024 keys a decision in batches
// of 16 to 64 cost 0.45 to 0.7 of a coalesced AllowN's from 16 goroutines
// (BenchmarkRedisWindowBatch and BenchmarkRedisBucketBatch; see the
// README).
type BatchLimiter interface {
	Limiter
	// AllowBatch decides reqs as AllowN would, one after another in order
	// (a key present several times sees its earlier requests), and returns
	// one Decision per request, in order.
	//
	// Errors: one naming the request (reqs[i]) for a request AllowN would
	// refuse before any store access (wrapping ErrInvalidCost, say), and
	// then nothing is decided; else, when some requests could not be
	// decided (a store failure or timeout, a key the store refuses), a
	// *BatchError with their errors, their Decisions zero and the others
	// decided.
	AllowBatch(ctx context.Context, reqs []Request) ([]Decision, error)
}

// BatchError is AllowBatch's error when some of its requests could not be
// decided. Errs holds one error per request, nil for those decided.
// errors.Is and errors.As see every one of them.
type BatchError struct {
	Errs []error
}

func (e *BatchError) Error() string {
	failed, first := 0, -1
	for i, err := range e.Errs {
		if err != nil {
			failed++
			if first < 0 {
				first = i
			}
		}
	}
	if first < 0 {
		return "throttle: batch: no request failed"
	}
	return fmt.Sprintf("throttle: batch: %d of %d requests not decided; reqs[%d]: %v", failed, len(e.Errs), first, e.Errs[first])
}

// Unwrap returns the requests' errors, for errors.Is and errors.As.
func (e *BatchError) Unwrap() []error { return e.Errs }

// NewBatchError returns a *BatchError for errs (one per request), or nil
// when every one of them is nil.
func NewBatchError(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return &BatchError{Errs: errs}
		}
	}
	return nil
}

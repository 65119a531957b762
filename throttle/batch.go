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
// wake) and fills each script call, so a decision costs less (figures in
// docs/scheduling.md, Batches). It is the limiter's own call: the Gate does not use it, so
// its decisions get no span, metric or failure policy, and a caller that
// needs them uses Gate.Admit per request. Each AllowBatch call holds a
// pooled connection of its own, beside the limiter's coalesced calls: size
// the client's pool for the batches made at once.
type BatchLimiter interface {
	Limiter
	// AllowBatch decides reqs as AllowN would, one after another in order
	// (a key present several times sees its earlier requests), and returns
	// one Decision per request, in order.
	//
	// Errors: one naming the request (reqs[i]) for a request AllowN would
	// refuse before any store access (wrapping ErrInvalidCost, say), and
	// then nothing is decided; else, when some requests could not be
	// decided (a store failure or timeout, a key the store refuses, an
	// ended ctx), a *BatchError with their errors, their Decisions zero
	// and the others decided. As with AllowN, a request that failed with a
	// timeout or ctx's error may still have been applied (its reply was
	// lost): do not admit it on the failure policy's word alone where
	// admitting twice matters. Once the store could not be reached in time,
	// or ctx ended, the requests not yet sent are not sent and get that
	// error.
	AllowBatch(ctx context.Context, reqs []Request) ([]Decision, error)
}

// BatchError is AllowBatch's error when some of its requests could not be
// decided. Errs holds one error per request, nil for those decided (a
// timeout may still have been applied: see BatchLimiter). errors.Is and
// errors.As see every one of them.
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

package throttle

import (
	"context"
	"time"
)

// InFlightLimiter is an in-flight limit: at most a fixed number of ids
// hold a slot of a key at once, each until it releases the slot or its
// lease ends. The consumers take one beside the Gate, so that at most
// that many handlers of a key run at once, across every process sharing
// the limiter's store. Package concurrency implements it (concurrency.Redis
// and concurrency.Memory); throttle does not import it.
//
// Acquire gives id a slot of key for lease (renewing it when id already
// holds one) or rejects with a Decision whose RetryAfter is the time until
// the earliest lease of the key ends; Renew moves the end of id's lease to
// lease from now, and errs when id holds no slot; Release frees the slot,
// and releasing a slot not held is not an error. An error means the
// limiter could not decide (or, for Renew, that the slot is lost). An
// implementation must be safe for concurrent use.
type InFlightLimiter interface {
	Acquire(ctx context.Context, key, id string, lease time.Duration) (Decision, error)
	Renew(ctx context.Context, key, id string, lease time.Duration) error
	Release(ctx context.Context, key, id string) error
}

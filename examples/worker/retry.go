package main

import (
	"context"
	"time"
)

// Backoff of the publisher between attempts to hand over one job.
const (
	retryFirstWait = 100 * time.Millisecond
	retryMaxWait   = time.Second
)

// retry calls attempt until it returns nil or ctx is done, waiting 100 ms,
// 200 ms, ... up to 1 s between attempts, and returns the number of
// failed attempts and, if ctx ended first, ctx's error joined to nothing
// else (the last failure went to failed). failed, if not nil, sees each
// failure with its attempt number (1 for the first).
//
// The publisher retries this way so that no job is lost to a broker that
// is down for a while (kill-redis, restart-nats): a resend is safe, since
// every job carries its id (Nats-Msg-Id, asynq TaskID) and the broker
// refuses a second copy.
func retry(ctx context.Context, attempt func(ctx context.Context, n int) error, failed func(n int, err error)) (int, error) {
	wait := retryFirstWait
	for n := 1; ; n++ {
		err := attempt(ctx, n)
		if err == nil {
			return n - 1, nil
		}
		if ctx.Err() != nil {
			return n - 1, ctx.Err()
		}
		if failed != nil {
			failed(n, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return n, ctx.Err()
		}
		wait = min(2*wait, retryMaxWait)
	}
}

package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// redisLog is go-redis's logger for a run (redis.SetLogger). go-redis logs
// every failed dial of its pools, dozens a second while Redis is down
// (kill-redis), which buried the worker's own lines: this prints at most
// one line per interval, saying how many it left out.
type redisLog struct {
	out io.Writer

	mu      sync.Mutex
	every   rate.Sometimes
	skipped int
}

func newRedisLog(out io.Writer, interval time.Duration) *redisLog {
	return &redisLog{out: out, every: rate.Sometimes{Interval: interval}}
}

// Printf implements go-redis's internal.Logging.
func (l *redisLog) Printf(_ context.Context, format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	printed := false
	l.every.Do(func() {
		printed = true
		msg := fmt.Sprintf(format, v...)
		if l.skipped > 0 {
			msg = fmt.Sprintf("%s (and %d more go-redis lines since the last one shown)", msg, l.skipped)
		}
		fmt.Fprintf(l.out, "redis: %s %s\n", time.Now().Format("15:04:05.000"), msg)
		l.skipped = 0
	})
	if !printed {
		l.skipped++
	}
}

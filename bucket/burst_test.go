package bucket

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/hog"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/throttle/throttletest"
)

// TestBurstAtDefaultTimeout is window's: 500 goroutines on one key at
// once, beside two CPU-bound goroutines and two CPU-bound processes, at
// the default timeout (50 ms), on a limiter whose client has just been
// created and which has made one call: no call may fail, and exactly the
// burst is admitted. Without the connections NewRedis opens, the burst's
// second call in flight dialed inside its timeout.
func TestBurstAtDefaultTimeout(t *testing.T) {
	srv := redistest.Shared(t)
	hog.Start(t, 2)
	r := throttle.Rate{Count: 1, Per: time.Hour}
	const burst = 100
	for run := range 5 {
		t.Run("run"+strconv.Itoa(run), func(t *testing.T) {
			l, err := NewRedis(srv.Client(t), r, burst, WithPrefix(freshPrefix()))
			if err != nil {
				t.Fatal(err)
			}
			// The call a service has made before its burst (not the
			// subject here: retried).
			for try := 1; ; try++ {
				if _, err := l.Allow(context.Background(), "first"); err == nil {
					break
				} else if try == 3 {
					t.Fatalf("the first call failed 3 times, the last: %v", err)
				}
			}
			if admitted := throttletest.Burst(t, l, "hot", 500); admitted != burst {
				t.Fatalf("%d admitted of 500 with a burst of %d and no refill to speak of, want exactly %d", admitted, burst, burst)
			}
		})
	}
}

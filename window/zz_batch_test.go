package window

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
)

func TestZZBatchSize(t *testing.T) {
	server := redistest.Start(t)
	client, admin := server.Client(t), server.Client(t)
	for _, nkeys := range []int{1, 10000} {
		keys := make([]string, nkeys)
		for i := range keys {
			keys[i] = "user-" + strconv.Itoa(i)
		}
		l, err := NewRedis(client, benchRate, WithTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for _, k := range keys {
			l.Allow(ctx, k)
		}
		admin.ConfigResetStat(ctx)
		var n atomic.Int64
		var wg sync.WaitGroup
		stop := time.Now().Add(time.Second)
		for g := 1; g <= 16; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				i := g * 97
				for time.Now().Before(stop) {
					l.Allow(ctx, keys[i%len(keys)])
					i++
					n.Add(1)
				}
			}()
		}
		wg.Wait()
		s := admin.Info(ctx, "commandstats").Val()
		for _, line := range strings.Split(s, "\n") {
			if strings.Contains(line, "evalsha") {
				c, _ := strconv.Atoi(strings.TrimPrefix(strings.Split(line, ",")[0], "cmdstat_evalsha:calls="))
				t.Logf("keys %d: %d decisions, %d calls, %.1f per call; %s", nkeys, n.Load(), c, float64(n.Load())/float64(c), line)
			}
		}
	}
}

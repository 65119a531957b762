package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// giveBackOnly hides a Redis window's AllowJoint, so that All takes the
// charge-and-give-back path over the same windows.
type giveBackOnly struct {
	throttle.Refunder
	peek peeker
}

func (g giveBackOnly) Peek(ctx context.Context, key string, n int) (throttle.Decision, error) {
	return g.peek.Peek(ctx, key, n)
}

// BenchmarkAll stacks three limits on one key set (a tenant's, a global
// one and an endpoint's), each Count per Per: "admit" admits every call
// (1<<40 per ms), "reject" rejects every call at the last part after the
// first (the others' charges given back, or nothing charged in one
// script). In memory, on Redis windows in one script, and on the same
// windows charged one by one; BenchmarkAllOnePart is one Redis window
// alone, for the ratio.
func BenchmarkAll(b *testing.B) {
	client := redistest.Shared(b).Client(b)
	ctx := context.Background()
	keys := []func(string) string{nil, global, func(string) string { return "/search" }}
	for _, tc := range []struct{ name, store string }{
		{"memory", "memory"}, {"redis-one-script", "redis"}, {"redis-give-back", "give-back"},
	} {
		for _, reject := range []bool{false, true} {
			name := tc.name + "/admit"
			if reject {
				name = tc.name + "/reject"
			}
			b.Run(name, func(b *testing.B) {
				var parts []throttle.Part
				for i, k := range keys {
					r := throttle.Rate{Count: 1 << 40, Per: time.Millisecond}
					if reject && i == len(keys)-1 {
						r = throttle.Rate{Count: 1, Per: time.Hour}
					}
					var l throttle.Limiter
					switch tc.store {
					case "memory":
						m, err := window.NewMemory(r)
						if err != nil {
							b.Fatal(err)
						}
						l = m
					default:
						w, err := window.NewRedis(client, r, window.WithPrefix(redistest.Prefix("allbench")), window.WithTimeout(redistest.CallTimeout))
						if err != nil {
							b.Fatal(err)
						}
						l = w
						if tc.store == "give-back" {
							l = giveBackOnly{w, w}
						}
					}
					parts = append(parts, throttle.Part{Limiter: l, Key: k})
				}
				lim, err := throttle.All(parts...)
				if err != nil {
					b.Fatal(err)
				}
				if reject { // fill the last part
					if _, err := lim.AllowN(ctx, "tenant", 1); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				for b.Loop() {
					d, err := lim.AllowN(ctx, "tenant", 1)
					if err != nil || d.Allowed == reject {
						b.Fatal(d, err)
					}
				}
			})
		}
	}
}

func BenchmarkAllOnePart(b *testing.B) {
	client := redistest.Shared(b).Client(b)
	ctx := context.Background()
	w, err := window.NewRedis(client, throttle.Rate{Count: 1 << 40, Per: time.Millisecond}, window.WithPrefix(redistest.Prefix("allbench")), window.WithTimeout(redistest.CallTimeout))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := w.AllowN(ctx, "tenant", 1); err != nil {
			b.Fatal(err)
		}
	}
}

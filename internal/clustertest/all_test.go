package clustertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/queuethrottle/queuethrottle/bucket"
	"github.com/queuethrottle/queuethrottle/internal/redistest"
	"github.com/queuethrottle/queuethrottle/throttle"
	"github.com/queuethrottle/queuethrottle/window"
)

// TestClusterAll stacks limits on a three-master cluster: two windows of
// one key (different prefixes, one hash slot) go in one script, and
// parts whose keys lie in different slots (a tenant and a global key) are
// charged one by one and given back; either way no CROSSSLOT error and
// exactly the stacked limit admitted.
func TestClusterAll(t *testing.T) {
	ctx := context.Background()
	c := redistest.StartCluster(t)
	client := c.Client(t)
	newWindow := func(count int, prefix string) *window.Redis {
		w, err := window.NewRedis(client, throttle.Rate{Count: count, Per: time.Minute}, window.WithPrefix(prefix), window.WithTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	perMinute, perHour := newWindow(5, "all:min:"), newWindow(3, "all:hour:")
	if _, ok, err := perMinute.AllowJoint(ctx, []throttle.Limiter{perMinute, perHour}, []string{"t", "t"}, 1); err != nil || !ok {
		t.Fatalf("AllowJoint, one slot: ok %v, %v; want the one-script path", ok, err)
	}
	if _, ok, err := perMinute.AllowJoint(ctx, []throttle.Limiter{perMinute, perHour}, []string{"t", "global"}, 1); err != nil || ok {
		t.Fatalf("AllowJoint, two slots: ok %v, %v; want not ok", ok, err)
	}
	global, err := bucket.NewRedis(client, throttle.Rate{Count: 4, Per: time.Hour}, 4, bucket.WithPrefix("all:global:"), bucket.WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		parts []throttle.Part
		key   string
		want  int
	}{
		// One unit went to "t" in the AllowJoint call above: 3 - 1 left.
		{name: "one script", parts: []throttle.Part{{Limiter: perMinute}, {Limiter: perHour}}, key: "t", want: 2},
		{name: "give-back", parts: []throttle.Part{{Limiter: newWindow(2, "all:tenant:")}, {Limiter: global, Key: func(string) string { return "global" }}}, key: "u", want: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lim, err := throttle.All(tc.parts...)
			if err != nil {
				t.Fatal(err)
			}
			admitted := 0
			for range 6 {
				d, err := lim.AllowN(ctx, tc.key, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					admitted++
				}
			}
			if admitted != tc.want {
				t.Fatalf("%d admitted, want %d", admitted, tc.want)
			}
		})
	}
	// The give-back case's rejections took nothing from the global bucket:
	// 4 - 2 tokens left.
	if d, err := global.AllowN(ctx, "global", 2); err != nil || !d.Allowed {
		t.Fatalf("global bucket: %+v, %v; want 2 tokens left", d, err)
	}
}

package throttletest

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Sums collects r and returns the data points of the Int64 sum (a
// counter) named name, added up by the values of keys joined with "/"
// (an attribute a point lacks reads as "-"), such as
// Sums(t, r, throttle.DispositionsMetric, throttle.KeyAttr,
// throttle.DispositionAttr)["acme/wait"].
func Sums(t testing.TB, r *sdkmetric.ManualReader, name string, keys ...attribute.Key) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != name || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				vals := make([]string, len(keys))
				for i, k := range keys {
					vals[i] = "-"
					if v, ok := dp.Attributes.Value(k); ok {
						vals[i] = v.String()
					}
				}
				got[strings.Join(vals, "/")] += dp.Value
			}
		}
	}
	return got
}

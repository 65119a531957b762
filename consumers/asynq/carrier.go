package asynqthrottle

import (
	"strings"

	"go.opentelemetry.io/otel/propagation"
)

// headerCarrier reads task headers for extraction. It never writes (task
// headers are shared with asynq and may be nil), and Get matches a key
// exactly first, then whatever its case, so "Traceparent" written by an
// HTTP-style carrier is found too.
type headerCarrier map[string]string

var _ propagation.TextMapCarrier = headerCarrier(nil)

func (c headerCarrier) Get(key string) string {
	if v, ok := c[key]; ok {
		return v
	}
	found, value := "", ""
	for k, v := range c {
		if strings.EqualFold(k, key) && (found == "" || k < found) {
			found, value = k, v
		}
	}
	return value
}

// Set does nothing: the headers of a task being processed are read-only.
func (headerCarrier) Set(string, string) {}

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

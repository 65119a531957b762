package natsthrottle

import (
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
)

// HeaderCarrier adapts nats.Header to propagation.TextMapCarrier. Unlike
// propagation.HeaderCarrier over http.Header, it never changes the case of
// a key: Set writes the key exactly as given, and Get matches a key
// whatever its case (an exact match first), so a `traceparent` written by
// any producer, `Traceparent` by Go's HTTP-style carrier or `traceparent`
// by others, is found.
//
// A nil HeaderCarrier reads as empty, and Set on it does nothing. A
// HeaderCarrier is not safe for concurrent writes, like the map it wraps.
type HeaderCarrier nats.Header

var _ propagation.TextMapCarrier = HeaderCarrier(nil)

// Get returns the first value of key, matched exactly if present, else
// case-insensitively (the smallest such key, so the result is
// deterministic), or "" if there is none.
func (c HeaderCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	var found string
	var value string
	for k, v := range c {
		if len(v) == 0 || !strings.EqualFold(k, key) {
			continue
		}
		if found == "" || k < found {
			found, value = k, v[0]
		}
	}
	return value
}

// Set sets key, in exactly the case given, to the single value, and
// removes any other-case variants of key so the header holds one. Set on a
// nil HeaderCarrier does nothing.
func (c HeaderCarrier) Set(key, value string) {
	if c == nil {
		return
	}
	for k := range c {
		if k != key && strings.EqualFold(k, key) {
			delete(c, k)
		}
	}
	c[key] = []string{value}
}

// Keys returns the header's keys as stored.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

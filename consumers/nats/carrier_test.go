package natsthrottle

import (
	"slices"
	"testing"

	"github.com/nats-io/nats.go"
)

func TestHeaderCarrierGet(t *testing.T) {
	tests := []struct {
		name string
		hdr  nats.Header
		key  string
		want string
	}{
		{"nil", nil, "traceparent", ""},
		{"exact", nats.Header{"traceparent": {"a"}}, "traceparent", "a"},
		{"canonical", nats.Header{"Traceparent": {"b"}}, "traceparent", "b"},
		{"upper", nats.Header{"TRACEPARENT": {"c"}}, "traceparent", "c"},
		{"exact wins", nats.Header{"Traceparent": {"b"}, "traceparent": {"a"}}, "traceparent", "a"},
		{"smallest variant", nats.Header{"Traceparent": {"b"}, "TraceParent": {"x"}}, "traceparent", "x"},
		{"empty values skipped", nats.Header{"traceparent": {}, "Traceparent": {"b"}}, "traceparent", "b"},
		{"first value", nats.Header{"tracestate": {"1", "2"}}, "TraceState", "1"},
		{"missing", nats.Header{"other": {"x"}}, "traceparent", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := HeaderCarrier(tt.hdr).Get(tt.key); got != tt.want {
				t.Errorf("Get(%q) = %q, want %q", tt.key, got, tt.want)
			}
		})
	}
}

func TestHeaderCarrierSet(t *testing.T) {
	hdr := nats.Header{"Traceparent": {"old"}, "TRACEPARENT": {"older"}, "Other": {"x"}}
	c := HeaderCarrier(hdr)
	c.Set("traceparent", "new")
	if got := hdr["traceparent"]; len(got) != 1 || got[0] != "new" {
		t.Errorf("traceparent = %v, want [new]", got)
	}
	keys := c.Keys()
	slices.Sort(keys)
	if want := []string{"Other", "traceparent"}; !slices.Equal(keys, want) {
		t.Errorf("Keys = %v, want %v", keys, want)
	}
	HeaderCarrier(nil).Set("traceparent", "x") // no panic
	if k := HeaderCarrier(nil).Keys(); len(k) != 0 {
		t.Errorf("nil Keys = %v", k)
	}
}

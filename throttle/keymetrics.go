package throttle

import (
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// OtherKey is the throttle.key value of the decisions of keys beyond
// WithKeyMetrics' bound, or whose label is "".
const OtherKey = "other"

// MaxKeyMetrics is the largest bound WithKeyMetrics takes.
const MaxKeyMetrics = 10_000

// WithKeyMetrics adds the throttle.key attribute (Prometheus: throttle_key)
// to the Gate's decision metrics (throttle.decisions, whose Prometheus name
// is throttle_decisions_total, and throttle.decision.duration), so that a
// dashboard shows who is admitted, rejected or reserved. Off by default:
// every key would be a series of its own.
//
// label maps a key to its value (nil: the key itself, as given). The
// first max distinct values (1 to MaxKeyMetrics) are kept, in the order
// their decisions come; every later one, and "", counts as OtherKey, so
// the attribute never has more than max + 1 values. Spans always carry
// the key itself. label must be fast and safe for concurrent use.
//
// Errors wrap ErrInvalidOption, naming WithKeyMetrics: max out of range.
func WithKeyMetrics(label func(key string) string, max int) Option {
	return optionFunc(func(c *gateConfig) error {
		if max < 1 || max > MaxKeyMetrics {
			return &OptionError{Field: "WithKeyMetrics", Reason: fmt.Sprintf("max must be 1 to %d, got %d", MaxKeyMetrics, max)}
		}
		c.keyMetrics = &keyMetrics{label: label, max: max, sets: map[string]*keySets{}}
		return nil
	})
}

// keyMetrics holds the metric options of each key label seen, up to max.
type keyMetrics struct {
	label func(string) string
	max   int

	mu    sync.RWMutex
	sets  map[string]*keySets
	other *keySets
}

// keySets are the decision metrics' options of one key label, by outcome
// and source.
type keySets struct {
	name   string // the throttle.key value
	add    [3][SourceDegraded + 1][]metric.AddOption
	record [3][SourceDegraded + 1][]metric.RecordOption
}

func newKeySets(label string) *keySets {
	ks := &keySets{name: label}
	for outcome, name := range outcomes {
		for s := SourceUnknown; s <= SourceDegraded; s++ {
			set := metric.WithAttributeSet(attribute.NewSet(OutcomeAttr.String(name), SourceAttr.String(s.String()), KeyAttr.String(label)))
			ks.add[outcome][s] = []metric.AddOption{set}
			ks.record[outcome][s] = []metric.RecordOption{set}
		}
	}
	return ks
}

// labelOf returns key's label (before the bound).
func (m *keyMetrics) labelOf(key string) string {
	label := key
	if m.label != nil {
		label = m.label(key)
	}
	return label
}

// of returns the options of key's label: its own while fewer than max
// labels have been seen, else OtherKey's.
func (m *keyMetrics) of(key string) *keySets {
	label := m.labelOf(key)
	if label == "" || label == OtherKey {
		return m.others()
	}
	m.mu.RLock()
	ks, ok := m.sets[label]
	m.mu.RUnlock()
	if ok {
		return ks
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if ks, ok := m.sets[label]; ok {
		return ks
	}
	if len(m.sets) >= m.max {
		return m.othersLocked()
	}
	ks = newKeySets(label)
	m.sets[label] = ks
	return ks
}

func (m *keyMetrics) others() *keySets {
	m.mu.RLock()
	ks := m.other
	m.mu.RUnlock()
	if ks != nil {
		return ks
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.othersLocked()
}

func (m *keyMetrics) othersLocked() *keySets {
	if m.other == nil {
		m.other = newKeySets(OtherKey)
	}
	return m.other
}

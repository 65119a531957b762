package quota_test

import (
	"testing"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
)

// TestMain stops the shared redis-server after the tests.
func TestMain(m *testing.M) { redistest.Main(m) }

// freshKey returns a hash key no other test uses.
func freshKey() string { return redistest.Prefix("quota") + "quotas" }

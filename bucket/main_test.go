package bucket

import (
	"testing"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
)

// TestMain stops the shared redis-server after the tests.
func TestMain(m *testing.M) { redistest.Main(m) }

// freshPrefix returns a key prefix no other limiter of this or an earlier
// test run uses, so tests can share one Redis.
func freshPrefix() string { return redistest.Prefix("bucket") }

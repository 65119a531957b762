package adaptive_test

import (
	"testing"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
)

// TestMain stops the shared redis-server after the tests.
func TestMain(m *testing.M) { redistest.Main(m) }

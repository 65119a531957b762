package bucket

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/queuethrottle/queuethrottle/internal/redistest"
)

// TestMain stops the shared redis-server after the tests.
func TestMain(m *testing.M) { redistest.Main(m) }

var (
	runID     = newRunID()
	prefixSeq atomic.Int64
)

func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// freshPrefix returns a key prefix no other limiter of this or an earlier
// test run uses, so tests can share one Redis.
func freshPrefix() string {
	return fmt.Sprintf("test:bucket:%s:%d:", runID, prefixSeq.Add(1))
}

package redistest

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"
	"time"
)

var (
	runID     = newRunID()
	prefixSeq atomic.Int64
)

func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Prefix returns a key prefix, starting with "test:" and name, that no other
// caller in this or an earlier test run gets, so tests can share a server.
func Prefix(name string) string {
	return "test:" + name + ":" + runID + ":" + strconv.FormatInt(prefixSeq.Add(1), 10) + ":"
}

// CallTimeout is the per-call Redis timeout for limiters in tests of
// decisions rather than of timeouts: generous, so that a loaded 2-core
// machine under the race detector cannot turn a slow reply into a failure.
const CallTimeout = 2 * time.Second

// Package uniqueid names requests uniquely across processes and
// goroutines: a tag, a random 64-bit id per Source in hex, ":", and a
// counter in base 36.
package uniqueid

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"
)

// Source hands out ids. It is safe for concurrent use.
type Source struct {
	prefix string
	seq    atomic.Uint64
}

// New returns a Source whose ids are tag + 16 hex digits + ":" + a
// counter. Its only error is crypto/rand's.
func New(tag string) (*Source, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	return &Source{prefix: tag + hex.EncodeToString(b[:]) + ":"}, nil
}

// Next returns the next id.
func (s *Source) Next() string {
	var buf [48]byte
	b := append(buf[:0], s.prefix...)
	return string(strconv.AppendUint(b, s.seq.Add(1), 36))
}

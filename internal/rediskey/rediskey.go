// Package rediskey maps limiter identities to Redis keys that carry a Redis
// Cluster hash tag: prefix + "{" + escaped identity + "}". Every Redis key
// of one identity then hashes to one cluster slot, and no identity, however
// it is spelled, can break out of its tag or share a key with another.
//
// The escaping is injective:
//
//   - "" becomes "%E";
//   - an identity of up to MaxRaw bytes has '%', '{' and '}' replaced by
//     "%25", "%7B" and "%7D" (every other byte, binary included, as is);
//   - a longer identity becomes "%H" + the hex SHA-256 of it.
//
// A '%' in an escaped short identity is always followed by "25", "7B" or
// "7D", so "%E" and "%H..." never come from a short identity. The tag is
// never empty, so Redis Cluster always hashes the tag rather than the whole
// key.
package rediskey

import (
	"crypto/sha256"
	"encoding/hex"
	"github.com/queuethrottle/queuethrottle/throttle"
	"reflect"
	"strings"
)

// MaxRaw is the longest identity, in bytes, that is kept (escaped) in the
// key; longer ones are replaced by their SHA-256.
const MaxRaw = 256

// Key returns prefix + "{" + the escaped id + "}". The prefix must not
// contain '{' or '}' (see CheckPrefix); Key does not check it.
func Key(prefix, id string) string { return build(prefix, id, nil) }

// KeyAnd returns Key(prefix, id) and that key + suffix, built in one
// allocation (the key is the start of the other).
func KeyAnd(prefix, id string, suffix []byte) (key, suffixed string) {
	s := build(prefix, id, suffix)
	return s[:len(s)-len(suffix)], s
}

func build(prefix, id string, suffix []byte) string {
	var b strings.Builder
	switch {
	case id == "":
		b.Grow(len(prefix) + 4 + len(suffix))
		b.WriteString(prefix)
		b.WriteString("{%E}")
	case len(id) > MaxRaw:
		sum := sha256.Sum256([]byte(id))
		var hx [2 * sha256.Size]byte
		hex.Encode(hx[:], sum[:])
		b.Grow(len(prefix) + 4 + len(hx) + len(suffix))
		b.WriteString(prefix)
		b.WriteString("{%H")
		b.Write(hx[:])
		b.WriteByte('}')
	default:
		extra := 0
		for i := 0; i < len(id); i++ {
			if c := id[i]; c == '%' || c == '{' || c == '}' {
				extra += 2
			}
		}
		b.Grow(len(prefix) + len(id) + extra + 2 + len(suffix))
		b.WriteString(prefix)
		b.WriteByte('{')
		if extra == 0 {
			b.WriteString(id)
		} else {
			for i := 0; i < len(id); i++ {
				switch c := id[i]; c {
				case '%':
					b.WriteString("%25")
				case '{':
					b.WriteString("%7B")
				case '}':
					b.WriteString("%7D")
				default:
					b.WriteByte(c)
				}
			}
		}
		b.WriteByte('}')
	}
	b.Write(suffix)
	return b.String()
}

// CheckPrefix reports whether p can prefix a key: it must not contain '{'
// or '}', which would change the key's hash tag.
func CheckPrefix(p string) bool {
	return strings.IndexByte(p, '{') < 0 && strings.IndexByte(p, '}') < 0
}

// PrefixError returns the error of the WithPrefix option for p, or nil if
// CheckPrefix accepts it.
func PrefixError(p string) error {
	if CheckPrefix(p) {
		return nil
	}
	return &throttle.OptionError{Field: "WithPrefix", Reason: "must not contain '{' or '}' (they would break the Redis Cluster hash tag)"}
}

// Slots is the number of Redis Cluster hash slots.
const Slots = 16384

// Slot returns the Redis Cluster hash slot of the Redis key key, as Redis
// computes it (CLUSTER KEYSLOT): the CRC16 (XMODEM) of its hash tag, the
// text between the first '{' and the next '}' if that is not empty, else
// of the whole key, modulo 16384.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % Slots
}

// NilClient reports whether c is nil or a typed nil such as
// (*redis.Client)(nil), which would satisfy a nil check and panic on use.
func NilClient(c any) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

package rediskey

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

func hexSHA256(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// tag returns the Redis Cluster hash tag of key: the text between the first
// '{' and the next '}', or "" when there is none.
func tag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return ""
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j < 0 {
		return ""
	}
	return key[i+1 : i+1+j]
}

func TestKey(t *testing.T) {
	long := strings.Repeat("k", 10<<10)
	tests := []struct {
		name, id, want string
	}{
		{"plain", "user:42", "p:{user:42}"},
		{"empty", "", "p:{%E}"},
		{"braces", "a{b}c", "p:{a%7Bb%7Dc}"},
		{"percent", "%E", "p:{%25E}"},
		{"binary", "\x00\xff\n", "p:{\x00\xff\n}"},
		{"long", long, "p:{%H" + hexSHA256(long) + "}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Key("p:", tt.id)
			if got != tt.want {
				t.Fatalf("Key(%.40q) = %.80q, want %.80q", tt.id, got, tt.want)
			}
		})
	}
}

func TestKeyInjectiveAndTagged(t *testing.T) {
	ids := []string{"", "%E", "%", "%25", "{", "}", "%7B", "%7D", "{}", "a}b", "a{b", ":",
		"::", "a:b", "\x00", "\xff", strings.Repeat("x", MaxRaw), strings.Repeat("x", MaxRaw+1),
		strings.Repeat("y", MaxRaw+1), "%H" + strings.Repeat("0", 64)}
	seen := map[string]string{}
	for _, id := range ids {
		k := Key("p:", id)
		if prev, ok := seen[k]; ok {
			t.Fatalf("Key(%q) == Key(%q) == %q", id, prev, k)
		}
		seen[k] = id
		tg := tag(k)
		if tg == "" || "p:{"+tg+"}" != k {
			t.Fatalf("Key(%q) = %q: hash tag %q does not span the escaped identity", id, k, tg)
		}
	}
}

func TestCheckPrefix(t *testing.T) {
	for p, want := range map[string]bool{"": true, "a:b:": true, "a{": false, "}": false} {
		if got := CheckPrefix(p); got != want {
			t.Errorf("CheckPrefix(%q) = %v, want %v", p, got, want)
		}
	}
}

func BenchmarkKey(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = Key("throttle:bucket:", "tenant-42")
	}
}

func TestSlot(t *testing.T) {
	// Expected values from CLUSTER KEYSLOT on Redis 7.0.
	tests := []struct {
		key  string
		want int
	}{
		{"", 0},
		{"foo", 12182},
		{"bar", 5061},
		{"123456789", 12739}, // the CRC16/XMODEM check value 0x31C3
		{"foo{}{bar}", 8363}, // empty tag: the whole key
		{"foo{{bar}}zap", 4015},
		{"foo{bar}{zap}", 5061}, // the first tag only
		{"p:{bar}", 5061},
	}
	for _, tt := range tests {
		if got := Slot(tt.key); got != tt.want {
			t.Errorf("Slot(%q) = %d, want %d", tt.key, got, tt.want)
		}
	}
	if a, b := Slot(Key("a:", "x{y}")), Slot(Key("b:", "x{y}")); a != b {
		t.Errorf("one identity under two prefixes in slots %d and %d", a, b)
	}
}

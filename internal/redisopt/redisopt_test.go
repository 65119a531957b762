package redisopt

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/throttle"
)

func TestCheckContextTimeout(t *testing.T) {
	const timeout = 50 * time.Millisecond
	short, long := 20*time.Millisecond, 100*time.Millisecond
	clients := map[string]func(ctx bool, rt, wt time.Duration) any{
		"Client": func(ctx bool, rt, wt time.Duration) any {
			return redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: ctx, ReadTimeout: rt, WriteTimeout: wt})
		},
		"ClusterClient": func(ctx bool, rt, wt time.Duration) any {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: ctx, ReadTimeout: rt, WriteTimeout: wt})
		},
		"Ring": func(ctx bool, rt, wt time.Duration) any {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, ContextTimeoutEnabled: ctx, ReadTimeout: rt, WriteTimeout: wt})
		},
	}
	tests := []struct {
		name   string
		ctx    bool
		rt, wt time.Duration
		ok     bool
	}{
		{"ContextTimeoutEnabled", true, 0, 0, true},
		{"ContextTimeoutEnabled with long timeouts", true, long, long, true},
		{"defaults (5 s)", false, 0, 0, false},
		{"read and write within WithTimeout", false, short, short, true},
		{"read and write equal to WithTimeout", false, timeout, timeout, true},
		{"read above WithTimeout", false, long, short, false},
		{"write above WithTimeout", false, short, long, false},
		{"no deadlines (-1)", false, -1, -1, false},
	}
	for kind, mk := range clients {
		for _, tt := range tests {
			t.Run(kind+"/"+tt.name, func(t *testing.T) {
				c := mk(tt.ctx, tt.rt, tt.wt)
				defer c.(interface{ Close() error }).Close()
				err := CheckContextTimeout(c, timeout)
				if tt.ok {
					if err != nil {
						t.Fatalf("CheckContextTimeout = %v, want nil", err)
					}
					return
				}
				var oe *throttle.OptionError
				if !errors.Is(err, throttle.ErrInvalidOption) || !errors.As(err, &oe) || oe.Field != "client" {
					t.Fatalf("CheckContextTimeout = %v, want an OptionError for field client", err)
				}
				if !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
					t.Fatalf("error %q does not name ContextTimeoutEnabled", err)
				}
			})
		}
	}
	t.Run("unknown client type", func(t *testing.T) {
		if err := CheckContextTimeout(struct{}{}, timeout); err != nil {
			t.Fatalf("CheckContextTimeout(other type) = %v, want nil", err)
		}
	})
}

func TestExplain(t *testing.T) {
	tests := []struct {
		name string
		err  error
		hint string // substring of the hint; "" means no hint
	}{
		{"nil", nil, ""},
		{"not a redis error", errors.New("dial tcp: connection refused"), ""},
		{"context", fmt.Errorf("x: %w", errors.ErrUnsupported), ""},
		{"renamed TIME", proto("ERR Unknown Redis command called from script script: 104ae, on @user_script:1."), "window.WithServerClock()"},
		{"ACL forbids TIME", proto("ERR The user executing the script can't run this command or subcommand script: 104ae, on @user_script:1."), "WithServerClock"},
		{"TIME not allowed", proto("ERR This Redis command is not allowed from script: TIME"), "TIME"},
		{"NOSCRIPT", proto("NOSCRIPT No matching script. Please use EVAL."), "script cache"},
		{"WRONGTYPE", proto("WRONGTYPE Operation against a key holding the wrong kind of value"), "window.WithPrefix"},
		{"no scripting", proto("ERR unknown command 'evalsha', with args beginning with: "), "Lua scripting"},
		{"script error", proto("ERR user_script:12: Script attempted to access nonexistent global variable"), "Redis 7.0"},
		{"other reply", proto("LOADING Redis is loading the dataset in memory"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Explain("window", tt.err)
			var he *HintError
			if tt.hint == "" {
				if got != tt.err {
					t.Fatalf("Explain(%v) = %v, want it unchanged", tt.err, got)
				}
				return
			}
			if !errors.As(got, &he) || !strings.Contains(he.Hint(), tt.hint) || !errors.Is(got, tt.err) {
				t.Fatalf("Explain(%v) = %v, want a HintError wrapping it with %q", tt.err, got, tt.hint)
			}
			if again := Explain("window", fmt.Errorf("w: %w", got)); !strings.Contains(again.Error(), tt.hint) || strings.Count(again.Error(), he.Hint()) != 1 {
				t.Fatalf("Explain twice = %v", again)
			}
		})
	}
}

// proto returns a Redis error reply, as go-redis returns it.
type protoErr string

func (e protoErr) Error() string { return string(e) }
func (protoErr) RedisError()     {}

func proto(s string) error { return protoErr(s) }

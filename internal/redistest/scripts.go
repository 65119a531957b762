package redistest

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Scripts records the script calls (EVAL and EVALSHA) a go-redis client
// sends, alone or in pipelines, through a hook (see RecordScripts). Its
// methods are safe for concurrent use.
type Scripts struct {
	mu    sync.Mutex
	calls []ScriptCall
}

// ScriptCall is one script call a client sent: its KEYS and the error it
// came back with (nil when the script ran and replied).
type ScriptCall struct {
	Keys []string
	Err  error
}

// RecordScripts returns a Scripts that records every script call c sends
// from now on. On a *redis.ClusterClient it sees the calls as the limiter
// makes them (a pipeline once, before the client splits it by node).
func RecordScripts(c interface{ AddHook(redis.Hook) }) *Scripts {
	s := &Scripts{}
	c.AddHook(scriptsHook{s})
	return s
}

// Calls returns the calls recorded so far, in the order they returned.
func (s *Scripts) Calls() []ScriptCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]ScriptCall(nil), s.calls...)
}

// Reset forgets the calls recorded so far.
func (s *Scripts) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = nil
}

// Ran returns the calls recorded so far that succeeded.
func (s *Scripts) Ran() []ScriptCall {
	var ran []ScriptCall
	for _, c := range s.Calls() {
		if c.Err == nil {
			ran = append(ran, c)
		}
	}
	return ran
}

// record records the script calls of cmds, with err if not nil, else
// their own errors.
func (s *Scripts) record(err error, cmds ...redis.Cmder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, cmd := range cmds {
		name := strings.ToLower(cmd.Name())
		if name != "eval" && name != "evalsha" {
			continue
		}
		args := cmd.Args()
		if len(args) < 3 {
			continue
		}
		n, _ := strconv.Atoi(toString(args[2]))
		var keys []string
		for _, k := range args[3:min(3+n, len(args))] {
			keys = append(keys, toString(k))
		}
		e := err
		if e == nil {
			e = cmd.Err()
		}
		s.calls = append(s.calls, ScriptCall{Keys: keys, Err: e})
	}
}

func toString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case int:
		return strconv.Itoa(v)
	}
	return ""
}

type scriptsHook struct{ s *Scripts }

func (h scriptsHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

func (h scriptsHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.s.record(err, cmd) // the client sets cmd's error after its hooks
		return err
	}
}

func (h scriptsHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.s.record(nil, cmds...)
		return err
	}
}

// Package redisscript runs a limiter's Lua script with typed replies
// (integer arrays, read without the generic []any of redis.Script.Run),
// one call or several pipelined, and reloads it on NOSCRIPT.
package redisscript

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/queuethrottle/queuethrottle/internal/deadline"
)

// Script is a Lua script whose reply is an array of integers. The zero
// Script is not usable: create one with New.
type Script struct {
	src, sha       string
	argSrc, argSha any // boxed once
	// loaded is set once a call of the script succeeded (or Warm loaded
	// it): until then it is sent as EVAL, which loads it, rather than as
	// an EVALSHA that a fresh server refuses (NOSCRIPT), saving a round
	// trip on a first call (a far server's first call also dials: every
	// round trip counts).
	loaded atomic.Bool
}

// New returns the script of source src.
func New(src string) *Script {
	h := sha1.Sum([]byte(src))
	sha := hex.EncodeToString(h[:])
	return &Script{src: src, sha: sha, argSrc: src, argSha: sha}
}

// Hash returns the script's SHA1, as EVALSHA takes it.
func (s *Script) Hash() string { return s.sha }

var (
	argEvalSha any = "evalsha"
	argEval    any = "eval"
)

// Start appends to args the head of an EVALSHA of the script: the command
// and the hash. The caller appends numkeys, the keys and ARGV.
func (s *Script) Start(args []any) []any { return append(args, argEvalSha, s.argSha) }

// processor is what a client needs for typed replies (a *redis.Client,
// *redis.ClusterClient, *redis.Ring or go-redis's AutoPipeliner).
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// pipeliner is what a client needs to send several script calls at once.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// Run sends cmd (built on Start) on c, and again as an EVAL if the server
// does not have the script (NOSCRIPT: the script cache was flushed or the
// server restarted), which also loads it.
func (s *Script) Run(ctx context.Context, c redis.Scripter, cmd *redis.IntSliceCmd) error {
	if !s.loaded.Load() {
		s.asEval(cmd)
	}
	err := s.process(ctx, c, cmd)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		s.asEval(cmd)
		err = s.process(ctx, c, cmd)
	}
	if err == nil && !s.loaded.Load() {
		s.loaded.Store(true)
	}
	return err
}

func (s *Script) process(ctx context.Context, c redis.Scripter, cmd *redis.IntSliceCmd) error {
	if p, ok := c.(processor); ok {
		return p.Process(ctx, cmd)
	}
	// Any other redis.Scripter: the generic reply, converted.
	args := cmd.Args()
	nkeys, _ := strconv.Atoi(args[2].(string))
	keys := make([]string, 0, nkeys)
	for _, k := range args[3 : 3+nkeys] {
		keys = append(keys, k.(string))
	}
	var res *redis.Cmd
	if args[0] == argEval {
		res = c.Eval(ctx, s.src, keys, args[3+nkeys:]...)
	} else {
		res = c.EvalSha(ctx, s.sha, keys, args[3+nkeys:]...)
	}
	vals, err := res.Int64Slice()
	cmd.SetVal(vals)
	cmd.SetErr(err)
	return err
}

// RunTimed is Run, recording the call's round trip in rt, and its
// reply's last integer as the server's instant (µs since the Unix epoch:
// the admission scripts end their replies with it; a reply of one integer
// carries none); see deadline.RoundTrip.Done.
func (s *Script) RunTimed(ctx context.Context, c redis.Scripter, cmd *redis.IntSliceCmd, rt *deadline.RoundTrip) error {
	start := time.Now()
	err := s.Run(ctx, c, cmd)
	return Observe(rt, start, cmd.Val(), err)
}

// Observe records in rt a call sent at start that replied v or failed
// with err, as RunTimed does, and returns err explained.
func Observe(rt *deadline.RoundTrip, start time.Time, v []int64, err error) error {
	server := int64(-1)
	if len(v) > 1 {
		server = v[len(v)-1]
	}
	return rt.Done(start, server, err)
}

// RunAll sends cmds in one pipeline where c has one (else one after
// another) and returns the error of each, after sending again, as EVALs,
// those that met NOSCRIPT.
func (s *Script) RunAll(ctx context.Context, c redis.Scripter, cmds []*redis.IntSliceCmd) []error {
	errs := make([]error, len(cmds))
	p, ok := c.(pipeliner)
	if len(cmds) == 1 || !ok {
		for i, cmd := range cmds {
			errs[i] = s.Run(ctx, c, cmd)
		}
		return errs
	}
	pipelined := func(cmds []*redis.IntSliceCmd) {
		pipe := p.Pipeline()
		for _, cmd := range cmds {
			_ = pipe.Process(ctx, cmd)
		}
		_, _ = pipe.Exec(ctx) // each command carries its own error
	}
	pipelined(cmds)
	var again []*redis.IntSliceCmd
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			s.asEval(cmd)
			again = append(again, cmd)
		}
	}
	if again != nil {
		pipelined(again)
	}
	for i, cmd := range cmds {
		errs[i] = cmd.Err()
	}
	return errs
}

// asEval turns cmd, an EVALSHA that failed, into an EVAL of the script's
// source, to be sent again.
func (s *Script) asEval(cmd *redis.IntSliceCmd) {
	args := cmd.Args()
	args[0], args[1] = argEval, s.argSrc
	cmd.SetErr(nil)
}

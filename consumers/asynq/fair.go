package asynqthrottle

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel/trace"

	"github.com/queuethrottle/queuethrottle/internal/fair"
	"github.com/queuethrottle/queuethrottle/internal/inflight"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// maxDeferred bounds the tasks remembered as deferred by the fair shares
// (so that they wait, not go back again, when they return).
const maxDeferred = 100_000

// processFair is the life of a task in the fair shares of the handlers
// (WithHandlers, or the server's Concurrency). It asks for a handler:
// deferred, it goes back to asynq once, as a *RateLimitError to return a
// little before its key's share of the handlers reaches it (then it
// waits here for the rest), not charged. Waiting here, its rate decides
// at once (deciding once a handler is free would push a key that sends at
// its rate later with every wait): refused, it goes back as a rejection
// does (see putBack) and, back, asks again. Admitted, it waits for its
// handler, takes its in-flight slot (refused, it waits for one of its
// key's handlers to end) and runs.
func (h *handler) processFair(ctx context.Context, span trace.Span, t *asynq.Task, ti *taskInfo, key string, cost int, id string) error {
	returning := h.wasDeferred(id)
	// Before any handler has ended nothing can be deferred: a task beyond
	// the scheduler's queue waits here, undecided, and asynq stops taking
	// tasks once its workers all wait.
	select {
	case <-h.sched.Room():
	case <-ctx.Done():
	}
	admitted := false
	waits := 0
	for {
		maxWait := h.cfg.maxWait // the longest it waits here for a handler before it is deferred
		if ti.last() {
			maxWait = 0 // a retry would archive it: it waits here
		}
		ft := h.sched.Arrive(key, fair.Arrival{MaxWait: maxWait, Returning: returning})
		if !admitted {
			if deferredNow(ft) {
				return h.deferTask(span, key, id, ti.queue, ft)
			}
			d, err := h.admit(ctx, key, cost, id)
			if d.Err != nil {
				h.storeFailure(ctx, t, key, d)
			}
			at := time.Now()
			switch {
			case err != nil && throttle.IsUsageError(err):
				ft.Leave(fair.Block{})
				return archive(span, err)
			case err != nil:
				ft.Leave(fair.Block{})
				err = fmt.Errorf("asynqthrottle: admit: %w", err)
				fail(span, err)
				return err
			case d.RetryAfter == throttle.Never && !d.Allowed:
				ft.Leave(fair.Block{})
				return archive(span, fmt.Errorf("%w: rejected with a retry-after of never", throttle.ErrInvalidCost))
			case !d.Allowed:
				ft.Leave(fair.Refused(at, d.RetryAfter, d.Reserved))
				if waited, err := h.waitOut(ctx, span, t, ti, id, newRateLimitError(key, d, at), at.Add(d.RetryAfter), d.Reserved, &waits); !waited {
					return err
				}
				returning = true
				continue
			}
			admitted = true
		}
		again, err := h.runFair(ctx, span, t, ti, key, cost, id, ft, &waits)
		if !again {
			return err
		}
		// Put back by a Backoff, and back: decided again by its id.
		admitted, returning = false, true
	}
}

// runFair waits for ft's handler, takes the task's in-flight slot and
// runs it. It returns what asynq gets, or again when the wrapped handler
// returned Backoff and the task waited here for the key's pause (it is
// then decided again).
func (h *handler) runFair(ctx context.Context, span trace.Span, t *asynq.Task, ti *taskInfo, key string, cost int, id string, ft *fair.Ticket, waits *int) (again bool, err error) {
	for {
		select {
		case <-ft.Granted():
		case <-ft.Deferred():
			return false, h.deferTask(span, key, id, ti.queue, ft) // admitted: its id is admitted again, free, while still counted
		case <-ctx.Done():
			ft.Leave(fair.Block{})
			rl := newRateLimitError(key, throttle.Decision{RetryAfter: time.Second, ResetAfter: time.Second}, time.Now())
			rl.Err = ctx.Err()
			h.dispose(ctx, span, key, DispositionRetry)
			fail(span, rl)
			return false, rl
		}
		s, sd, ok := h.acquire(ctx, span, t, key, id)
		at := time.Now()
		switch {
		case !ok && sd.Source != throttle.SourceDegraded:
			// Every slot of the key is held: its turn comes again when one
			// of its handlers ends here (or the earliest lease does).
			ft.Retry(fair.Block{Until: at.Add(sd.RetryAfter), UntilDone: true})
			continue
		case !ok:
			// The in-flight limiter failed under FailClosed.
			ft.Leave(fair.Block{})
			rl := newRateLimitError(key, sd, at)
			rl.slot = true
			return h.waitOut(ctx, span, t, ti, id, rl, at.Add(sd.RetryAfter), false, waits)
		}
		err := h.runGranted(ctx, span, t, s, ft)
		be := backoffOf(err)
		if be == nil {
			return false, err
		}
		// The partner said 429: pause the key for everyone, give back the
		// refused call's charge, and back like a rejection.
		d := h.backoff(ctx, span, t, key, cost, id, be)
		at = time.Now()
		rl := newRateLimitError(key, d, at)
		rl.backoff = true
		return h.waitOut(ctx, span, t, ti, id, rl, at.Add(d.RetryAfter), false, waits)
	}
}

// runGranted runs the task granted ft's handler (see run), and gives the
// handler back when the wrapped handler returns or panics (the panic goes
// on to asynq).
func (h *handler) runGranted(ctx context.Context, span trace.Span, t *asynq.Task, s *inflight.Slot, ft *fair.Ticket) error {
	defer func() {
		ft.Done()
		h.recall()
	}()
	return h.run(ctx, span, t, s)
}

// deferredNow reports whether ft was deferred as it arrived.
func deferredNow(ft *fair.Ticket) bool {
	select {
	case <-ft.Deferred():
		return true
	default:
		return false
	}
}

// deferTask sends the task back to asynq, deferred by the fair shares: a
// *RateLimitError that brings it back the server's check interval before
// its key's share reaches it (asynq keeps retry times in whole seconds,
// cut down, so up to a second earlier still), to wait here for the rest.
func (h *handler) deferTask(span trace.Span, key, id, queue string, ft *fair.Ticket) error {
	now := time.Now()
	d := ft.Delay()
	if id != "" {
		h.deferredIDs.Add(id, struct{}{})
		h.recalls.add(deferredTask{id: id, queue: queue, key: key})
	}
	rl := newRateLimitError(key, throttle.Decision{RetryAfter: d, ResetAfter: d}, now)
	rl.deferred = true
	rl.returnAt = now.Add(max(d-h.cfg.checkInterval, 0))
	h.dispose(context.Background(), span, key, DispositionDeferred)
	return rl
}

// wasDeferred reports whether the task with identity id was deferred
// before, and forgets it.
func (h *handler) wasDeferred(id string) bool {
	if id == "" {
		return false
	}
	_, ok := h.deferredIDs.Peek(id)
	if ok {
		h.deferredIDs.Remove(id)
	}
	return ok
}

// recallEvery bounds how often deferred tasks are brought back sooner.
const recallEvery = 50 * time.Millisecond

// recalls are the tasks the fair shares deferred, per key in the order
// they were deferred, for bringing back sooner (WithInspector).
type recalls struct {
	inspector *asynq.Inspector
	mu        sync.Mutex
	byKey     map[string][]deferredTask
	last      time.Time
	busy      bool        // a recall's goroutine runs
	again     bool        // a recall came while busy: run one when it ends
	timer     *time.Timer // a recall to come (nil: none) ...
	timerAt   time.Time   // ... at
}

type deferredTask struct {
	id, queue, key string
	relisted       bool // found active once (see bringBack)
}

// recallAhead: a task kept for a retention (asynq.Retention) and due back
// within it is left to come back by itself. Inspector.RunTask moves a
// completed task kept for its retention back to pending too, and the
// check of its state and the move are two calls: one that came back and
// completed in between would run twice. (Without a retention a completed
// task is gone, and RunTask finds nothing.)
const recallAhead = 500 * time.Millisecond

func (r *recalls) add(t deferredTask) {
	if r.inspector == nil || t.queue == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	q := append(r.byKey[t.key], t)
	if len(q) > maxDeferred {
		q = q[len(q)-maxDeferred:]
	}
	r.byKey[t.key] = q
}

// recall brings deferred tasks back sooner when their keys' shares go
// unused (fair.Scheduler.Starved): as many as handlers are free and a
// quarter of the handlers more (the handlers that will end before they
// are back), taken in turn from those keys, each moved from the retry set
// to pending (Inspector.RunTask; one that is no longer there, already
// back or gone, is skipped). It runs when a handler ends, at most every
// recallEvery, on a goroutine of its own. While deferred tasks are
// listed, a recall that cannot run now is not dropped: it runs when the
// one running ends, recallEvery after the last, or when a blocked key
// with deferred tasks is free again; otherwise tasks brought back and
// done quickly would leave the handlers idle until the others' slots. And
// one runs the server's TaskCheckInterval after tasks were moved, in case
// another server's workers took them.
func (h *handler) recall() {
	r := &h.recalls
	if r.inspector == nil {
		return
	}
	r.mu.Lock()
	if len(r.byKey) == 0 {
		r.mu.Unlock()
		return
	}
	if r.busy {
		r.again = true
		r.mu.Unlock()
		return
	}
	if since := time.Since(r.last); since < recallEvery {
		h.recallIn(recallEvery - since)
		r.mu.Unlock()
		return
	}
	keys, free, retry := h.sched.Starved()
	if len(keys) == 0 {
		if !retry.IsZero() {
			h.recallIn(time.Until(retry))
		}
		r.mu.Unlock()
		return
	}
	picked := h.pick(keys, free+h.sched.Handlers()/4)
	if len(picked) == 0 {
		r.mu.Unlock()
		return
	}
	r.busy, r.last = true, time.Now()
	r.mu.Unlock()
	go h.bringBack(picked)
}

// recallIn runs recall after d, unless one is due sooner. r.mu is held.
func (h *handler) recallIn(d time.Duration) {
	r := &h.recalls
	at := time.Now().Add(max(d, 0))
	if r.timer != nil {
		if !r.timerAt.After(at) {
			return
		}
		r.timer.Stop()
	}
	var t *time.Timer
	t = time.AfterFunc(max(d, 0), func() {
		r.mu.Lock()
		if r.timer == t {
			r.timer = nil
		}
		r.mu.Unlock()
		h.recall()
	})
	r.timer, r.timerAt = t, at
}

// pick takes up to want tasks still deferred from the lists of keys, in
// turn, and forgets the ones already back. h.recalls.mu is held.
func (h *handler) pick(keys []string, want int) []deferredTask {
	r := &h.recalls
	var picked []deferredTask
	for len(picked) < want {
		took := false
		for _, k := range keys {
			q := r.byKey[k]
			for len(q) > 0 && !h.deferredIDs.Contains(q[0].id) {
				q = q[1:] // came back already
			}
			if len(q) > 0 {
				picked = append(picked, q[0])
				q, took = q[1:], true
			}
			if len(q) == 0 {
				delete(r.byKey, k)
			} else {
				r.byKey[k] = q
			}
		}
		if !took {
			break
		}
	}
	return picked
}

// bringBack moves the picked tasks that are still deferred (not back in
// the middleware) and in the retry set to pending (see recallAhead). One
// still active (asynq has yet to put it in the retry set, or another
// server runs it) is listed again once, last of its key's.
func (h *handler) bringBack(picked []deferredTask) {
	r := &h.recalls
	var notYet []deferredTask
	moved := false
	for _, t := range picked {
		if !h.deferredIDs.Contains(t.id) {
			continue
		}
		info, err := r.inspector.GetTaskInfo(t.queue, t.id)
		switch {
		case err != nil:
		case info.State == asynq.TaskStateRetry:
			if (info.Retention == 0 || time.Until(info.NextProcessAt) > recallAhead) && h.deferredIDs.Contains(t.id) {
				moved = r.inspector.RunTask(t.queue, t.id) == nil || moved
			}
		case info.State == asynq.TaskStateActive && !t.relisted:
			t.relisted = true
			notYet = append(notYet, t)
		}
	}
	r.mu.Lock()
	for _, t := range notYet {
		r.byKey[t.key] = append(r.byKey[t.key], t)
	}
	if moved {
		// They reach this server's workers within its TaskCheckInterval,
		// unless another server's take them: look again then, so that
		// handlers left idle get others.
		h.recallIn(h.cfg.taskCheck + recallEvery)
	}
	again := r.again || len(notYet) > 0
	r.busy, r.again = false, false
	r.mu.Unlock()
	if again {
		h.recall()
	}
}

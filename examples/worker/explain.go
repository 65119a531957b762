package main

import (
	"sort"
	"time"
)

// A fault can make the broker deliver again a message whose handler has
// already run: its ack was in flight when its worker process was killed
// or the NATS server went down, or the restarted server redelivered what
// it had pending before the ack got through (an InProgress lost in the
// outage does the same to a message held through it), or (asynq) the
// task's completion was being written when Redis died. Those duplicates
// are the broker's at-least-once delivery at work, and handlers must be
// idempotent for them; the throttle has no part in them. Any other
// duplicate is a failure of the run.
//
// explainDuplicates tells the two apart, strictly: a later run r2 of a
// job is explained by a fault f only when the run before it, r1 (by
// delivery count, then start), could have lost its ack to f, and r2 is
// the broker's redelivery of it:
//
//   - f can lose r1's ack: on NATS, kill-worker of the process that ran r1,
//     or restart-nats; on asynq, kill-redis or pause-redis (Redis is its
//     broker);
//   - on NATS, r1's delivery was in the worker's hands when f came:
//     received before f (restart-nats: before the server was back, for it
//     delivers while it shuts down), and f no later than the end of r1's
//     work plus the time its ack may take (ackTimeout + explainSlack: the
//     handler waits for the confirmation);
//   - on asynq, r1's completion was written while Redis was out: asynq
//     writes it right after the handler returns, so r1 ended from
//     explainSlack before f to explainSlack after the recovery (asynq's
//     go-redis pool may still fail to connect for a while after the
//     server is back: its dial breaker probes once a second; seen up to
//     0.5 s). When r1 started does not matter: a task dequeued before f
//     may be admitted and run during the outage (the Hybrid decides
//     locally), and one may even be dequeued after the recovery and
//     complete while the pool still fails. asynq v0.26.0 never writes a
//     lost completion again (its syncer retries with a context already
//     cancelled), so the task stays active until the recoverer runs it
//     again;
//   - on NATS, the server had not confirmed r1's ack when r2's delivery
//     reached the worker, or (restart-nats) confirmed it while it was
//     coming back, from the fault to explainSlack after the recovery: the
//     restarted server was seen to redeliver messages whose ack it had
//     confirmed then. Any other confirmed ack is never explained away;
//   - or (restart-nats) r1's delivery reached the worker from the fault
//     to explainSlack after the recovery: the restarted server's consumer
//     state may be behind, and it was seen to deliver such a message
//     again 0.07 to 2 s later (a redelivery of what it had pending, or a
//     message it delivered for the first time as it came back), the
//     throttle sending nothing between, whatever became of r1's ack;
//   - r2 is a later delivery than r1 (when both counts are known): one
//     delivery handled twice is the throttle's fault, not the broker's;
//   - r2 started after f, and on NATS at most AckWait + the reservations
//     horizon + explainSlack after the recovery from f: the redelivery
//     comes after AckWait at the latest, and throttling may then hold it
//     up to the horizon. On asynq, the redelivery is the recoverer's, at
//     most asynqRecovery after r1 ended, and throttling may hold it up to
//     the horizon as well: r2 started at most asynqRecovery + horizon +
//     explainSlack after the end of r1.
//
// Each r1 explains at most its next run, so a fault never explains more
// than one extra run per run it caught in flight.
const explainSlack = 2 * time.Second

// asynqRecovery bounds how long after its handler returned asynq runs again
// a task whose completion a Redis fault lost (asynq v0.26.0): the task's
// lease (rdb.LeaseDuration, 30 s, extended by the heartbeater only while
// the handler runs) expires at most 30 s after the handler returned; the
// recoverer takes only tasks whose lease expired at least 30 s ago
// (recoverer.go) and looks once a minute (server.go); the retry it makes
// is due at once (failureRetryDelay), and asynq moves it to pending within
// asynqCheckInterval. In a run it comes at about t=120s: at t=60s the
// leases of tasks dequeued after t=0.5s are not yet 30 s past.
const asynqRecovery = 30*time.Second + 30*time.Second + time.Minute + time.Second

// dupRuns are the extra runs (all but the first) of one job, split.
type dupRuns struct{ explained, unexplained int }

// explainDuplicates returns, for each job run more than once, how many of
// its extra runs faults explain and how many they do not (see above).
// Instants of faults are offsets from start; horizon is the reservations
// horizon.
func explainDuplicates(runs []handled, faults []faultMark, start time.Time, c consumer, horizon time.Duration) map[string]dupRuns {
	byJob := map[string][]handled{}
	for _, h := range runs {
		byJob[h.JobID] = append(byJob[h.JobID], h)
	}
	out := map[string]dupRuns{}
	for id, hs := range byJob {
		if len(hs) < 2 {
			continue
		}
		sort.SliceStable(hs, func(a, b int) bool {
			if hs[a].Delivery != hs[b].Delivery && hs[a].Delivery != 0 && hs[b].Delivery != 0 {
				return hs[a].Delivery < hs[b].Delivery
			}
			return hs[a].At < hs[b].At
		})
		var d dupRuns
		for i := 1; i < len(hs); i++ {
			if explainedBy(hs[i-1], hs[i], faults, start, c, horizon) {
				d.explained++
			} else {
				d.unexplained++
			}
		}
		out[id] = d
	}
	return out
}

// explainedBy reports whether some fault explains r2 as the broker's
// redelivery of r1.
func explainedBy(r1, r2 handled, faults []faultMark, start time.Time, c consumer, horizon time.Duration) bool {
	got2 := r2.At
	if r2.Received != 0 {
		got2 = min(r2.Received, r2.At)
	}
	if r1.Delivery != 0 && r2.Delivery != 0 && r2.Delivery <= r1.Delivery {
		return false
	}
	at := func(ns int64) time.Duration { return time.Unix(0, ns).Sub(start) }
	got1 := r1.At
	if r1.Received != 0 {
		got1 = min(r1.Received, r1.At)
	}
	got1At, end1, start2 := at(got1), at(max(r1.End, r1.At)), at(r2.At)
	if c == consumerAsynq {
		// asynq: r1's completion was written while Redis was out, and r2
		// is the recoverer's run of the task it left active.
		for _, f := range faults {
			if f.Kind != faultKillRedis && f.Kind != faultPauseRedis {
				continue
			}
			lost := end1 >= f.At-explainSlack && end1 <= max(f.Until, f.At)+explainSlack
			if lost && start2 > f.At && start2 > end1 && start2 <= end1+asynqRecovery+horizon+explainSlack {
				return true
			}
		}
		return false
	}
	if c != consumerNATS {
		return false
	}
	// On NATS, r1's ack is in doubt if it was never confirmed, or not
	// before r2's delivery arrived.
	ackInDoubt := r1.AckAt == 0 || r1.AckAt > got2
	redelivery := consumerConfig().AckWait + horizon + explainSlack
	for _, f := range faults {
		var inFlight time.Duration // how long after r1's work f could still lose its ack
		switch {
		case f.Kind == faultKillWorker && f.Proc == r1.Proc && r1.Proc != 0,
			f.Kind == faultRestartNATS:
			inFlight = ackTimeout + explainSlack
		default:
			continue
		}
		redelivered := start2 > f.At && start2 <= max(f.Until, f.At)+redelivery
		// A restarting server still delivers while it shuts down, after f
		// was marked, and as it comes back its consumer state may be
		// behind: a message it delivers then (again, or for the first time)
		// may be delivered once more soon after, whatever became of the ack
		// (seen 0.07 to 2 s apart, the throttle sending nothing between).
		if f.Kind == faultRestartNATS && got1At >= f.At && got1At <= f.Until+explainSlack && start2 > got1At && redelivered {
			return true
		}
		// It may also lose an ack it confirmed while it came back.
		lostInRestart := f.Kind == faultRestartNATS && r1.AckAt != 0 && at(r1.AckAt) >= f.At && at(r1.AckAt) <= f.Until+explainSlack
		if (ackInDoubt || lostInRestart) && got1At < f.At && f.At <= end1+inFlight && redelivered {
			return true
		}
	}
	return false
}

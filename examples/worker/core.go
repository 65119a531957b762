package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	natsthrottle "github.com/queuethrottle/queuethrottle/consumers/nats"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// coreSubjectPrefix is the subjects of -core: core.<tenant>, outside the
// stream's jobs.>.
const coreSubjectPrefix = "core."

// checkCore refuses what -core does not run with.
func checkCore(cfg config) error {
	switch {
	case !cfg.Core:
		if cfg.CoreMaxWait != natsthrottle.DefaultCoreMaxWait {
			return errors.New("-core-max-wait needs -core")
		}
		return nil
	case cfg.Faults != "":
		return errors.New("-core has no faults to inject (core NATS cannot redeliver what a fault loses): drop -faults")
	case cfg.PartnerQuota != "" || cfg.Partner != "":
		return errors.New("-core has no partner: drop -partner and -partner-quota")
	case cfg.CoreMaxWait < 0:
		return fmt.Errorf("-core-max-wait: must be >= 0, got %v", cfg.CoreMaxWait)
	}
	return nil
}

// coreRequests counts how the requests of -core were answered.
type coreRequests struct {
	mu                      sync.Mutex
	ok, limited, unanswered int
	wg                      sync.WaitGroup
}

// coreSender publishes the trace on core NATS: as requests for the
// tenants whose rate line says "request", as plain messages otherwise.
type coreSender struct {
	nc       *nats.Conn
	requests map[string]bool
	timeout  time.Duration // a request's: the Core's longest wait, and more
	answers  *coreRequests
}

func (s *coreSender) send(msg *nats.Msg, tenant string) error {
	msg.Subject = coreSubjectPrefix + tenant
	msg.Header.Del("Nats-Msg-Id")
	if !s.requests[tenant] {
		return s.nc.PublishMsg(msg)
	}
	s.answers.wg.Go(func() {
		resp, err := s.nc.RequestMsg(msg, s.timeout)
		a := s.answers
		a.mu.Lock()
		defer a.mu.Unlock()
		switch {
		case err != nil:
			a.unanswered++
		case resp.Header.Get(natsthrottle.HeaderServiceErrorCode) == "429":
			a.limited++
		default:
			a.ok++
		}
	})
	return nil
}

// line is the summary's line on the requests.
func (a *coreRequests) line() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return fmt.Sprintf("requests: %d answered by the handler, %d answered 429 (given up), %d unanswered", a.ok, a.limited, a.unanswered)
}

// consumeCore subscribes the worker to core.<tenant> through a
// natsthrottle.Core on gate, with cfg.Handlers handlers (shared fairly
// across tenants, weighted by weight, with -fair) and the in-flight limit
// inf when not nil; its give-ups are recorded per tenant in w's events
// (the report's given_up, from the Core's own reports). cl unsubscribes and closes the
// Core.
func consumeCore(nc *nats.Conn, cfg config, weight func(string) float64, gate *throttle.Gate, inf throttle.InFlightLimiter, w *worker, cl *closers) (*natsthrottle.Core, error) {
	opts := []natsthrottle.CoreOption{
		natsthrottle.WithCoreConcurrency(cfg.Handlers),
		natsthrottle.WithCoreFair(cfg.Fair),
		natsthrottle.WithCoreWeights(weight),
	}
	if inf != nil {
		opts = append(opts, natsthrottle.WithCoreInFlight(inf, inFlightLease))
	}
	core, err := natsthrottle.NewCore(w.handleCore, gate, append(opts,
		natsthrottle.WithCoreKeyFunc(func(m *nats.Msg) (string, error) {
			tenant, ok := strings.CutPrefix(m.Subject, coreSubjectPrefix)
			if !ok || tenant == "" {
				return "", fmt.Errorf("subject %q is not %s<tenant>", m.Subject, coreSubjectPrefix)
			}
			return tenant, nil
		}),
		natsthrottle.WithCoreCostFunc(func(m *nats.Msg) (int, error) {
			var j job
			if err := json.Unmarshal(m.Data, &j); err != nil {
				return 0, err
			}
			return max(j.Cost, 1), nil
		}),
		natsthrottle.WithCoreMaxWait(cfg.CoreMaxWait),
		natsthrottle.WithCoreErrorHandler(func(m *nats.Msg, err error) {
			var ge *natsthrottle.GiveUpError
			if errors.As(err, &ge) {
				w.rec.givenUp(ge.Key)
				return
			}
			w.throttleErrs.add("core "+m.Subject, err)
		}))...)
	if err != nil {
		return nil, err
	}
	sub, err := nc.QueueSubscribe(coreSubjectPrefix+"*", "workers", core.Handle)
	if err != nil {
		return nil, err
	}
	if err := nc.Flush(); err != nil {
		return nil, err
	}
	cl.add(func() {
		_ = sub.Unsubscribe()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = core.Close(ctx)
	})
	return core, nil
}

// handleCore works on a core NATS job for -work, records it and answers
// a request.
func (w *worker) handleCore(m *nats.Msg) {
	var j job
	if err := json.Unmarshal(m.Data, &j); err != nil {
		w.handlerErrs.add("bad payload on "+m.Subject, err)
		return
	}
	start := time.Now()
	if w.work > 0 {
		time.Sleep(w.work)
	}
	w.rec.handle(handled{Tenant: j.Tenant, JobID: j.ID, Ref: j.ID, Proc: w.proc, At: start.UnixNano(), End: time.Now().UnixNano(), Delivery: 1, Received: start.UnixNano()})
	if m.Reply != "" {
		if err := m.Respond([]byte("ok")); err != nil {
			w.handlerErrs.add("answer "+j.ID, err)
		}
	}
}

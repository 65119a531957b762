package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// The JSON report of -report FILE: what the summary says, in numbers.
type (
	jsonReport struct {
		OK        bool           `json:"ok"`
		Seconds   float64        `json:"seconds"` // the whole run
		Faults    []jsonFault    `json:"faults"`  // injected with -faults, in order
		Consumers []jsonConsumer `json:"consumers"`
		Partner   *jsonPartner   `json:"partner,omitempty"` // -partner-quota
	}
	// jsonPartner is the simulated partner, both consumers and every
	// process together.
	jsonPartner struct {
		Quota       string `json:"quota"`        // -partner-quota, at the start
		Calls       int    `json:"calls"`        // every call the handlers made
		Accepted    int    `json:"accepted"`     // answered 200: the job counts as handled
		Rejected429 int    `json:"rejected_429"` // answered 429: the job comes back (Backoff), not a handler run
		// MaxInWindow is the most admissions on the partner's key
		// certainly inside any window of -partner's period (1 s without
		// it), as for tenants.
		MaxInWindow int    `json:"max_in_window"`
		LimitFinal  string `json:"limit_final"` // the -partner limit at the end ("" without it)
		// AcceptedPerS and RejectedPerS count the calls per whole second
		// from the replay's t=0, to the last call.
		AcceptedPerS []int `json:"accepted_per_s"`
		RejectedPerS []int `json:"rejected_per_s"`
		// LimitPerS is the -partner limit (Count per its Per), the
		// lowest in force in each whole second from t=0 (adapted, with
		// Redis); absent without -partner.
		LimitPerS []int `json:"limit_per_s,omitempty"`
	}
	jsonFault struct {
		Kind       string  `json:"kind"`              // kill-redis, pause-redis, kill-worker or restart-nats
		AtS        float64 `json:"at_s"`              // when it was injected, seconds from the start
		RecoveredS float64 `json:"recovered_s"`       // when the run had recovered from it (server back, replacement started)
		Process    int     `json:"process,omitempty"` // kill-worker: the worker process killed
	}
	jsonConsumer struct {
		Name       string       `json:"name"`       // "nats" or "asynq"
		Seconds    float64      `json:"seconds"`    // first arrival to last handler start
		Deliveries int          `json:"deliveries"` // every delivery of every consumer used (NATS: the per-tenant consumers too; asynq: every task handed to the handler)
		Fairness   jsonFairness `json:"fairness"`
		// LongestDecisionMS is the longest limiter decision; with Redis
		// limiters (TimeoutMS > 0, their per-call timeout) at most the
		// timeout plus one round trip.
		LongestDecisionMS float64      `json:"longest_decision_ms"`
		TimeoutMS         float64      `json:"redis_timeout_ms,omitempty"`
		Tenants           []jsonTenant `json:"tenants"`
	}
	// jsonFairness is Jain's index of the weight-normalized handler
	// starts, per whole second with two or more tenants backlogged (see
	// fairness).
	jsonFairness struct {
		Seconds  int     `json:"seconds"`
		JainMean float64 `json:"jain_mean"`
		JainMin  float64 `json:"jain_min"`
	}
	jsonTenant struct {
		Tenant       string `json:"tenant"`
		Limit        string `json:"limit"` // e.g. "20/1s"
		Published    int    `json:"published"`
		Handled      int    `json:"handled"`       // handler runs
		HandledTwice int    `json:"handled_twice"` // jobs handled more than once, not explained by the faults
		// DuplicatesExplained counts the jobs handled more than once
		// where a fault explains every extra run (the broker delivered
		// again a message whose ack the fault lost; see explainDuplicates).
		DuplicatesExplained int     `json:"duplicates_explained"`
		Lost                int     `json:"lost"`          // terminated, or dropped at MaxDeliver
		GivenUp             int     `json:"given_up"`      // -core: given up by the throttle (natsthrottle.Core's reports)
		Naks                int     `json:"naks"`          // NAKs (NATS) or rejections returned to asynq
		Reserved            int     `json:"reserved"`      // of the NAKs, those whose decision reserved the message's own slot
		MustWait            int     `json:"must_wait"`     // jobs that cannot start on arrival: each NAKed or waiting in process
		Holds               int     `json:"holds"`         // messages held on their last delivery
		MaxInWindow         int     `json:"max_in_window"` // most cost units admitted in any window of the limit's period
		Bound               int     `json:"bound"`         // the most the limiter may admit in such a window
		WaitP50MS           float64 `json:"wait_p50_ms"`   // arrival to handler start
		WaitP99MS           float64 `json:"wait_p99_ms"`
		MaxInFlight         int     `json:"max_in_flight"`             // most handlers running at once, start to end of work
		InFlight            int     `json:"in_flight_limit,omitempty"` // -inflight (0: no limit)
		Weight              float64 `json:"weight"`                    // in the fair shares of the handlers (the rate line's "weight", default 1)
		StartsPerS          []int   `json:"starts_per_s"`              // handler starts in each whole second from the replay's t=0, to the last start
	}
)

// writeReport writes rep, a run of elapsed, as JSON to path.
func writeReport(path string, rep report, elapsed time.Duration) error {
	out := jsonReport{OK: rep.OK(), Seconds: elapsed.Seconds(), Faults: []jsonFault{}}
	for _, f := range rep.Faults {
		out.Faults = append(out.Faults, jsonFault{Kind: f.Kind, AtS: f.At.Seconds(), RecoveredS: f.Until.Seconds(), Process: f.Proc})
	}
	out.Consumers = append(out.Consumers, rep.jsonConsumer())
	if rep.Asynq != nil {
		out.Consumers = append(out.Consumers, rep.Asynq.jsonConsumer())
	}
	if p := rep.Partner; p != nil {
		out.Partner = &jsonPartner{Quota: p.Quota.String(), Calls: p.Calls, Accepted: p.Accepted, Rejected429: p.Rejected429,
			MaxInWindow: p.MaxInWindow, AcceptedPerS: p.AcceptedPerS, RejectedPerS: p.RejectedPerS, LimitPerS: p.limitPerS()}
		if p.Budget.Count > 0 {
			out.Partner.LimitFinal = throttle.Rate{Count: p.Final, Per: p.Budget.Per}.String()
		}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("-report: %w", err)
	}
	return nil
}

func (rep report) jsonConsumer() jsonConsumer {
	c := jsonConsumer{Name: "nats", Seconds: rep.Span.Seconds(), Deliveries: rep.Deliveries, Tenants: []jsonTenant{},
		LongestDecisionMS: ms(rep.Longest), TimeoutMS: ms(rep.Timeout),
		Fairness: jsonFairness{Seconds: rep.Fairness.Seconds, JainMean: rep.Fairness.Mean, JainMin: rep.Fairness.Min}}
	if rep.Consumer == consumerAsynq {
		c.Name = "asynq"
	}
	for _, t := range rep.Tenants {
		c.Tenants = append(c.Tenants, jsonTenant{
			Tenant:       t.Tenant,
			Limit:        t.Rate.String(),
			Published:    t.Published,
			Handled:      t.Handled,
			HandledTwice: t.Twice,

			DuplicatesExplained: t.Explained,
			Lost:                t.Terms + t.MaxDeliver,
			GivenUp:             t.GivenUp,
			Naks:                t.Naks,
			Reserved:            t.Reserved,
			MustWait:            t.MustWait,
			Holds:               t.Holds,
			MaxInWindow:         t.MaxInWindow,
			Bound:               t.Bound,
			WaitP50MS:           ms(t.WaitP50),
			WaitP99MS:           ms(t.WaitP99),
			MaxInFlight:         t.MaxInFlight,
			InFlight:            rep.InFlight,
			Weight:              t.Weight,
			StartsPerS:          append([]int{}, t.StartsPerS...),
		})
	}
	return c
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

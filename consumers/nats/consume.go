package natsthrottle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/throttle"
)

const (
	// fetchWait bounds one pull request of a ConsumeByKey key with
	// nothing to deliver; consumeWait one of Handler.Consume, which Drain
	// waits for.
	fetchWait   = 5 * time.Second
	consumeWait = time.Second
	// retryEvery is the pause after a failed fetch or consumer creation.
	retryEvery = 200 * time.Millisecond
	// apiTimeout bounds one JetStream API request.
	apiTimeout = 5 * time.Second
)

// puller is the one pull loop of this package: Handler.Consume and each
// key of ConsumeByKey pull with it. It asks room how many messages it may
// pull now (0: stop), pulls up to that many in one request, hands each to
// take as it arrives, and again, until ctx is done or room says stop.
type puller struct {
	wait   time.Duration                                         // bounds one request
	cons   func(ctx context.Context) (jetstream.Consumer, error) // the consumer, made again after ErrConsumerNotFound
	room   func(ctx context.Context) int                         // blocks until a message may be pulled
	take   func(jetstream.Msg)
	empty  func() // a request ended with nothing
	report func(error)
}

func (p *puller) run(ctx context.Context) {
	var cons jetstream.Consumer
	for ctx.Err() == nil {
		if cons == nil {
			c, err := p.cons(ctx)
			if err != nil {
				p.report(err)
				sleep(ctx, retryEvery)
				continue
			}
			cons = c
		}
		n := p.room(ctx)
		if n <= 0 {
			return
		}
		fctx, cancel := context.WithTimeout(ctx, p.wait)
		batch, err := cons.Fetch(n, jetstream.FetchContext(fctx))
		got := false
		if err == nil {
			for msg := range batch.Messages() {
				got = true
				p.take(msg)
			}
			err = batch.Error()
		}
		cancel()
		if !got {
			p.empty()
		}
		if err != nil && !quietFetchError(err) && ctx.Err() == nil {
			p.report(fmt.Errorf("fetch: %w", err))
			if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) {
				cons = nil
			}
			sleep(ctx, retryEvery)
		}
	}
}

// quietFetchError reports whether err only says the pull request ended
// without a message.
func quietFetchError(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, jetstream.ErrNoMessages) || errors.Is(err, nats.ErrTimeout)
}

// Consume pulls c's messages into h.Handle with the loop ConsumeByKey
// pulls each key with: a request for at most as many messages as the
// Handler decides at once (WithConcurrency's n; 1 without it), the next
// once Handle has taken them. So no message waits in the client's buffer
// past its AckWait, to be delivered again and handled twice (nats.go's
// Consume buffers 500 by default: the worker example, 16 handlers of 1 s,
// handled 113 of 368 jobs twice with it), and each request lasts at most
// a second, so one the server no longer serves costs at most that (nats.go's
// Consume notices one after twice its heartbeat, 30 s by default). A
// failed request is reported to WithErrorHandler and the logger and tried
// again after 200 ms. Stop or Drain the returned ConsumeContext (Drain
// hands what was pulled to Handle first; Stop drops it, to be delivered
// again after its AckWait), then Close the Handler. Drain ends within a
// second. The only error wraps throttle.ErrInvalidOption, for a nil c or
// a Handler not built by New.
func (h *Handler) Consume(c jetstream.Consumer) (jetstream.ConsumeContext, error) {
	switch {
	case c == nil:
		return nil, &throttle.OptionError{Field: "Consume", Reason: "the consumer must not be nil"}
	case h == nil || h.next == nil || h.gate == nil:
		return nil, &throttle.OptionError{Field: "Consume", Reason: "the Handler was not built by New"}
	}
	cc := &consumption{closed: make(chan struct{})}
	var stop context.Context
	stop, cc.stop = context.WithCancel(context.Background())
	var drain context.Context
	drain, cc.drain = context.WithCancel(context.Background())
	n := max(h.cfg.concurrency, 1)
	p := &puller{
		wait: consumeWait,
		cons: func(context.Context) (jetstream.Consumer, error) { return c, nil },
		room: func(context.Context) int {
			if drain.Err() != nil {
				return 0
			}
			return n
		},
		take: func(m jetstream.Msg) {
			if stop.Err() == nil {
				h.Handle(m)
			}
		},
		empty:  func() {},
		report: func(err error) { h.reportPull(fmt.Errorf("natsthrottle: Consume: %w", err)) },
	}
	// A request in flight ends with Stop, or when Drain has let it hand
	// over what it pulled (at most consumeWait later).
	pull, cancel := context.WithCancel(stop)
	go func() {
		defer close(cc.closed)
		defer cancel()
		p.run(pull)
	}()
	return cc, nil
}

// reportPull passes a failed pull (Consume, ConsumeByKey) to the error
// handler and the logger.
func (h *Handler) reportPull(err error) {
	if h.cfg.onError != nil {
		h.cfg.onError(nil, err)
	}
	if h.cfg.logger != nil {
		h.cfg.logger.Error("natsthrottle: pull failed", "error", err)
	}
}

// consumption is Handler.Consume's jetstream.ConsumeContext.
type consumption struct {
	stop, drain context.CancelFunc
	closed      chan struct{}
}

// Stop ends the pulling at once: messages pulled and not yet handed to
// Handle are dropped (the server delivers them again after AckWait).
func (c *consumption) Stop() { c.stop(); c.drain() }

// Drain ends the pulling once what was pulled is handed to Handle.
func (c *consumption) Drain() { c.drain() }

// Closed is closed once the pulling has ended.
func (c *consumption) Closed() <-chan struct{} { return c.closed }

package natsthrottle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/queuethrottle/queuethrottle/internal/fair"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Timing of a KeyedConsumer.
const (
	// DiscoverInterval is how often a KeyedConsumer lists the stream's
	// subjects for new keys: the longest the first message of a new key
	// waits to be seen.
	DiscoverInterval = 100 * time.Millisecond
	// fetchWait bounds one pull request of a key with nothing to deliver.
	fetchWait = 5 * time.Second
	// retryEvery is the pause after a failed fetch or consumer creation.
	retryEvery = 200 * time.Millisecond
	// apiTimeout bounds one JetStream API request.
	apiTimeout = 5 * time.Second
)

// KeyedConsumer pulls a stream's messages one key at a time, a key being a
// token of the subject, in the order of the Handler's fair shares, so that
// a message is pulled only when it can start: see ConsumeByKey. Its
// methods are safe for concurrent use.
type KeyedConsumer struct {
	h      *Handler
	stream jetstream.Stream
	cfg    jetstream.ConsumerConfig
	tokens []string // of cfg.FilterSubject
	keyAt  int      // the index of the key's "*" in tokens

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // discovery and one puller per key

	mu   sync.Mutex
	keys map[string]*keyPuller

	delivered atomic.Int64 // messages pulled
	lastErr   atomic.Pointer[error]
}

// keyPuller pulls one key's messages through its own durable consumer.
type keyPuller struct {
	key  string
	cfg  jetstream.ConsumerConfig
	cons jetstream.Consumer // nil until created
}

// ConsumeByKey pulls the messages of stream whose subjects match
// cfg.FilterSubject, which has one "*" token: the key (e.g. "jobs.*", the
// key the tenant in jobs.<tenant>; "orders.*.>"). Each key gets a durable
// pull consumer of its own, cfg with Durable cfg.Durable + "_" + the key
// (escaped to the characters a consumer name may hold) and FilterSubject
// the filter with the key in place of "*", created when the key is first
// seen: at the start and then every DiscoverInterval (100 ms) the
// stream's subjects matching the filter are listed (StreamInfo with a
// subject filter). Every process that calls ConsumeByKey with the same cfg
// shares these consumers, so each message is delivered to one of them.
//
// Each key has at most one message in process that has not started: it
// waits for its handler in the Handler's fair shares (WithConcurrency(n)
// handlers, WithWeights), then takes its in-flight slot (WithInFlight) and
// its admission from the Gate, and runs; only then is the key's next
// message pulled. A message its limits refuse is not NAKed: it waits in
// process with InProgress heartbeats (a third of AckWait apart) until its
// retry-after (or, refused an in-flight slot, until a handler of its key
// ends here), and its key's other messages wait in the stream meanwhile.
// So a flood of one key costs its messages nothing but their wait, and
// other keys' messages are pulled and started as they come (see Fair
// shares in the package documentation).
//
// The Handler must be built with WithConcurrency, WithFair on (the
// default) and WithConsumerConfig(cfg), so that it knows the consumers'
// AckWait and MaxDeliver. cfg needs a Durable name, explicit acks, and no
// FilterSubjects. Errors wrap throttle.ErrInvalidOption. Errors met later
// (a failed listing, fetch or consumer creation, retried every 200 ms) go
// to the error handler with a nil message and to LastError.
//
// The per-key consumers are durable and are not deleted: with a limits
// stream, a consumer deleted and created again would deliver its subject's
// messages again from the start (use cfg.InactiveThreshold only with
// WorkQueue or Interest retention, where acknowledged messages are gone).
// Stop the KeyedConsumer, then Close the Handler.
func (h *Handler) ConsumeByKey(stream jetstream.Stream, cfg jetstream.ConsumerConfig) (*KeyedConsumer, error) {
	if err := h.keyedUsable(stream, cfg); err != nil {
		return nil, err
	}
	tokens := strings.Split(cfg.FilterSubject, ".")
	kc := &KeyedConsumer{h: h, stream: stream, cfg: cfg, tokens: tokens, keyAt: slices.Index(tokens, "*"), keys: map[string]*keyPuller{}}
	kc.ctx, kc.cancel = context.WithCancel(context.Background())
	kc.wg.Add(1)
	go kc.discover()
	return kc, nil
}

// keyedUsable checks what ConsumeByKey needs of h, stream and cfg.
func (h *Handler) keyedUsable(stream jetstream.Stream, cfg jetstream.ConsumerConfig) error {
	bad := func(field, reason string) error {
		return &throttle.OptionError{Field: "ConsumeByKey" + field, Reason: reason}
	}
	switch {
	case h == nil || h.next == nil || h.gate == nil:
		return bad("", "the Handler was not built by New")
	case h.sched == nil:
		return bad("", "the Handler needs WithConcurrency(n), the handlers it shares, and WithFair on")
	case stream == nil:
		return bad(".stream", "must not be nil")
	case cfg.Durable == "":
		return bad(".Durable", "must name the consumers")
	case cfg.AckPolicy != jetstream.AckExplicitPolicy:
		return bad(".AckPolicy", "must be AckExplicitPolicy")
	case len(cfg.FilterSubjects) > 0:
		return bad(".FilterSubjects", "must be empty: FilterSubject names the key")
	case countToken(cfg.FilterSubject, "*") != 1:
		return bad(".FilterSubject", fmt.Sprintf("%q must have exactly one \"*\" token, the key", cfg.FilterSubject))
	}
	ackWait := cfg.AckWait
	if ackWait == 0 {
		ackWait = DefaultAckWait
	}
	if !h.cfg.consumerKnown || h.cfg.ackWait != ackWait || h.cfg.maxDeliver != max(cfg.MaxDeliver, 0) || !slices.Equal(h.cfg.backOff, cfg.BackOff) {
		return bad("", "build the Handler with WithConsumerConfig(cfg): it must know the consumers' AckWait, MaxDeliver and BackOff")
	}
	return nil
}

// countToken counts the tokens of subject equal to token.
func countToken(subject, token string) int {
	n := 0
	for _, t := range strings.Split(subject, ".") {
		if t == token {
			n++
		}
	}
	return n
}

// Stop stops pulling: no message is pulled after it returns. Messages that
// waited for their handler or their retry-after are NAKed (with what was
// left of their wait), so another process can take them; messages already
// running are not waited for (Close the Handler for that). Stop is safe to
// call more than once.
func (kc *KeyedConsumer) Stop() {
	kc.cancel()
	kc.wg.Wait()
}

// Keys returns the keys seen so far, sorted.
func (kc *KeyedConsumer) Keys() []string {
	kc.mu.Lock()
	defer kc.mu.Unlock()
	keys := make([]string, 0, len(kc.keys))
	for k := range kc.keys {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Pulled returns how many messages this KeyedConsumer has pulled (every
// delivery to it, redeliveries included).
func (kc *KeyedConsumer) Pulled() int64 { return kc.delivered.Load() }

// Deliveries returns the deliveries the server counts over every per-key
// consumer (ConsumerInfo.Delivered.Consumer, summed), across every process
// sharing them; an error if one of them does not answer.
func (kc *KeyedConsumer) Deliveries(ctx context.Context) (int, error) {
	kc.mu.Lock()
	pullers := make([]*keyPuller, 0, len(kc.keys))
	for _, p := range kc.keys {
		pullers = append(pullers, p)
	}
	kc.mu.Unlock()
	n := 0
	for _, p := range pullers {
		info, err := kc.stream.Consumer(ctx, p.cfg.Durable)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue // not created yet: nothing delivered
		}
		if err != nil {
			return 0, fmt.Errorf("natsthrottle: consumer %s: %w", p.cfg.Durable, err)
		}
		n += int(info.CachedInfo().Delivered.Consumer)
	}
	return n, nil
}

// LastError returns the last error met while listing keys, creating
// consumers or pulling (nil if none).
func (kc *KeyedConsumer) LastError() error {
	if p := kc.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// report records err and passes it to the error handler and the logger.
func (kc *KeyedConsumer) report(err error) {
	if kc.ctx.Err() != nil {
		return
	}
	err = fmt.Errorf("natsthrottle: ConsumeByKey: %w", err)
	kc.lastErr.Store(&err)
	if kc.h.cfg.onError != nil {
		kc.h.cfg.onError(nil, err)
	}
	if kc.h.cfg.logger != nil {
		kc.h.cfg.logger.Error("natsthrottle: consumer error", "error", err)
	}
}

// discover lists the keys now and every DiscoverInterval until Stop.
func (kc *KeyedConsumer) discover() {
	defer kc.wg.Done()
	tick := time.NewTicker(DiscoverInterval)
	defer tick.Stop()
	for {
		kc.listKeys()
		select {
		case <-kc.ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// listKeys starts a puller for every key of the stream's subjects not seen
// before.
func (kc *KeyedConsumer) listKeys() {
	ctx, cancel := context.WithTimeout(kc.ctx, apiTimeout)
	defer cancel()
	info, err := kc.stream.Info(ctx, jetstream.WithSubjectFilter(kc.cfg.FilterSubject))
	if err != nil {
		kc.report(fmt.Errorf("list the subjects of %s: %w", kc.cfg.FilterSubject, err))
		return
	}
	for subject := range info.State.Subjects {
		tokens := strings.Split(subject, ".")
		if len(tokens) > kc.keyAt {
			kc.add(tokens[kc.keyAt])
		}
	}
}

// add starts the puller of key, unless it runs already.
func (kc *KeyedConsumer) add(key string) {
	kc.mu.Lock()
	defer kc.mu.Unlock()
	if _, ok := kc.keys[key]; ok || kc.ctx.Err() != nil {
		return
	}
	cfg := kc.cfg
	tokens := slices.Clone(kc.tokens)
	tokens[kc.keyAt] = key
	cfg.FilterSubject = strings.Join(tokens, ".")
	cfg.Durable = keyConsumerName(kc.cfg.Durable, key)
	cfg.Name = ""
	p := &keyPuller{key: key, cfg: cfg}
	kc.keys[key] = p
	kc.wg.Add(1)
	go kc.pull(p)
}

// keyConsumerName is base + "_" + key, key escaped to letters, digits and
// "-" ("_" as "__", any other byte as "_" and two hex digits), so that two
// keys never share a consumer.
func keyConsumerName(base, key string) string {
	var b strings.Builder
	b.WriteString(base)
	b.WriteByte('_')
	for i := 0; i < len(key); i++ {
		switch c := key[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-':
			b.WriteByte(c)
		case c == '_':
			b.WriteString("__")
		default:
			fmt.Fprintf(&b, "_%02x", c)
		}
	}
	return b.String()
}

// pull pulls p's messages one at a time until Stop: the next one once the
// last has started (see take).
func (kc *KeyedConsumer) pull(p *keyPuller) {
	defer kc.wg.Done()
	for kc.ctx.Err() == nil {
		if p.cons == nil {
			ctx, cancel := context.WithTimeout(kc.ctx, apiTimeout)
			cons, err := kc.stream.CreateOrUpdateConsumer(ctx, p.cfg)
			cancel()
			if err != nil {
				kc.report(fmt.Errorf("create consumer %s: %w", p.cfg.Durable, err))
				sleep(kc.ctx, retryEvery)
				continue
			}
			p.cons = cons
		}
		ctx, cancel := context.WithTimeout(kc.ctx, fetchWait)
		batch, err := p.cons.Fetch(1, jetstream.FetchContext(ctx))
		if err == nil {
			got := false
			for msg := range batch.Messages() {
				got = true
				kc.delivered.Add(1)
				kc.take(p.key, msg)
			}
			if !got {
				kc.h.sched.SetBacklog(p.key, 0)
			}
			err = batch.Error()
		}
		cancel()
		if err != nil && !quietFetchError(err) && kc.ctx.Err() == nil {
			kc.report(fmt.Errorf("fetch from %s: %w", p.cfg.Durable, err))
			if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) {
				p.cons = nil
			}
			sleep(kc.ctx, retryEvery)
		}
	}
}

// quietFetchError reports whether err only says the pull request ended
// without a message.
func quietFetchError(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, jetstream.ErrNoMessages) || errors.Is(err, nats.ErrTimeout)
}

// take is the life of one pulled message until it starts: it waits for a
// handler in the fair shares of key (sending InProgress every heartbeat
// interval), then its limits decide (judge); a refusal blocks the key
// until its retry-after and the message waits again; an admission runs
// the wrapped handler on a goroutine of its own, and take returns, so
// that the key's next message is pulled.
func (kc *KeyedConsumer) take(key string, msg jetstream.Msg) {
	h := kc.h
	ctx, span := h.startSpan(msg)
	if md, err := msg.Metadata(); err == nil {
		h.sched.SetBacklog(key, int(md.NumPending))
	}
	tkey, cost, err := h.request(msg)
	if err != nil {
		h.terminate(ctx, span, msg, err)
		span.End()
		return
	}
	r := &request{msg: msg, key: tkey, cost: cost, arrived: time.Now(), keyed: true}
	r.id, r.waitKey, r.delivery = requestID(msg)
	t := h.sched.Arrive(key, fair.Arrival{})
	beat := time.NewTicker(h.heartbeat)
	defer beat.Stop()
	var blockedUntil time.Time
	for {
		select {
		case <-t.Granted():
			v := h.judge(ctx, span, r)
			switch {
			case v.done:
				t.Leave(fair.Block{})
				span.End()
				return
			case v.run:
				kc.start(ctx, span, r, t, v)
				return
			}
			blockedUntil = time.Now().Add(v.retry)
			t.Retry(fair.Block{Until: blockedUntil, UntilDone: v.refused})
			if v.refused {
				blockedUntil = time.Time{} // may come sooner
			}
		case <-beat.C:
			h.inProgress(ctx, span, msg)
		case <-kc.ctx.Done():
			t.Leave(fair.Block{})
			if h.lastDelivery(msg) {
				h.abandon(ctx, span, msg) // a NAK would drop it (MaxDeliver)
			} else {
				h.nak(ctx, span, msg, max(time.Until(blockedUntil), 0), false)
			}
			span.End()
			return
		}
	}
}

// start runs the wrapped handler on r, admitted with v.slot, on a
// goroutine of its own that frees t's handler when it returns; Close waits
// for it. Once the Handler is closing, it runs on the caller's goroutine.
func (kc *KeyedConsumer) start(ctx context.Context, span trace.Span, r *request, t *fair.Ticket, v verdict) {
	h := kc.h
	runIt := func() {
		defer span.End()
		defer t.Done()
		h.run(ctx, span, r, v.slot)
	}
	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		runIt()
		return
	}
	h.wg.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.wg.Done()
		runIt()
	}()
}

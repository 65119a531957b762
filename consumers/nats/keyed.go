package natsthrottle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/queuethrottle/queuethrottle/internal/fair"
	"github.com/queuethrottle/queuethrottle/internal/inflight"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// Timing of a KeyedConsumer.
const (
	// DiscoverInterval is how often a KeyedConsumer lists the stream's
	// subjects for new keys: about the longest the first message of a new
	// key waits to be seen. A stream with many subjects spaces the
	// listings to 10 µs per subject.
	DiscoverInterval = 20 * time.Millisecond
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
	wrap      func(jetstream.Msg) jetstream.Msg // WrapPulled
}

// KeyedOption configures ConsumeByKey.
type KeyedOption func(*KeyedConsumer)

// WrapPulled passes every message the KeyedConsumer pulls through f before
// anything else sees it; what f returns is the message from then on, so f
// may wrap it to observe its acknowledgements (a NAK, an InProgress, a
// Term) or note when it arrived. f must return a message of the same
// delivery. Nil keeps the message as pulled.
func WrapPulled(f func(jetstream.Msg) jetstream.Msg) KeyedOption {
	return func(kc *KeyedConsumer) { kc.wrap = f }
}

// keyPuller pulls one key's messages through its own durable consumer.
type keyPuller struct {
	key string
	cfg jetstream.ConsumerConfig

	mu        sync.Mutex
	ahead     int           // pulled messages that have not started and hold no reservation
	reserved  int           // pulled messages that wait for their reserved slot
	freed     chan struct{} // signalled when ahead or reserved drops
	firstCost int           // the cost of the key's first message pulled (0: none yet)
	mixed     bool          // a message of the key cost other than firstCost
	rtt       time.Duration // moving average of the key's rate decisions
	gap       time.Duration // moving average between the key's admissions
	lastRun   time.Time     // of the key's last admission

	last *decisionTurn // of the message pulled last; only the pull loop touches it
}

// Messages of a key pulled ahead of their start. keyAhead may wait for
// their handlers at once: the next is pulled (and its rate decides) while
// the last waits, so that a key at its rate is never decided late because
// its last message waited for a handler. A slow store adds as many as the
// key admits during two of its decisions (the decision and the claim of a
// reserved slot), up to maxKeyAhead: otherwise a key could never start
// faster than one message per decision round trip.
//
// Once a key has had messages of more than one cost, a message that
// holds a reservation is not counted among them: it has its slot, and the
// key's next message is pulled and decided at once, so that a small
// message takes a gap before a larger one's slot as it would had the
// whole backlog been decided on arrival (the exact schedule). At most
// maxKeyReserved wait for their slots at once; the Gate's horizon bounds
// how far ahead they lie (a message refused beyond it holds no
// reservation and counts among those ahead). A key of equal costs keeps
// counting them: its schedule has no gaps, and reservations held far
// ahead would only crowd a limit it shares with other keys (a partner's,
// under throttle.All), where a pause or a lowered limit moves them.
const (
	keyAhead       = 2
	maxKeyAhead    = 16
	maxKeyReserved = 64
)

// limit is how many of p's messages without a reservation may be pulled
// ahead of their start.
func (p *keyPuller) limit() int {
	if p.gap <= 0 {
		return keyAhead
	}
	return min(keyAhead+int(2*p.rtt/p.gap), maxKeyAhead)
}

// pullAhead waits until one more of p's messages may be pulled and counts
// it ahead; false if ctx ended first.
func (p *keyPuller) pullAhead(ctx context.Context) bool {
	for {
		p.mu.Lock()
		held := p.ahead
		if !p.mixed {
			held += p.reserved
		}
		if held < p.limit() && p.reserved < maxKeyReserved {
			p.ahead++
			p.mu.Unlock()
			return true
		}
		p.mu.Unlock()
		select {
		case <-p.freed:
		case <-ctx.Done():
			return false
		}
	}
}

// noteCost notes cost, of one of p's messages, and reports whether p's
// messages have had more than one cost so far. From then on, those
// holding a reservation no longer count among the messages ahead (see
// pullAhead), and the key's first decisions go in the order pulled (see
// decisionTurn). Only then may a reserved slot leave a gap before it
// that a later message can take: a key whose messages all cost the same
// is scheduled without gaps, whatever the order of its decisions, and
// holding more of its reservations here gains nothing.
func (p *keyPuller) noteCost(cost int) bool {
	p.mu.Lock()
	switch {
	case p.firstCost == 0:
		p.firstCost = cost
	case cost != p.firstCost && !p.mixed:
		p.mixed = true
		defer p.wake()
	}
	mixed := p.mixed
	p.mu.Unlock()
	return mixed
}

// move adds da to p's messages ahead and dr to those reserved, and wakes
// the pull loop if either dropped.
func (p *keyPuller) move(da, dr int) {
	p.mu.Lock()
	p.ahead += da
	p.reserved += dr
	p.mu.Unlock()
	if da < 0 || dr < 0 {
		p.wake()
	}
}

// wake wakes p's pull loop to look at its counts again.
func (p *keyPuller) wake() {
	select {
	case p.freed <- struct{}{}:
	default:
	}
}

// started uncounts one of p's messages pulled ahead: it started or ended.
func (p *keyPuller) started() { p.move(-1, 0) }

// pulledMsg is how one pulled message is counted in its keyPuller until
// it starts or ends: ahead, or reserved.
type pulledMsg struct {
	p        *keyPuller
	reserved bool
	ended    bool
}

// hold counts m as reserved (it holds its own slot) or not.
func (m *pulledMsg) hold(reserved bool) {
	switch {
	case m.ended || m.reserved == reserved:
	case reserved:
		m.p.move(-1, 1)
	default:
		m.p.move(1, -1)
	}
	m.reserved = reserved
}

// end uncounts m: it started or ended. Later calls do nothing.
func (m *pulledMsg) end() {
	if m.ended {
		return
	}
	m.ended = true
	if m.reserved {
		m.p.move(0, -1)
	} else {
		m.p.move(-1, 0)
	}
}

// decisionTurn keeps a key's first decisions in the order its messages were
// pulled, the order the exact schedule decides them in: a message asks
// once the message pulled before it has its answer, or has been asking
// for turnGap (a slow store then carries both, in order, without one
// waiting for the other's round trip).
type decisionTurn struct {
	asked, answered chan struct{}
	askOnce, once   sync.Once
}

// turnGap is how long a message's first decision waits for the answer to
// the one pulled before it.
const turnGap = time.Millisecond

func newDecisionTurn() *decisionTurn {
	return &decisionTurn{asked: make(chan struct{}), answered: make(chan struct{})}
}

// ask marks t's first decision asked.
func (t *decisionTurn) ask() { t.askOnce.Do(func() { close(t.asked) }) }

// answer marks t's first decision answered (or never to be asked).
func (t *decisionTurn) answer() {
	t.ask()
	t.once.Do(func() { close(t.answered) })
}

// wait waits for the turn of the message pulled after t's (at once if t
// is nil), or until ctx is done.
func (t *decisionTurn) wait(ctx context.Context) {
	if t == nil {
		return
	}
	select {
	case <-t.asked:
	case <-ctx.Done():
		return
	}
	timer := time.NewTimer(turnGap)
	defer timer.Stop()
	select {
	case <-t.answered:
	case <-timer.C:
	case <-ctx.Done():
	}
}

// decided folds a rate decision of p's that took took, and admitted or
// not, into the averages limit reads (weight 1/4).
func (p *keyPuller) decided(took time.Duration, admitted bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rtt = average(p.rtt, took)
	if !admitted {
		return
	}
	now := time.Now()
	if !p.lastRun.IsZero() {
		p.gap = average(p.gap, max(now.Sub(p.lastRun), time.Millisecond))
	}
	p.lastRun = now
}

// average is the moving average avg with d folded in at weight 1/4.
func average(avg, d time.Duration) time.Duration {
	if avg <= 0 {
		return d
	}
	return avg + (d-avg)/4
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
// A key has few messages in process that have not started and hold no
// reservation: 2, and with a slow store as many more as the key admits
// during two decision round trips, at most 16. Each is decided by the
// Gate as it is pulled, waits for its handler in the
// Handler's fair shares (WithConcurrency(n) handlers, WithWeights), then
// takes its in-flight slot (WithInFlight) and runs; the key's next message
// is pulled when one of them starts. A message its limits refuse is not
// NAKed: it waits in process with InProgress heartbeats (a third of
// AckWait apart) until its retry-after (or, refused an in-flight slot,
// until a handler of its key ends here). Once a key has had messages of
// more than one cost (WithCostFunc), one refused with a reservation of
// its own (throttle.WithReservations) no longer counts among the 2: the
// key's next message is pulled and decided at once, in the order pulled,
// so that a key's backlog is scheduled as if decided on arrival, a small
// message taking the gap before a larger one's slot (the exact schedule);
// at most 64 of a key wait for their reserved slots at once, within the
// Gate's horizon. The key's other messages wait in the stream meanwhile.
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
func (h *Handler) ConsumeByKey(stream jetstream.Stream, cfg jetstream.ConsumerConfig, opts ...KeyedOption) (*KeyedConsumer, error) {
	if err := h.keyedUsable(stream, cfg); err != nil {
		return nil, err
	}
	tokens := strings.Split(cfg.FilterSubject, ".")
	kc := &KeyedConsumer{h: h, stream: stream, cfg: cfg, tokens: tokens, keyAt: slices.Index(tokens, "*"), keys: map[string]*keyPuller{}}
	for _, o := range opts {
		if o != nil {
			o(kc)
		}
	}
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
	kc.h.reportPull(err)
}

// discover lists the keys now and then every DiscoverInterval, or every
// 10 µs per subject listed if that is longer, until Stop.
func (kc *KeyedConsumer) discover() {
	defer kc.wg.Done()
	for {
		n := kc.listKeys()
		if !sleep(kc.ctx, max(DiscoverInterval, time.Duration(n)*listPerSubject)) {
			return
		}
	}
}

// listPerSubject spaces the listings of a stream with many subjects.
const listPerSubject = 10 * time.Microsecond

// listKeys starts a puller for every key of the stream's subjects not seen
// before, and returns how many subjects it listed.
func (kc *KeyedConsumer) listKeys() int {
	ctx, cancel := context.WithTimeout(kc.ctx, apiTimeout)
	defer cancel()
	info, err := kc.stream.Info(ctx, jetstream.WithSubjectFilter(kc.cfg.FilterSubject))
	if err != nil {
		kc.report(fmt.Errorf("list the subjects of %s: %w", kc.cfg.FilterSubject, err))
		return 0
	}
	for subject := range info.State.Subjects {
		tokens := strings.Split(subject, ".")
		if len(tokens) > kc.keyAt {
			kc.add(tokens[kc.keyAt])
		}
	}
	return len(info.State.Subjects)
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
	p := &keyPuller{key: key, cfg: cfg, freed: make(chan struct{}, 1)}
	kc.keys[key] = p
	kc.wg.Add(1)
	go kc.pull(p)
}

// maxConsumerName is the longest consumer name the server takes.
const maxConsumerName = 255

// keyConsumerName is base + "_" + key, key escaped to letters, digits and
// "-" ("_" as "__", any other byte as "_" and two hex digits), so that two
// keys never share a consumer. A name that would be longer than the
// server allows keeps the first 100 bytes of the escaped key and a
// SHA-256 of the whole key ("_h" and 32 hex digits).
func keyConsumerName(base, key string) string {
	name := escapedName(base, key)
	if len(name) <= maxConsumerName {
		return name
	}
	sum := sha256.Sum256([]byte(key))
	short := escapedName(base, key)[:min(len(base)+1+100, maxConsumerName-34)]
	return short + "_h" + hex.EncodeToString(sum[:16])
}

// escapedName is base + "_" + key escaped (see keyConsumerName).
func escapedName(base, key string) string {
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

// pull pulls p's messages one at a time until Stop, each while fewer than
// p.limit() pulled before it have not started, and hands each to take on
// a goroutine of its own.
func (kc *KeyedConsumer) pull(p *keyPuller) {
	defer kc.wg.Done()
	pl := &puller{
		wait: fetchWait,
		cons: func(ctx context.Context) (jetstream.Consumer, error) {
			ctx, cancel := context.WithTimeout(ctx, apiTimeout)
			defer cancel()
			cons, err := kc.stream.CreateOrUpdateConsumer(ctx, p.cfg)
			if err != nil {
				return nil, fmt.Errorf("create consumer %s: %w", p.cfg.Durable, err)
			}
			return cons, nil
		},
		room: func(ctx context.Context) int {
			if !p.pullAhead(ctx) {
				return 0
			}
			return 1
		},
		take: func(msg jetstream.Msg) {
			kc.delivered.Add(1)
			if kc.wrap != nil {
				msg = kc.wrap(msg)
			}
			// The cost is noted here, in the order pulled, so that every
			// message after the first of another cost waits its turn.
			a := arrival{msg: msg, prev: p.last, turn: newDecisionTurn()}
			a.key, a.cost, a.err = kc.h.request(msg)
			a.mixed = a.err == nil && p.noteCost(a.cost)
			p.last = a.turn
			kc.wg.Add(1)
			go kc.take(p, a)
		},
		empty: func() {
			kc.h.sched.SetBacklog(p.key, 0)
			p.started()
		},
		report: func(err error) { kc.report(fmt.Errorf("%s: %w", p.cfg.Durable, err)) },
	}
	pl.run(kc.ctx)
}

// arrival is a message as pulled: its key and cost (or the error that
// names neither), whether its key had mixed costs by then (see noteCost),
// and its turn among the key's first decisions after prev's.
type arrival struct {
	msg        jetstream.Msg
	key        string
	cost       int
	err        error
	mixed      bool
	prev, turn *decisionTurn
}

// take is the life of one pulled message until it starts. Its rate
// decides at once, as it arrives (deciding once a handler is free would
// push a key that sends at its rate later with every wait, for good),
// and, once its key has had mixed costs, in the order the key's messages
// were pulled (after a.prev's; a.turn is its own); refused, it waits here
// for the retry-after. Admitted, it waits for a handler in its key's fair
// share (await). Until it starts it is counted among p's messages pulled
// ahead, or, while it holds a reservation, among those reserved (see
// maxKeyReserved and pullAhead).
func (kc *KeyedConsumer) take(p *keyPuller, a arrival) {
	defer kc.wg.Done()
	mine, msg := a.turn, a.msg
	defer mine.answer()
	h := kc.h
	ctx, span := h.startSpan(msg)
	if md, err := msg.Metadata(); err == nil {
		h.sched.SetBacklog(p.key, int(md.NumPending))
	}
	m := &pulledMsg{p: p}
	if a.err != nil {
		h.terminate(ctx, span, msg, a.err)
		span.End()
		m.end()
		return
	}
	r := &request{msg: msg, key: a.key, cost: a.cost, arrived: time.Now(), keyed: true}
	r.id, r.waitKey, r.delivery = requestID(msg)
	beat := time.NewTicker(h.heartbeat)
	if a.mixed {
		a.prev.wait(kc.ctx)
	}
	for {
		asked := time.Now()
		mine.ask()
		v := h.rate(ctx, span, r)
		mine.answer()
		p.decided(time.Since(asked), v.run)
		if v.done {
			beat.Stop()
			span.End()
			m.end()
			return
		}
		if v.run {
			m.hold(false)
			break
		}
		m.hold(v.reserved)
		h.dispose(ctx, r, DispositionWait)
		// Asked again at the retry-after, not before: with stacked
		// limits (throttle.All) the parts' slots differ by up to a round
		// trip, the latest being the retry-after, and a claim between
		// them would claim the earlier part's slot, see a later one
		// refuse, and have All give that slot back and reserve its next
		// free one, at the tail of a full schedule: the slot would go
		// unused.
		if !kc.pause(ctx, span, r, v.retry, beat) {
			beat.Stop()
			m.end()
			return
		}
	}
	t := h.sched.Arrive(p.key, fair.Arrival{})
	defer beat.Stop()
	defer m.end()
	kc.await(ctx, span, r, t, beat)
}

// await waits for the admitted r's handler in its key's fair share, then
// takes its in-flight slot (refused, the key waits for one of its handlers
// to end here) and runs it on a goroutine of its own (start). InProgress
// goes out with beat meanwhile.
func (kc *KeyedConsumer) await(ctx context.Context, span trace.Span, r *request, t *fair.Ticket, beat *time.Ticker) {
	h := kc.h
	for {
		select {
		case <-t.Granted():
			s, retry, refused, ok := h.acquire(ctx, span, r)
			if ok {
				kc.start(ctx, span, r, t, s)
				return
			}
			t.Retry(fair.Block{Until: time.Now().Add(retry), UntilDone: refused})
		case <-beat.C:
			h.inProgress(ctx, span, r.msg)
		case <-kc.ctx.Done():
			t.Leave(fair.Block{})
			kc.giveBack(ctx, span, r, 0)
			return
		}
	}
}

// pause keeps r here for d, sending InProgress with beat, and reports
// false if Stop came first (r is then given back).
func (kc *KeyedConsumer) pause(ctx context.Context, span trace.Span, r *request, d time.Duration, beat *time.Ticker) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	until := time.Now().Add(d)
	for {
		select {
		case <-timer.C:
			return true
		case <-beat.C:
			kc.h.inProgress(ctx, span, r.msg)
		case <-kc.ctx.Done():
			kc.giveBack(ctx, span, r, time.Until(until))
			return false
		}
	}
}

// giveBack hands r, which has not started, back to the server at Stop: a
// NAK to come back after left, so that another process can take it, or,
// on its last delivery (a NAK would drop it), left unacknowledged. It
// ends span.
func (kc *KeyedConsumer) giveBack(ctx context.Context, span trace.Span, r *request, left time.Duration) {
	if kc.h.lastDelivery(r.msg) {
		kc.h.abandon(ctx, span, r.msg)
	} else {
		kc.h.nak(ctx, span, r, DispositionNak, max(left, 0), false)
	}
	span.End()
}

// start runs the wrapped handler on r, admitted with slot s, on a
// goroutine of its own that frees t's handler when it returns; Close waits
// for it. Once the Handler is closing, it runs on the caller's goroutine.
func (kc *KeyedConsumer) start(ctx context.Context, span trace.Span, r *request, t *fair.Ticket, s *inflight.Slot) {
	h := kc.h
	runIt := func() {
		defer span.End()
		defer t.Done()
		h.run(ctx, span, r, s)
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

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/queuethrottle/queuethrottle/bucket"
	"github.com/queuethrottle/queuethrottle/throttle"
)

// With -instances N, the main process publishes the jobs and N worker
// processes consume them: each is this program's own binary, run again
// with -worker-only, consuming from the same durable consumer with the
// Redis limiter (one key prefix for all). A worker process sends what
// happens (admissions with their clock readings, handler runs, NAKs, ...)
// to the main process as JSON lines on its stdout, as it happens; the main
// process merges them and checks all processes together, exactly as it
// checks one. A worker process stops when its stdin closes: when the main
// process is done with it, or dies (on Linux it is also killed then, by
// Pdeathsig).

// childEnv is set in the environment of worker processes. The program
// itself does not need it; a test binary that runs itself as the worker
// (os.Executable is the test binary) looks for it in TestMain.
const childEnv = "QUEUETHROTTLE_EXAMPLE_WORKER_PROCESS"

// record is one JSON line from a worker process.
type record struct {
	Kind   string   `json:"kind"` // "admit", "refund", "handle", "ack", "nak", "hold", "term", "given_up", "ready", "metrics", "error" or "done"
	Tenant string   `json:"tenant,omitempty"`
	N      int      `json:"n,omitempty"`      // admit: cost units
	ID     string   `json:"id,omitempty"`     // admit, refund: the admission's identity; ack: the job
	Before int64    `json:"before,omitempty"` // admit: clock before the decision, Unix ns
	After  int64    `json:"after,omitempty"`  // admit: clock after the decision, Unix ns
	Run    *handled `json:"run,omitempty"`    // handle
	Seq    uint64   `json:"seq,omitempty"`    // hold: stream sequence; ack: delivery count
	At     int64    `json:"at,omitempty"`     // nak, hold: when it was sent; ack: when it was confirmed; Unix ns (0: when received)
	// Reserved, on a nak, reports that its decision reserved the
	// message's own slot.
	Reserved bool                `json:"reserved,omitempty"`
	Addr     string              `json:"addr,omitempty"`    // metrics: where the process serves its metrics
	Err      string              `json:"err,omitempty"`     // error: a line for the summary
	Hybrid   *bucket.HybridStats `json:"hybrid,omitempty"`  // done: the hybrid's decisions
	Longest  time.Duration       `json:"longest,omitempty"` // done: the process's longest limiter decision
	// Deliveries, on done, counts the deliveries the process saw.
	Deliveries int64 `json:"deliveries,omitempty"`
}

// recordWriter sends the events of a worker process as records, one JSON
// line each. It is safe for concurrent use.
type recordWriter struct {
	mu  sync.Mutex
	enc *json.Encoder
	err error // first write error; later records are dropped
}

var _ events = (*recordWriter)(nil)

func newRecordWriter(w io.Writer) *recordWriter { return &recordWriter{enc: json.NewEncoder(w)} }

func (w *recordWriter) send(r record) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = w.enc.Encode(r)
	}
}

func (w *recordWriter) admitted(tenant, id string, n int, before, after time.Time) {
	w.send(record{Kind: "admit", Tenant: tenant, ID: id, N: n, Before: before.UnixNano(), After: after.UnixNano()})
}

func (w *recordWriter) refunded(tenant, id string) {
	w.send(record{Kind: "refund", Tenant: tenant, ID: id})
}

func (w *recordWriter) handle(h handled) { w.send(record{Kind: "handle", Run: &h}) }

func (w *recordWriter) acked(id string, _ int, delivery uint64, at time.Time) {
	w.send(record{Kind: "ack", ID: id, Seq: delivery, At: at.UnixNano()})
}

func (w *recordWriter) nak(tenant string, at time.Time, reserved bool) {
	w.send(record{Kind: "nak", Tenant: tenant, At: at.UnixNano(), Reserved: reserved})
}

func (w *recordWriter) hold(tenant string, seq uint64, at time.Time) {
	w.send(record{Kind: "hold", Tenant: tenant, Seq: seq, At: at.UnixNano()})
}

func (w *recordWriter) term(tenant string) { w.send(record{Kind: "term", Tenant: tenant}) }

func (w *recordWriter) givenUp(tenant string) { w.send(record{Kind: "given_up", Tenant: tenant}) }

// workerProcess is the -worker-only mode: consume the jobs of the stream
// on the NATS server at cfg.NATSURL with the Redis limiter under
// cfg.KeyPrefix, send records to out, and stop when stop is closed (stdin
// at EOF) or ctx is done.
func workerProcess(ctx context.Context, cfg config, stop <-chan struct{}, out io.Writer) error {
	if cfg.NATSURL == "" || cfg.RedisURL == "" || cfg.KeyPrefix == "" {
		return errors.New("-worker-only is for the worker processes of -instances: it needs -nats, -redis and -key-prefix")
	}
	jf, err := loadJobs(cfg.JobsPath)
	if err != nil {
		return err
	}
	spec, err := parseLimiterSpec(cfg.Limiter, cfg.Burst, cfg.RedisURL)
	if err != nil {
		return err
	}
	spec.Timeout = cfg.RedisTimeout
	q, err := loadQuotas(cfg, jf)
	if err != nil {
		return err
	}
	q.hashKey = cfg.KeyPrefix + "quotas"
	pset, err := parsePartner(cfg.Partner, "", "")
	if err != nil {
		return err
	}
	pset.MaxCost = jf.maxCost()
	var cl closers
	defer cl.run()
	rc, err := dialRedis(ctx, cfg.RedisURL, &cl)
	if err != nil {
		return err
	}
	mp, metricsAddr, err := serveMetrics(cfg.Metrics, &cl)
	if err != nil {
		return err
	}
	spec.Meters = mp
	if spec.Partner, pset.adapt, err = newPartnerLimit(pset, rc, cfg.KeyPrefix, spec.timeout()); err != nil {
		return err
	}
	lim, _, err := newLimiter(ctx, spec, rc, cfg.KeyPrefix, q, &cl)
	if err != nil {
		return err
	}
	rw := newRecordWriter(out)
	lim.admitted, lim.refunded = rw.admitted, rw.refunded
	if metricsAddr != "" {
		rw.send(record{Kind: "metrics", Addr: metricsAddr})
	}
	tp := noop.NewTracerProvider()
	gate, err := throttle.NewGate(lim, throttle.WithTracerProvider(tp), throttle.WithMeterProvider(mp), throttle.WithKeyMetrics(nil, maxTenantSeries), throttle.WithReservations(cfg.Reservations))
	if err != nil {
		return err
	}
	// Every worker process shares the in-flight slots in Redis.
	inf, err := newInFlight(cfg.InFlight, rc, cfg.KeyPrefix+"inflight:", cfg.RedisTimeout)
	if err != nil {
		return err
	}
	nc, err := connect(cfg.NATSURL, &cl)
	if err != nil {
		return err
	}
	w := &worker{rec: rw, tracer: tp.Tracer(scopeName), proc: cfg.WorkerID, reserved: newReservedIDs(), work: cfg.Work}
	if cfg.PartnerURL != "" {
		w.partner = newPartnerClient(cfg.PartnerURL, cfg.Handlers, pset.adapt)
	}
	lim.rejected = w.reserved.set
	stopConsumer := func() {}
	if cfg.Core {
		// Core NATS keeps nothing for a subscriber that is not there yet:
		// the main process publishes once every process is ready.
		if _, err := consumeCore(nc, cfg, jf.weight, gate, inf, w, &cl); err != nil {
			return err
		}
	} else {
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		src, err := findSource(ctx, js, cfg)
		if err != nil {
			return err
		}
		if stopConsumer, err = consume(src, cfg, jf.weight, gate, inf, w, tp); err != nil {
			return err
		}
		cl.add(stopConsumer)
	}
	rw.send(record{Kind: "ready"})

	select {
	case <-stop:
	case <-ctx.Done():
	}
	stopConsumer()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lim.close(ctx) // return a hybrid's unused tokens before its stats
	for _, e := range w.handlerErrs.lines("handler error") {
		rw.send(record{Kind: "error", Err: e})
	}
	for _, e := range w.throttleErrs.lines("throttle error") {
		rw.send(record{Kind: "error", Err: e})
	}
	done := record{Kind: "done", Deliveries: w.delivered.Load(), Longest: lim.longestDecision()}
	if hs, ok := lim.hybridStats(); ok {
		done.Hybrid = &hs
	}
	rw.send(done)
	return rw.err
}

// closedOnEOF returns a channel closed when r reaches EOF (or fails).
func closedOnEOF(r io.Reader) <-chan struct{} {
	c := make(chan struct{})
	go func() {
		io.Copy(io.Discard, r)
		close(c)
	}()
	return c
}

// process is a running worker process.
type process struct {
	id     int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	read   chan struct{} // closed when its stdout is read to the end
	done   bool          // sent its "done" record
	killed bool          // killed on purpose (kill-worker): its end is no failure
}

// processes are the worker processes of a run and what they report.
type processes struct {
	rec    *recorder
	out    io.Writer  // where the main process prints
	exited chan error // a process ended before it was asked to stop

	// What starts a process: this program's binary and its arguments.
	cfg                config
	exe, jobsPath      string
	natsURL, keyPrefix string

	mu       sync.Mutex
	list     []*process
	errs     errorLog
	hybrid   bucket.HybridStats
	isHybrid bool
	longest  time.Duration // the longest limiter decision of any process
	stopping bool

	deliveries atomic.Int64  // the deliveries the processes saw (their done records)
	ready      chan struct{} // a process is consuming (its ready record)
}

// startProcesses starts n worker processes (os.Executable() with
// -worker-only and the settings of cfg) whose records go to rec, and
// what the main process should print of them to out (safe for concurrent
// use). With -metrics, process id serves its metrics on the port of
// cfg.Metrics plus id (see processMetricsAddr). The
// caller must call stop.
func startProcesses(cfg config, n int, natsURL, keyPrefix string, rec *recorder, out io.Writer) (*processes, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("-instances: find this program's binary: %w", err)
	}
	jobsPath, err := filepath.Abs(cfg.JobsPath)
	if err != nil {
		return nil, err
	}
	// Room for a replacement per process, so a send never blocks.
	ps := &processes{rec: rec, out: out, exited: make(chan error, 2*n), ready: make(chan struct{}, 2*n), cfg: cfg, exe: exe, jobsPath: jobsPath, natsURL: natsURL, keyPrefix: keyPrefix}
	for id := 1; id <= n; id++ {
		if err := ps.start(id); err != nil {
			ps.stop(0)
			return nil, err
		}
	}
	return ps, nil
}

// start starts worker process id.
func (ps *processes) start(id int) error {
	cfg := ps.cfg
	args := []string{"-worker-only", "-worker-id", strconv.Itoa(id), "-key-prefix", ps.keyPrefix,
		"-nats", ps.natsURL, "-redis", cfg.RedisURL, "-jobs", ps.jobsPath,
		"-rate", cfg.Rate, "-rates", cfg.RatesPath, "-limiter", cfg.Limiter, "-burst", strconv.Itoa(cfg.Burst),
		"-reservations", cfg.Reservations.String(), "-redis-timeout", cfg.RedisTimeout.String(),
		"-inflight", strconv.Itoa(cfg.InFlight), "-work", cfg.Work.String(),
		"-fair=" + strconv.FormatBool(cfg.Fair), "-handlers", strconv.Itoa(cfg.Handlers), "-faults", cfg.Faults,
		"-partner", cfg.Partner, "-partner-url", cfg.PartnerURL,
		"-core=" + strconv.FormatBool(cfg.Core), "-core-max-wait", cfg.CoreMaxWait.String()}
	if cfg.Metrics != "" {
		addr, err := processMetricsAddr(cfg.Metrics, id)
		if err != nil {
			return err
		}
		args = append(args, "-metrics", addr)
	}
	cmd := exec.Command(ps.exe, args...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = sysProcAttr()
	p := &process{id: id, cmd: cmd, read: make(chan struct{})}
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start worker process #%d: %w", id, err)
	}
	ps.mu.Lock()
	ps.list = append(ps.list, p)
	ps.mu.Unlock()
	go ps.read(p, stdout)
	return nil
}

// waitReady waits until n processes are consuming, or fails after
// timeout or when one ended early.
func (ps *processes) waitReady(n int, timeout time.Duration) error {
	deadline := time.After(timeout)
	for range n {
		select {
		case <-ps.ready:
		case err := <-ps.exited:
			return err
		case <-deadline:
			return fmt.Errorf("-instances: the worker processes were not all consuming after %v", timeout)
		}
	}
	return nil
}

// killOne kills (SIGKILL) the live worker process that has handled the
// most jobs so far, the likeliest to have messages in hand, and returns
// its number and pid.
func (ps *processes) killOne() (id, pid int, err error) {
	ps.mu.Lock()
	var victim *process
	for _, p := range ps.list {
		if !p.killed && (victim == nil || ps.rec.runsBy(p.id) > ps.rec.runsBy(victim.id)) {
			victim = p
		}
	}
	if victim == nil {
		ps.mu.Unlock()
		return 0, 0, errors.New("no worker process to kill")
	}
	victim.killed = true
	ps.mu.Unlock()
	if err := victim.cmd.Process.Kill(); err != nil {
		return 0, 0, fmt.Errorf("kill worker process #%d: %w", victim.id, err)
	}
	<-victim.read
	victim.stdin.Close()
	return victim.id, victim.cmd.Process.Pid, nil
}

// replace starts a new worker process, numbered after the others, and
// returns its number and pid.
func (ps *processes) replace() (id, pid int, err error) {
	ps.mu.Lock()
	id = len(ps.list) + 1
	ps.mu.Unlock()
	if err := ps.start(id); err != nil {
		return 0, 0, err
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return id, ps.list[len(ps.list)-1].cmd.Process.Pid, nil
}

// read applies the records of p to the recorder until p's stdout ends;
// if p ends before it was asked to stop, it says so on ps.exited.
func (ps *processes) read(p *process, stdout io.Reader) {
	defer close(p.read)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var r record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			ps.errs.add(fmt.Sprintf("worker process #%d", p.id), fmt.Errorf("bad record %q: %w", sc.Text(), err))
			continue
		}
		ps.apply(p, r)
	}
	err := p.cmd.Wait()
	ps.mu.Lock()
	stopping, killed := ps.stopping, p.killed
	ps.mu.Unlock()
	if killed {
		return
	}
	if !stopping {
		if err == nil {
			err = errors.New("exited")
		}
		ps.exited <- fmt.Errorf("worker process #%d (pid %d) ended early: %w", p.id, p.cmd.Process.Pid, err)
	} else if err != nil {
		ps.errs.add(fmt.Sprintf("worker process #%d (pid %d)", p.id, p.cmd.Process.Pid), err)
	}
}

func (ps *processes) apply(p *process, r record) {
	switch r.Kind {
	case "admit":
		ps.rec.admitted(r.Tenant, r.ID, r.N, time.Unix(0, r.Before), time.Unix(0, r.After))
	case "refund":
		ps.rec.refunded(r.Tenant, r.ID)
	case "handle":
		if r.Run != nil {
			ps.rec.handle(*r.Run)
		}
	case "ack":
		ps.rec.acked(r.ID, p.id, r.Seq, recordTime(r.At))
	case "nak":
		ps.rec.nak(r.Tenant, recordTime(r.At), r.Reserved)
	case "hold":
		ps.rec.hold(r.Tenant, r.Seq, recordTime(r.At))
	case "term":
		ps.rec.term(r.Tenant)
	case "given_up":
		ps.rec.givenUp(r.Tenant)
	case "ready":
		select {
		case ps.ready <- struct{}{}:
		default: // a replacement's: nobody waits for it
		}
	case "metrics":
		fmt.Fprintf(ps.out, "worker process #%d serves the throttle's metrics for Prometheus at http://%s/metrics\n", p.id, r.Addr)
	case "error":
		ps.errs.add(fmt.Sprintf("worker process #%d", p.id), errors.New(r.Err))
	case "done":
		ps.deliveries.Add(r.Deliveries)
		ps.mu.Lock()
		p.done = true
		ps.longest = max(ps.longest, r.Longest)
		if h := r.Hybrid; h != nil {
			ps.isHybrid = true
			ps.hybrid.Local += h.Local
			ps.hybrid.Redis += h.Redis
			ps.hybrid.Degraded += h.Degraded
			ps.hybrid.Errors += h.Errors
		}
		ps.mu.Unlock()
	}
}

// recordTime is the instant of a record's At: now for a record without
// one (from a worker process of an earlier version).
func recordTime(at int64) time.Time {
	if at == 0 {
		return time.Now()
	}
	return time.Unix(0, at)
}

// stop asks every process to stop (closes its stdin), waits up to grace
// for them to send their last records and exit, and kills the rest.
func (ps *processes) stop(grace time.Duration) {
	ps.mu.Lock()
	ps.stopping = true
	var list []*process
	for _, p := range ps.list {
		if !p.killed {
			list = append(list, p)
		}
	}
	ps.mu.Unlock()
	for _, p := range list {
		p.stdin.Close()
	}
	deadline := time.After(grace)
	for _, p := range list {
		select {
		case <-p.read:
			continue
		case <-deadline:
		}
		p.cmd.Process.Kill()
		<-p.read
		ps.errs.add(fmt.Sprintf("worker process #%d (pid %d)", p.id, p.cmd.Process.Pid), fmt.Errorf("killed: not stopped %v after it was asked to", grace))
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, p := range list {
		if !p.done {
			ps.errs.add(fmt.Sprintf("worker process #%d", p.id), errors.New("sent no final record: its counts may be incomplete"))
		}
	}
}

// hybridStats returns the hybrid decisions of every process added up, and
// false if the limiters are not hybrids.
func (ps *processes) hybridStats() (bucket.HybridStats, bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.hybrid, ps.isHybrid
}

// workInstances is work with -instances n: this process starts the NATS
// server (unless -nats), publishes the jobs and checks the records of n
// worker processes that consume them with the Redis limiter.
//
// The faults of fs are injected while it runs; kill-worker kills one of
// the worker processes and starts a replacement.
func workInstances(ctx context.Context, cfg config, out io.Writer, jf jobsFile, q *quotas, spec limiterSpec, fs faultSetup, pset partnerSettings) (report, error) {
	rateOf := q.rate
	if cfg.RedisURL == "" {
		return report{}, fmt.Errorf("-instances %d needs -redis URL: the worker processes share their limits through Redis", cfg.Instances)
	}
	if cfg.Trace != "" {
		return report{}, errors.New("-trace is not supported with -instances: the spans are made in the worker processes")
	}
	if cfg.Linger > 0 {
		return report{}, errors.New("-linger is not supported with -instances: each worker process serves its own metrics and ends with the run")
	}
	out = &syncWriter{w: out} // the worker processes' lines and the progress
	var cl closers
	defer cl.run()
	rc, err := dialRedis(ctx, cfg.RedisURL, &cl)
	if err != nil {
		return report{}, err
	}
	prefix := "queuethrottle:example:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":nats:"
	ns, err := openNATS(ctx, cfg, len(jf.Jobs), &cl)
	if err != nil {
		return report{}, err
	}
	nc, natsName, js, start, rec := ns.nc, ns.name, ns.js, ns.start, ns.rec
	rec.rateOf = rateOf
	rec.weightOf = jf.weight
	rec.horizon = cfg.Reservations
	if pset.Budget.Count > 0 { // to follow the limit the processes adapt
		if pset.adapt, err = newAdaptive(pset, rc, prefix); err != nil {
			return report{}, err
		}
	}
	var partner *partnerServer
	if pset.Quota.Count > 0 {
		if partner, err = startPartner(pset, start, &cl); err != nil {
			return report{}, err
		}
		cfg.PartnerURL = partner.url
	}
	ps, err := startProcesses(cfg, cfg.Instances, nc.ConnectedUrl(), prefix, rec, out)
	if err != nil {
		return report{}, err
	}
	stopProcesses := sync.OnceFunc(func() { ps.stop(15 * time.Second) })
	cl.add(stopProcesses)

	fmt.Fprintf(out, "replaying %s from %s over %.1fs into NATS %s (%s) for %d worker processes; %s, %s%s%s\n",
		plural(len(jf.Jobs), "job"), plural(len(jf.tenants()), "tenant"), jf.Jobs[len(jf.Jobs)-1].at().Seconds(), natsName, nc.ConnectedUrl(),
		cfg.Instances, spec.describe(rc.Options().Addr), q.text()+"; quotas in Redis hash "+prefix+"quotas", describeInFlight(cfg.InFlight, rc), describeWork(cfg.Work))
	fmt.Fprint(out, drainNote(jf, cfg, cfg.Instances), spec.costNote(jf, q.rate))

	var core *coreSender
	if cfg.Core {
		if err := ps.waitReady(cfg.Instances, 30*time.Second); err != nil {
			return report{}, err
		}
		core = &coreSender{nc: nc, requests: jf.Requests, timeout: cfg.CoreMaxWait + 5*time.Second, answers: &coreRequests{}}
	}
	tp := noop.NewTracerProvider()
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	pubDone := make(chan error, 1)
	go func() {
		pubDone <- publish(pctx, js, core, tp.Tracer(scopeName), propagation.TraceContext{}, jf.Jobs, start, rec, nil, out)
	}()
	var complete <-chan struct{} = rec.complete
	var faultErrs <-chan error
	stopFaults := func() {}
	if len(fs.kinds) > 0 {
		fi := startFaults(ctx, fs.kinds, faultTargets{redis: fs.redis, nats: ns.server, procs: ps}, start, jf.span(), rec.addFault, out)
		stopFaults = fi.stop
		defer fi.stop()
		complete, faultErrs = allClosed(complete, fi.settled), fi.errs
	}
	stopReason, pubErr, pubReturned := wait(ctx, cfg, complete, rec.progressLine, pubDone, firstErr(ps.exited, faultErrs), out)
	stopFaults() // a fault under way recovers first
	pubErr = stopPublisher(stopReason, pubErr, pubReturned, pubDone, pcancel)
	stopProcesses()
	info, deliveries, ok := consumerInfo(ns.source.stream)
	if !ok {
		deliveries = int(ps.deliveries.Load()) // the server did not answer: what the processes saw
	}
	if cfg.Core {
		info = "" // the stream's consumers had nothing to deliver
	}
	partnerFinal := pset.finalLimit(ctx)
	cl.run()
	printStop(out, stopReason, info)
	ps.errs.print(out, "error")
	rep := rec.summarize(jf.Jobs, rateOf, spec)
	rep.Deliveries = deliveries
	rep.Instances = cfg.Instances
	rep.InFlight = cfg.InFlight
	rep.timeline.Handlers = cfg.Handlers * cfg.Instances
	if core != nil {
		core.answers.wg.Wait()
		rep.Core, rep.Requests = true, core.answers
	}
	if hs, ok := ps.hybridStats(); ok {
		rep.Hybrid = &hs
	}
	ps.mu.Lock()
	rep.Longest, rep.Timeout = ps.longest, spec.timeout()
	ps.mu.Unlock()
	if partner != nil {
		pr := partner.report(pset, partnerFinal, rec.charged())
		rep.Partner = &pr
	}
	rep.print(out)
	if pubErr != nil {
		return rep, fmt.Errorf("publish: %w", pubErr)
	}
	return rep, nil
}

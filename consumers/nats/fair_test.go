package natsthrottle

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// TestHandleFairShares: one consumer, a flood of one key ahead of a calm
// key in the stream, 4 handlers of 50 ms. With the fair shares the calm
// messages start about as they come (the flood's messages beyond its
// share go back once each, to when its share reaches them); without them
// (WithFair(false)) the calm ones wait behind the flood's backlog.
func TestHandleFairShares(t *testing.T) {
	for _, fairOn := range []bool{true, false} {
		t.Run(fmt.Sprintf("fair=%v", fairOn), func(t *testing.T) {
			e := newEnv(t)
			cfg := jetstream.ConsumerConfig{AckWait: 5 * time.Second, MaxDeliver: 5, MaxAckPending: -1}
			c := e.consumer(t, cfg)
			const flood, calm, work = 120, 10, 50 * time.Millisecond
			s := newStarts(work)
			naks := &nakCounter{naks: map[uint64]int{}}
			h := newHandler(t, s.handle, newGate(t, throttle.PerSecond(10_000), nil),
				WithConcurrency(4), WithConsumerConfig(cfg), WithFair(fairOn), WithKeyFunc(func(m jetstream.Msg) (string, error) { return m.Subject(), nil }))
			for i := range flood {
				e.publish(t, "jobs.hog", fmt.Sprint(i), nil)
			}
			cc, err := c.Consume(func(m jetstream.Msg) { h.Handle(countedMsg{Msg: m, c: naks}) }, jetstream.PullMaxMessages(16))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cc.Stop)
			waits := s.calmBeside(t, e, flood, calm, work)
			longest := waits[len(waits)-1]
			// The flood's backlog: (flood / 4) × 50 ms = 1.5 s.
			switch {
			case fairOn && longest > 500*time.Millisecond:
				t.Errorf("calm's longest wait %v with fair shares, want well under the flood's backlog (waits %v)", longest, waits)
			case !fairOn && waits[0] < 500*time.Millisecond:
				t.Errorf("calm's shortest wait %v without fair shares, want it behind the flood's backlog", waits[0])
			}
			naks.mu.Lock()
			for seq, n := range naks.naks {
				if n > 1 {
					t.Errorf("stream seq %d NAKed %d times, want at most once", seq, n)
				}
			}
			naks.mu.Unlock()
			for seq, n := range s.runs {
				if n != 1 {
					t.Errorf("stream seq %d handled %d times", seq, n)
				}
			}
			calmSeq := map[uint64]bool{}
			for _, q := range s.calmSeqs {
				calmSeq[q] = true
			}
			calmNaks := 0
			naks.mu.Lock()
			for seq := range naks.naks {
				if calmSeq[seq] {
					calmNaks++
				}
			}
			naks.mu.Unlock()
			if calmNaks > 0 {
				t.Errorf("%d calm messages NAKed, want 0: under their share, they never go back", calmNaks)
			}
			t.Logf("calm waits p50 %v max %v; %d NAKs", waits[len(waits)/2], longest, naks.all.Load())
		})
	}
}

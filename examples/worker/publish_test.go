package main

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/queuethrottle/queuethrottle/internal/natsserver"
)

// TestPublishTenantsApart: a tenant that dumps thousands of jobs at once
// does not hold back another tenant's job due just after: it is published
// while the dump is still going out, not after it (in a clump with the
// tenant's next jobs, over their limit).
func TestPublishTenantsApart(t *testing.T) {
	_, js := natsserver.Connect(t, natsserver.Run(t))
	natsserver.Stream(t, js, "S", subjectPrefix+">")
	const dump = 3000 // about 50 µs each: 150 ms or more in all
	var jobs []job
	for i := range dump {
		jobs = append(jobs, job{ID: fmt.Sprint("dump-", i), Tenant: "dump", Cost: 1})
	}
	jobs = append(jobs, job{ID: "quiet-0", Tenant: "quiet", AtMS: 2, Cost: 1})
	start := time.Now()
	rec := newRecorder(start, len(jobs))
	if err := publish(context.Background(), js, nil, noop.NewTracerProvider().Tracer(""), propagation.TraceContext{}, jobs, start, rec, nil, io.Discard); err != nil {
		t.Fatal(err)
	}
	var quietSeq uint64
	for seq, tenant := range rec.seqs {
		if tenant == "quiet" {
			quietSeq = seq
		}
	}
	if len(rec.seqs) != len(jobs) || quietSeq == 0 {
		t.Fatalf("%d jobs published (quiet at stream sequence %d), want %d", len(rec.seqs), quietSeq, len(jobs))
	}
	if quietSeq > dump {
		t.Fatalf("the quiet job is stream sequence %d: it went out after all %d jobs of the dump", quietSeq, dump)
	}
	t.Logf("the quiet job is stream sequence %d of %d", quietSeq, len(jobs))
}

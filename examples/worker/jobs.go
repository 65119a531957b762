package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// job is one line of the jobs file: a job of a tenant that arrives At after
// the start of the replay.
type job struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	AtMS   int64  `json:"at_ms"` // arrival offset in milliseconds
	Cost   int    `json:"cost"`  // units charged at admission; 0 in the file means 1
}

// at returns the arrival offset as a Duration.
func (j job) at() time.Duration { return time.Duration(j.AtMS) * time.Millisecond }

// jobsFile is the parsed jobs file: the jobs in arrival order and the
// per-tenant rate overrides.
type jobsFile struct {
	Jobs  []job
	Rates map[string]throttle.Rate
}

// line is either a job or, without an id, a rate override for a tenant:
// {"tenant": "initech", "rate": "10/1s"}.
type line struct {
	job
	Rate string `json:"rate"`
}

// loadJobs reads a jobs file (JSON Lines). A missing file is reported with
// a hint, since the default path is relative to the working directory.
func loadJobs(path string) (jobsFile, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		wd, _ := os.Getwd()
		return jobsFile{}, fmt.Errorf("jobs file %s not found (working directory %s): run from the repository root or pass -jobs FILE", path, wd)
	}
	if err != nil {
		return jobsFile{}, fmt.Errorf("jobs file: %w", err)
	}
	defer f.Close()
	jf, err := parseJobs(f)
	if err != nil {
		return jobsFile{}, fmt.Errorf("jobs file %s: %w", path, err)
	}
	return jf, nil
}

// parseJobs parses JSON Lines: one job or rate override per line; blank
// lines are skipped. Jobs are returned sorted by arrival (stable).
func parseJobs(r io.Reader) (jobsFile, error) {
	jf := jobsFile{Rates: map[string]throttle.Rate{}}
	ids := map[string]bool{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var l line
		dec := json.NewDecoder(strings.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			return jobsFile{}, fmt.Errorf("line %d: %w", n, err)
		}
		if err := checkTenant(l.Tenant); err != nil {
			return jobsFile{}, fmt.Errorf("line %d: %w", n, err)
		}
		if l.Rate != "" {
			if l.ID != "" {
				return jobsFile{}, fmt.Errorf("line %d: a line has either an id (a job) or a rate (an override), not both", n)
			}
			rate, err := throttle.ParseRate(l.Rate)
			if err != nil {
				return jobsFile{}, fmt.Errorf("line %d: %w", n, err)
			}
			jf.Rates[l.Tenant] = rate
			continue
		}
		j := l.job
		switch {
		case j.ID == "":
			return jobsFile{}, fmt.Errorf("line %d: missing id", n)
		case ids[j.ID]:
			return jobsFile{}, fmt.Errorf("line %d: duplicate id %q", n, j.ID)
		case j.AtMS < 0:
			return jobsFile{}, fmt.Errorf("line %d: at_ms must be >= 0, got %d", n, j.AtMS)
		case j.Cost < 0:
			return jobsFile{}, fmt.Errorf("line %d: cost must be >= 1, got %d", n, j.Cost)
		}
		if j.Cost == 0 {
			j.Cost = 1
		}
		ids[j.ID] = true
		jf.Jobs = append(jf.Jobs, j)
	}
	if err := sc.Err(); err != nil {
		return jobsFile{}, err
	}
	if len(jf.Jobs) == 0 {
		return jobsFile{}, errors.New("no jobs")
	}
	sort.SliceStable(jf.Jobs, func(a, b int) bool { return jf.Jobs[a].AtMS < jf.Jobs[b].AtMS })
	return jf, nil
}

// checkTenant reports whether name can be one subject token (jobs.<tenant>).
func checkTenant(name string) error {
	if name == "" {
		return errors.New("missing tenant")
	}
	if strings.ContainsAny(name, ".*> \t\r\n") {
		return fmt.Errorf("tenant %q must be a single NATS subject token (no '.', '*', '>' or spaces)", name)
	}
	return nil
}

// tenants returns the tenants of jobs, sorted.
// span is the arrival offset of the last job (0 for none).
func (jf jobsFile) span() time.Duration {
	if len(jf.Jobs) == 0 {
		return 0
	}
	return jf.Jobs[len(jf.Jobs)-1].at()
}

func (jf jobsFile) tenants() []string {
	seen := map[string]bool{}
	var ts []string
	for _, j := range jf.Jobs {
		if !seen[j.Tenant] {
			seen[j.Tenant] = true
			ts = append(ts, j.Tenant)
		}
	}
	sort.Strings(ts)
	return ts
}

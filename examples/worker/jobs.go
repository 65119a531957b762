package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

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
	n := 1
	for ; sc.Scan(); n++ {
		text := sc.Text()
		if n == 1 {
			text = strings.TrimPrefix(text, "\uFEFF") // a UTF-8 byte order mark
		}
		text = strings.TrimSpace(text)
		if text == "" {
			continue
		}
		l, err := decodeLine(text)
		if err != nil {
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
			if err == nil {
				err = checkPeriod(rate)
			}
			if err != nil {
				return jobsFile{}, fmt.Errorf("line %d: %w", n, err)
			}
			if _, twice := jf.Rates[l.Tenant]; twice {
				return jobsFile{}, fmt.Errorf("line %d: a second rate line for tenant %s", n, l.Tenant)
			}
			jf.Rates[l.Tenant] = rate
			continue
		}
		j := l.job
		if err := checkID(j.ID); err != nil {
			return jobsFile{}, fmt.Errorf("line %d: %w", n, err)
		}
		switch {
		case ids[j.ID]:
			return jobsFile{}, fmt.Errorf("line %d: duplicate id %q", n, j.ID)
		case j.AtMS < 0 || j.AtMS > maxAtMS:
			return jobsFile{}, fmt.Errorf("line %d: at_ms must be in [0, %d] (24h: the worker replays the file in real time), got %d", n, maxAtMS, j.AtMS)
		case j.Cost < 0:
			return jobsFile{}, fmt.Errorf("line %d: cost must be >= 1, got %d", n, j.Cost)
		}
		if j.Cost == 0 {
			j.Cost = 1
		}
		ids[j.ID] = true
		jf.Jobs = append(jf.Jobs, j)
	}
	if err := scanError(sc.Err(), n); err != nil {
		return jobsFile{}, err
	}
	if len(jf.Jobs) == 0 {
		return jobsFile{}, errors.New("no jobs")
	}
	tenants := jf.tenants()
	for _, t := range slices.Sorted(maps.Keys(jf.Rates)) {
		if _, ok := slices.BinarySearch(tenants, t); !ok {
			return jobsFile{}, fmt.Errorf("a rate line for tenant %s, which has no jobs (a typo?)", t)
		}
	}
	sort.SliceStable(jf.Jobs, func(a, b int) bool { return jf.Jobs[a].AtMS < jf.Jobs[b].AtMS })
	return jf, nil
}

// decodeLine decodes one line: a single JSON object of the fields of
// line, in valid UTF-8, and nothing after it.
func decodeLine(text string) (line, error) {
	var l line
	if !utf8.ValidString(text) {
		return l, errors.New("not valid UTF-8")
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field := te.Field[strings.LastIndex(te.Field, ".")+1:] // "job.at_ms": at_ms
			return l, fmt.Errorf("%s must be %s, got %s", field, jsonKind(te.Type.Kind()), te.Value)
		}
		return l, err
	}
	if strings.TrimSpace(text[dec.InputOffset():]) != "" {
		return l, errors.New("more after the JSON object: one job or rate line per line")
	}
	return l, nil
}

// jsonKind names what a JSON value of a field of kind k must be.
func jsonKind(k reflect.Kind) string {
	switch k {
	case reflect.Int, reflect.Int64:
		return "an integer"
	case reflect.String:
		return "a string"
	}
	return k.String()
}

// scanError is the error of a bufio.Scanner that stopped at line n: a line
// over bufio.MaxScanTokenSize is named as such.
func scanError(err error, n int) error {
	if errors.Is(err, bufio.ErrTooLong) {
		return fmt.Errorf("line %d: longer than %d bytes", n, bufio.MaxScanTokenSize)
	}
	return err
}

// Bounds of a jobs file's fields. A tenant is a NATS subject token, a part
// of Redis keys and a label of metrics and plots; an id is a message's
// Nats-Msg-Id header and its asynq task ID.
const (
	maxAtMS      = int64(24 * time.Hour / time.Millisecond)
	maxTenantLen = 128 // bytes
	maxIDLen     = 256 // bytes
)

// checkTenant reports whether name can be one subject token (jobs.<tenant>).
func checkTenant(name string) error {
	return checkToken("tenant", name, maxTenantLen, ".*>", "must be a single NATS subject token (no '.', '*', '>', spaces or control characters)")
}

// checkID reports whether id can be a message's id (a NATS header value).
func checkID(id string) error {
	return checkToken("id", id, maxIDLen, "", "must have no spaces or control characters")
}

// checkToken reports whether s, the value of field, is set, at most maxLen
// bytes, and free of spaces, control characters and the bytes of
// forbidden; rule says so in the error.
func checkToken(field, s string, maxLen int, forbidden, rule string) error {
	switch {
	case s == "":
		return fmt.Errorf("missing %s", field)
	case len(s) > maxLen:
		return fmt.Errorf("%s %.20q... is %d bytes, more than %d", field, s, len(s), maxLen)
	case strings.ContainsAny(s, forbidden) || strings.IndexFunc(s, isSpaceOrControl) >= 0:
		return fmt.Errorf("%s %q %s", field, s, rule)
	}
	return nil
}

func isSpaceOrControl(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }

// checkPeriod refuses a rate whose period is shorter than a millisecond:
// the worker times an admission only to within its decision's round trip,
// so its summary could not check so short a window.
func checkPeriod(r throttle.Rate) error {
	if r.Per < time.Millisecond {
		return fmt.Errorf("rate %v: the worker needs a period of at least 1ms (it times each admission to within its decision's round trip)", r)
	}
	return nil
}

// span is the arrival offset of the last job (0 for none).
func (jf jobsFile) span() time.Duration {
	if len(jf.Jobs) == 0 {
		return 0
	}
	return jf.Jobs[len(jf.Jobs)-1].at()
}

// tenants returns the tenants of jobs, sorted.
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

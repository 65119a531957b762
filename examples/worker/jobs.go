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

// jobsFile is the parsed jobs file: the jobs in arrival order, and the
// per-tenant rate overrides and fair-share weights of its rate lines.
type jobsFile struct {
	Jobs    []job
	Rates   map[string]throttle.Rate
	Weights map[string]float64
	// Requests are the tenants whose rate line says "request": true: with
	// -core their jobs go out as requests, answered by the handler.
	Requests map[string]bool
}

// line is either a job or, without an id, a rate line for a tenant: a
// rate override, a weight in the fair shares of the handlers, or both:
// {"tenant": "initech", "rate": "10/1s", "weight": 3}.
type line struct {
	job
	Rate    string   `json:"rate"`
	Weight  *float64 `json:"weight"`
	Request bool     `json:"request"`
}

// maxWeight bounds a rate line's weight.
const maxWeight = 1e6

// weight returns tenant's weight in the fair shares: its rate line's, or 1.
func (jf jobsFile) weight(tenant string) float64 {
	if w, ok := jf.Weights[tenant]; ok {
		return w
	}
	return 1
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
	jf := jobsFile{Rates: map[string]throttle.Rate{}, Weights: map[string]float64{}, Requests: map[string]bool{}}
	rateLines := map[string]bool{}
	ids := map[string]bool{}
	err := eachLine(r, func(text string) error {
		l, err := decodeLine(text)
		if err != nil {
			return err
		}
		if err := checkTenant(l.Tenant); err != nil {
			return err
		}
		if l.Rate != "" || l.Weight != nil || l.Request {
			if l.ID != "" || l.AtMS != 0 || l.Cost != 0 {
				return errors.New("a rate line has a tenant, a rate, a weight and request only (a job has an id, and none of them)")
			}
			if l.Request {
				jf.Requests[l.Tenant] = true
			}
			if rateLines[l.Tenant] {
				return fmt.Errorf("a second rate line for tenant %s", l.Tenant)
			}
			rateLines[l.Tenant] = true
			if l.Rate != "" {
				rate, err := throttle.ParseRate(l.Rate)
				if err == nil {
					err = checkPeriod(rate)
				}
				if err != nil {
					return err
				}
				jf.Rates[l.Tenant] = rate
			}
			if l.Weight != nil {
				if w := *l.Weight; !(w > 0 && w <= maxWeight) {
					return fmt.Errorf("weight must be a number > 0 and <= %g, got %v", float64(maxWeight), w)
				}
				jf.Weights[l.Tenant] = *l.Weight
			}
			return nil
		}
		j := l.job
		if err := checkID(j.ID); err != nil {
			return err
		}
		switch {
		case ids[j.ID]:
			return fmt.Errorf("duplicate id %q", j.ID)
		case j.AtMS < 0 || j.AtMS > maxAtMS:
			return fmt.Errorf("at_ms must be in [0, %d] (24h: the worker replays the file in real time), got %d", maxAtMS, j.AtMS)
		case j.Cost < 0:
			return fmt.Errorf("cost must be >= 1, got %d", j.Cost)
		}
		if j.Cost == 0 {
			j.Cost = 1
		}
		ids[j.ID] = true
		jf.Jobs = append(jf.Jobs, j)
		return nil
	})
	if err != nil {
		return jobsFile{}, err
	}
	if len(jf.Jobs) == 0 {
		return jobsFile{}, errors.New("no jobs")
	}
	tenants := jf.tenants()
	for _, t := range slices.Sorted(maps.Keys(rateLines)) {
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
			if te.Field == "" {
				return l, fmt.Errorf("a line must be a JSON object, got %s", te.Value)
			}
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
	case reflect.Float64:
		return "a number"
	}
	return k.String()
}

// maxLineLen bounds a line of a jobs or -rates file, in bytes.
const maxLineLen = 64 << 10

// eachLine calls each with every line of r that is not blank, trimmed,
// after a UTF-8 byte order mark at the start of r; an error of each, or a
// line over maxLineLen bytes, stops it with an error naming the line.
func eachLine(r io.Reader, each func(text string) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLineLen+len("\r\n"))
	tooLong := func(n int) error { return fmt.Errorf("line %d: longer than %d bytes", n, maxLineLen) }
	n := 1
	for ; sc.Scan(); n++ {
		text := sc.Text()
		if n == 1 {
			text = strings.TrimPrefix(text, "\uFEFF")
		}
		if len(text) > maxLineLen {
			return tooLong(n)
		}
		if text = strings.TrimSpace(text); text == "" {
			continue
		}
		if err := each(text); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
	}
	if errors.Is(sc.Err(), bufio.ErrTooLong) {
		return tooLong(n)
	}
	return sc.Err()
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
	return checkToken("tenant", name, maxTenantLen, ".*>", "must be a single NATS subject token (no '.', '*', '>', spaces, control or format characters)")
}

// checkID reports whether id can be a message's id (a NATS header value).
func checkID(id string) error {
	return checkToken("id", id, maxIDLen, "", "must have no spaces, control or format characters")
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

// isSpaceOrControl reports spaces, control characters and invisible
// format characters (Unicode Cf: a zero-width space, a byte order mark).
func isSpaceOrControl(r rune) bool {
	return unicode.IsSpace(r) || unicode.IsControl(r) || unicode.Is(unicode.Cf, r)
}

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

// maxCost returns the largest cost of the jobs (at least 1).
func (jf jobsFile) maxCost() int {
	n := 1
	for _, j := range jf.Jobs {
		n = max(n, j.Cost)
	}
	return n
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

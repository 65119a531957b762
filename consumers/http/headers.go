package httpthrottle

import (
	"net/http"
	"strconv"
	"time"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// The header fields of draft-ietf-httpapi-ratelimit-headers-11 (23 May
// 2026), "RateLimit header fields for HTTP", sections 3 and 4, and
// Retry-After (RFC 9110, section 10.2.3).
const (
	headerRetryAfter = "Retry-After"
	headerPolicy     = "Ratelimit-Policy" // canonical form of RateLimit-Policy
	headerRateLimit  = "Ratelimit"        // canonical form of RateLimit
)

// ceilSeconds returns d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// retryAfterSeconds is the Retry-After of a rejection: its RetryAfter in
// whole seconds rounded up, and at least 1, since "Retry-After: 0" would
// invite the client straight back.
func retryAfterSeconds(d throttle.Decision) int64 { return max(ceilSeconds(d.RetryAfter), 1) }

// setHeaders adds the RateLimit-Policy and RateLimit fields for d, and for
// a rejection sets Retry-After.
//
// RateLimit-Policy: "<name>";q=<Limit>[;w=<window seconds>], omitted when
// the Limit is unknown (0). RateLimit: "<name>";r=<Remaining>;t=<seconds>,
// where t is, for an admission, ResetAfter rounded up (a sliding window or
// a bucket gives back room sooner, so r is a floor for that time), and for
// a rejection the Retry-After (the draft, section 6: Retry-After SHOULD
// NOT point before the end of the effective window). A degraded admission
// (the store was down and the Gate fails open) knows no remaining quota
// and gets no RateLimit field.
func (c *config) setHeaders(h http.Header, d throttle.Decision) {
	var buf [64]byte
	if d.Limit > 0 {
		b := append(buf[:0], c.policy...)
		b = append(b, ";q="...)
		b = strconv.AppendInt(b, int64(d.Limit), 10)
		if w := c.window; w >= time.Second && w%time.Second == 0 {
			b = append(b, ";w="...)
			b = strconv.AppendInt(b, int64(w/time.Second), 10)
		}
		h[headerPolicy] = append(h[headerPolicy], string(b))
	}
	var t int64
	switch {
	case !d.Allowed:
		t = retryAfterSeconds(d)
		h[headerRetryAfter] = []string{strconv.FormatInt(t, 10)}
	case d.Source == throttle.SourceDegraded:
		return
	default:
		t = ceilSeconds(d.ResetAfter)
	}
	b := append(buf[:0], c.policy...)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, int64(max(d.Remaining, 0)), 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, t, 10)
	h[headerRateLimit] = append(h[headerRateLimit], string(b))
}

// sfString returns s as a Structured Field String (RFC 9651, section
// 3.3.3), quotes included: '"' and '\' escaped, and every byte outside
// printable ASCII (0x20-0x7E) replaced by '_'.
func sfString(s string) string {
	b := make([]byte, 0, len(s)+2)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch ch := s[i]; {
		case ch == '"' || ch == '\\':
			b = append(b, '\\', ch)
		case ch < 0x20 || ch > 0x7e:
			b = append(b, '_')
		default:
			b = append(b, ch)
		}
	}
	return string(append(b, '"'))
}

package httpthrottle

import (
	"context"
	"errors"
	"net/http"

	"github.com/queuethrottle/queuethrottle/throttle"
)

// ErrInternal marks an error of a key or cost function as the function's
// own failure (a lookup that timed out, a broken listener) rather than the
// request's: wrap it (fmt.Errorf("%w: ...", httpthrottle.ErrInternal)) and
// StatusCode gives 500 Internal Server Error instead of 400 Bad Request.
// The default key function wraps it when RemoteAddr holds no IP address,
// as on a Unix socket listener.
var ErrInternal = errors.New("httpthrottle: internal error")

// StatusCode returns the status an error of the middleware calls for, the
// one DefaultError answers with:
//
//   - 500 Internal Server Error for a bad configuration (a nil Gate or
//     handler; throttle.ErrInvalidOption) and for errors wrapping
//     ErrInternal;
//   - 503 Service Unavailable when the request's context ended before a
//     decision (context.Canceled, context.DeadlineExceeded);
//   - 400 Bad Request otherwise: a key or cost function error, or a
//     request the limiter can never admit (throttle.IsUsageError, such as
//     a cost above the limit). A 429 would tell the client to retry a
//     request that no wait can admit.
func StatusCode(err error) int {
	switch {
	case errors.Is(err, throttle.ErrInvalidOption), errors.Is(err, ErrInternal):
		return http.StatusInternalServerError
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable
	default:
		return http.StatusBadRequest
	}
}

// DefaultError is the default error handler (see WithErrorHandler): it
// answers with StatusCode(err) and the status text as a text/plain body.
// The error itself stays out of the response.
func DefaultError(w http.ResponseWriter, _ *http.Request, err error) {
	code := StatusCode(err)
	http.Error(w, http.StatusText(code), code)
}

// DefaultReject is the default reject function (see WithRejectFunc): it
// answers 429 Too Many Requests with the text/plain body
// "Too Many Requests", for a degraded rejection too.
func DefaultReject(w http.ResponseWriter, _ *http.Request, _ throttle.Decision) {
	http.Error(w, http.StatusText(http.StatusTooManyRequests), http.StatusTooManyRequests)
}

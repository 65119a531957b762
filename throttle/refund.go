package throttle

import "context"

// Refunder is an optional Limiter capability: giving back an admission,
// so that the limiter is as if it had never been made. [All] uses it to
// keep a request that one of its parts rejects from consuming the room of
// the others. window.Memory, window.Redis, bucket.Local and bucket.Redis
// have it. A limiter of yours that wraps one (to record or meter its
// decisions) should pass Refund on: the consumers' Backoff gives back a
// refused call through it (Gate.Release), and without it the message's
// next delivery is admitted again free (AllowID: its id's units are still
// counted), so its call goes to the partner uncounted.
//
// An admission is named by the id it was made with (IDLimiter.AllowID):
// a refund takes back that request's units and never another's, and
// refunding twice gives back once (a retry after a lost reply is safe).
type Refunder interface {
	IDLimiter
	// Refund gives back what id holds for key: the n units that AllowID
	// admitted for it while the limiter still knows the id (a window: at
	// least while they are counted; a token bucket: while it remembers its
	// ids), or its reservation. n is the cost the id was presented with. Refund reports
	// whether id held anything; an id that holds nothing (never seen,
	// forgotten, refunded already) is not an error. Afterwards id is a new
	// request.
	//
	// Errors: one wrapping ErrInvalidCost for n < 1 or n beyond what the
	// limiter could ever admit, before any store access; otherwise the
	// limiter could not refund (a store failure or timeout) and the
	// admission may still be charged.
	Refund(ctx context.Context, key string, n int, id string) (bool, error)
}

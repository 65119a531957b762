package window

import "time"

// algorithm is the throttle.algorithm attribute of both windows.
const algorithm = "sliding_window_log"

// instant returns the decision instant of a clock reading t, in µs, and
// the window (µs) to decide with. The log keeps whole microseconds; to
// stay exact in real time it records an admission no earlier than it
// happened (t rounded up) and lets a unit leave no earlier than its real
// window ends: when t has a sub-microsecond part, the window of this
// decision is one microsecond longer, so that two readings rounded to
// whole microseconds can never put Count+1 real admissions inside one
// real window. A clock at whole microseconds (tests' fixed instants, the
// Redis server's TIME) decides on its own readings exactly.
func instant(t time.Time, window int64) (int64, int64) {
	us := t.UnixMicro()
	if t.Nanosecond()%1000 != 0 {
		return us + 1, window + 1
	}
	return us, window
}

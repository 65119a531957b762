package window

// algorithm is the throttle.algorithm attribute of both windows.
const algorithm = "sliding_window_log"

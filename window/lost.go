package window

// noteReply records what the script's reply v (its replyInts integers)
// to r, at the script's now, proves of r's set: an admission holds a unit
// until now + its reset (a Peek writes nothing, and proves nothing). See
// "Lost sets" in the package documentation.
func (l *Redis) noteReply(r *request, v []int64, now int64) {
	if len(v) < replyInts || r.horizon == argPeek {
		return
	}
	if code, reset := v[0], v[2]; code > 0 && reset > 0 {
		l.held.Note(r.key, now+reset, now)
	}
}

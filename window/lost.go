package window

// noteReply records what the script's reply v (its replyInts integers)
// to r, at the script's now, proves of r's set: an admission holds a unit
// until now + its reset, or a window when the reset is longer (a Peek
// writes nothing, and proves nothing). See "Lost sets" in the package
// documentation. A reset beyond a window counts reservations ahead: what
// they held is a schedule, not admissions that may count unseen, so their
// loss needs no pause, and a pause until the last of them (every decision
// till then finding the set gone again) held the key seconds after a
// FLUSHALL.
func (l *Redis) noteReply(r *request, v []int64, now int64) {
	if len(v) < replyInts || r.horizon == argPeek {
		return
	}
	if code, reset := v[0], v[2]; code > 0 && reset > 0 {
		l.held.Note(r.key, now+min(reset, r.win), now)
	}
}

package fair

// readyHeap orders the keys with waiting tickets: light keys first, then
// by virtual time, then by age.
type readyHeap []*keyState

func (h readyHeap) Len() int { return len(h) }

func (h readyHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.light != b.light {
		return a.light
	}
	if a.vtime != b.vtime {
		return a.vtime < b.vtime
	}
	return a.seq < b.seq
}

func (h readyHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].readyIdx, h[j].readyIdx = i, j
}

func (h *readyHeap) Push(x any) {
	k := x.(*keyState)
	k.readyIdx = len(*h)
	*h = append(*h, k)
}

func (h *readyHeap) Pop() any {
	old := *h
	k := old[len(old)-1]
	*h = old[:len(old)-1]
	k.readyIdx = -1
	return k
}

// blockedHeap orders blocked keys by the end of their blocks.
type blockedHeap []*keyState

func (h blockedHeap) Len() int           { return len(h) }
func (h blockedHeap) Less(i, j int) bool { return h[i].freeAt().Before(h[j].freeAt()) }

func (h blockedHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].blockedIdx, h[j].blockedIdx = i, j
}

func (h *blockedHeap) Push(x any) {
	k := x.(*keyState)
	k.blockedIdx = len(*h)
	*h = append(*h, k)
}

func (h *blockedHeap) Pop() any {
	old := *h
	k := old[len(old)-1]
	*h = old[:len(old)-1]
	k.blockedIdx = -1
	return k
}

// endHeap orders granted tickets by their expected end.
type endHeap []*Ticket

func (h endHeap) Len() int           { return len(h) }
func (h endHeap) Less(i, j int) bool { return h[i].end.Before(h[j].end) }

func (h endHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].endIdx, h[j].endIdx = i, j
}

func (h *endHeap) Push(x any) {
	t := x.(*Ticket)
	t.endIdx = len(*h)
	*h = append(*h, t)
}

func (h *endHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	t.endIdx = -1
	return t
}

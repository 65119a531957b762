package fair

import "container/heap"

// indexed is a heap.Interface over items that know their own index in it
// (at returns a pointer to it; -1 while out), so that an item can be
// fixed or removed where it stands.
type indexed[T any] struct {
	items []T
	less  func(a, b T) bool
	at    func(T) *int
}

func (h *indexed[T]) Len() int           { return len(h.items) }
func (h *indexed[T]) Less(i, j int) bool { return h.less(h.items[i], h.items[j]) }

func (h *indexed[T]) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	*h.at(h.items[i]), *h.at(h.items[j]) = i, j
}

func (h *indexed[T]) Push(x any) {
	t := x.(T)
	*h.at(t) = len(h.items)
	h.items = append(h.items, t)
}

func (h *indexed[T]) Pop() any {
	n := len(h.items) - 1
	t := h.items[n]
	var zero T
	h.items[n] = zero
	h.items = h.items[:n]
	*h.at(t) = -1
	return t
}

// top returns the least item; the heap must not be empty.
func (h *indexed[T]) top() T { return h.items[0] }

// place puts x into h or takes it out, as in says, and keeps it in order.
func (h *indexed[T]) place(x T, in bool) {
	i := *h.at(x)
	switch {
	case in && i < 0:
		heap.Push(h, x)
	case !in && i >= 0:
		heap.Remove(h, i)
	case in:
		heap.Fix(h, i)
	}
}

// readyFirst orders the keys with waiting tickets: light keys first, then
// by virtual time, then by age.
func readyFirst(a, b *keyState) bool {
	if a.light != b.light {
		return a.light
	}
	if a.vtime != b.vtime {
		return a.vtime < b.vtime
	}
	return a.seq < b.seq
}

// freedFirst orders blocked keys by the end of their blocks.
func freedFirst(a, b *keyState) bool { return a.freeAt().Before(b.freeAt()) }

// endsFirst orders granted tickets by their expected end.
func endsFirst(a, b *Ticket) bool { return a.end.Before(b.end) }

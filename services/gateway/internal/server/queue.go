package server

import "sync"

// queue is one SSE client's bounded buffer between its consumer (push) and
// its HTTP writer (drain). Unlike a buffered channel it holds memory only
// for the backlog it actually has, so an idle connection costs little
// whatever the bound.
type queue struct {
	limit  int
	notify chan struct{} // capacity 1: "there is something to drain"

	mu     sync.Mutex
	items  []sseItem // guarded by mu
	closed bool      // guarded by mu
}

func newQueue(limit int) *queue {
	return &queue{limit: limit, notify: make(chan struct{}, 1)}
}

// push appends it; false when the queue already holds limit items.
func (q *queue) push(it sseItem) bool {
	q.mu.Lock()
	if len(q.items) >= q.limit {
		q.mu.Unlock()
		return false
	}
	q.items = append(q.items, it)
	q.mu.Unlock()
	q.signal()
	return true
}

// close marks the end of input; the writer drains what is left first.
func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
}

func (q *queue) signal() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// drain moves every queued item into spare (reused) and returns them, and
// whether the queue is closed.
func (q *queue) drain(spare []sseItem) ([]sseItem, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.items
	if cap(spare) > 64 {
		spare = nil // a burst is over: do not keep its buffer for good
	}
	q.items = spare[:0]
	return out, q.closed
}

package server

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// tail is the gateway's one live subscription to FLOE_SESSIONS, shared by
// every SSE client of every Session this gateway serves: one ordered
// consumer on the whole stream (its filter is the stream's own subjects, so
// nats-server delivers without matching), started with the first client
// and stopped tailLinger after the last one left.
//
// Fan-out contract: the tail's goroutine receives the stream in stream
// order and, for a client class (partial, model, event, nested, server),
// pushes the message into the bounded queue of each client of its Session,
// never blocking. A client whose queue is full (it reads slower than its
// Session produces, or a write of its own blocks) is cut off at once: it is
// removed from the tail and its connection ends; it resumes with
// Last-Event-ID and the gap is replayed from JetStream. Messages are shared,
// read-only, between the clients of a Session.
//
// Handover: pos is the stream sequence of the last message the tail has
// dispatched (or, before the first, the last sequence stored when it
// started). A client registered at pos P receives every client-class
// message with a sequence above P through its queue; everything at or
// below P is in the stream, so its gap [start, P] is replayed from there
// and the queue's entries at or below the last replayed sequence are
// dropped: no gap, no duplicate.
type tail struct {
	s      *Server
	linger time.Duration

	mu      sync.Mutex
	feeds   map[string][]*sseClient // guarded by mu: the clients of each Session
	clients int                     // guarded by mu
	pos     uint64                  // guarded by mu
	run     *tailRun                // guarded by mu: nil when stopped
	stopT   *time.Timer             // guarded by mu: the pending linger stop
	closed  bool                    // guarded by mu
}

// tailLinger is how long the tail outlives its last client, so a client
// that reconnects at once finds it running.
const tailLinger = 10 * time.Second

// tailRun is one started subscription; its goroutine closes done.
type tailRun struct {
	cons jetstream.Consumer
	it   jetstream.MessagesContext
	done chan struct{}
}

// sseClient is one SSE connection as the tail sees it.
type sseClient struct {
	sid string
	q   *queue
	// kick ends the connection: the tail removed it (too slow, or the
	// subscription failed).
	kick func(slow bool)
}

func newTail(s *Server) *tail {
	return &tail{s: s, linger: tailLinger, feeds: make(map[string][]*sseClient)}
}

// subscribe registers c, starting the subscription if needed, and returns
// the position above which c's queue receives the Session's messages.
func (t *tail) subscribe(ctx context.Context, c *sseClient) (uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, fmt.Errorf("gateway closing")
	}
	if t.stopT != nil {
		t.stopT.Stop()
		t.stopT = nil
	}
	if t.run == nil {
		if err := t.startLocked(ctx); err != nil {
			return 0, err
		}
	}
	t.feeds[c.sid] = append(t.feeds[c.sid], c)
	t.clients++
	t.s.metrics.sseSessions.Set(float64(len(t.feeds)))
	return t.pos, nil
}

// unsubscribe removes c (a no-op when the tail already removed it).
func (t *tail) unsubscribe(c *sseClient) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.removeLocked(c) && t.clients == 0 && t.run != nil && !t.closed {
		t.stopT = time.AfterFunc(t.linger, t.stopIdle)
	}
}

// removeLocked drops c from its Session's clients; false when absent.
// t.mu must be held.
func (t *tail) removeLocked(c *sseClient) bool {
	list := t.feeds[c.sid]
	for i, x := range list {
		if x == c {
			last := len(list) - 1
			list[i] = list[last]
			list[last] = nil
			if last == 0 {
				delete(t.feeds, c.sid)
			} else {
				t.feeds[c.sid] = list[:last]
			}
			t.clients--
			t.s.metrics.sseSessions.Set(float64(len(t.feeds)))
			return true
		}
	}
	return false
}

// startLocked creates the consumer at the stream's end. t.mu must be held.
func (t *tail) startLocked(ctx context.Context) error {
	info, err := t.s.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream info: %w", err)
	}
	start := info.State.LastSeq + 1
	cons, err := t.s.js.OrderedConsumer(ctx, omni.SessionsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{omni.SessionSubjects},
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       start,
		InactiveThreshold: consumerInactive,
	})
	if err != nil {
		return fmt.Errorf("create the gateway's stream consumer: %w", err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		bus.DeleteConsumer(t.s.js, cons)
		return fmt.Errorf("consume the stream: %w", err)
	}
	r := &tailRun{cons: cons, it: it, done: make(chan struct{})}
	t.run, t.pos = r, start-1
	go t.loop(r)
	return nil
}

func (t *tail) loop(r *tailRun) {
	defer close(r.done)
	for {
		m, err := r.it.Next()
		if err != nil {
			t.fail(r, err)
			return
		}
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		sid, class, ok := omni.ParseSessionSubject(m.Subject())
		t.dispatch(r, sseItem{seq: md.Sequence.Stream, stored: md.Timestamp.UnixNano(), server: class == omni.ClassServer, data: m.Data()}, sid, class, ok)
	}
}

func (t *tail) dispatch(r *tailRun, it sseItem, sid, class string, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.run != r || it.seq <= t.pos {
		return
	}
	t.pos = it.seq
	if !ok || !isClientClass(class) {
		return
	}
	list := t.feeds[sid]
	if len(list) == 0 {
		return
	}
	for i := 0; i < len(list); {
		c := list[i]
		if c.q.push(it) {
			i++
			continue
		}
		// Too slow: cut off now, so it never holds up the others.
		t.removeLocked(c)
		list = t.feeds[sid]
		c.kick(true)
	}
}

// fail ends every client when the subscription breaks (the ordered
// consumer recreates itself across server restarts and leader changes, so
// this is a deleted stream or a closed connection): they reconnect with
// Last-Event-ID and a new subscription starts.
func (t *tail) fail(r *tailRun, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.run != r {
		return // stopped on purpose
	}
	if !t.closed {
		t.s.log.Warn().Err(err).Msg("sse: the gateway's stream consumer failed; disconnecting its clients")
	}
	t.run = nil
	for sid, list := range t.feeds {
		for _, c := range list {
			c.kick(false)
		}
		delete(t.feeds, sid)
	}
	t.clients = 0
	t.s.metrics.sseSessions.Set(0)
	go bus.DeleteConsumer(t.s.js, r.cons)
}

// stopIdle stops the subscription when no client came back.
func (t *tail) stopIdle() {
	t.mu.Lock()
	r := t.run
	if t.clients != 0 || r == nil || t.stopT == nil {
		t.mu.Unlock()
		return
	}
	t.run, t.stopT = nil, nil
	t.mu.Unlock()
	t.stop(r)
}

func (t *tail) stop(r *tailRun) {
	r.it.Stop()
	<-r.done
	bus.DeleteConsumer(t.s.js, r.cons)
}

// close stops the subscription for good; the clients end with the
// server's context.
func (t *tail) close() {
	t.mu.Lock()
	t.closed = true
	r := t.run
	t.run = nil
	if t.stopT != nil {
		t.stopT.Stop()
		t.stopT = nil
	}
	t.mu.Unlock()
	if r != nil {
		t.stop(r)
	}
}

func isClientClass(class string) bool { return slices.Contains(omni.ClientClasses, class) }

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
// every SSE client of every Session this gateway serves: one bus.Tail on
// the whole stream (its filter is the stream's own subjects, so
// nats-server delivers without matching), started with the first client
// and stopped tailLinger after the last one left. bus.Tail, unlike
// nats.go's ordered consumer, replaces its consumer within seconds when
// the server it lives on is killed (TestSSEFanoutSurvivesTheLossOfItsConsumersServer).
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

// tailRun is one started subscription.
type tailRun struct {
	tl *bus.Tail
}

// sseClient is one SSE connection as the tail sees it.
type sseClient struct {
	sid string
	q   *queue
	// kick ends the connection: the tail removed it for being too slow
	// (always true now: bus.Tail replaces a lost consumer, it never fails).
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
	// The first delivery can come before t.run is set (t.mu is held
	// here): it waits on t.mu, then finds r current.
	r := &tailRun{}
	tl, err := bus.StartTail(ctx, t.s.js, omni.SessionsStream, []string{omni.SessionSubjects}, start, bus.TailOptions{
		OnError: func(err error, replacing bool) {
			t.s.log.Warn().Err(err).Bool("replacing", replacing).Msg("sse: the gateway's stream consumer")
		},
	}, func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err != nil {
			return
		}
		sid, class, ok := omni.ParseSessionSubject(m.Subject())
		t.dispatch(r, sseItem{seq: md.Sequence.Stream, stored: md.Timestamp.UnixNano(), server: class == omni.ClassServer, data: m.Data()}, sid, class, ok)
	})
	if err != nil {
		return fmt.Errorf("create the gateway's stream consumer: %w", err)
	}
	r.tl = tl
	t.run, t.pos = r, start-1
	return nil
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

// stop ends r; t.mu must not be held (a delivery in progress waits on it).
func (t *tail) stop(r *tailRun) {
	r.tl.Stop()
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

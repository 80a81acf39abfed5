package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// GET /api/events: the live session list (protocol.md §3 "Browsers").
//
// Fan-out contract. One hub per Server, started by the first client and
// running until Close: a watch of the floe_sessions KV bucket (record
// changes) and one bus.Tail on floe.session.*.server and
// floe.session.*.event from the moment it starts (approval requests and
// decisions, so the list can say "waiting for approval"). The hub keeps
// the latest view of every Session; each client gets, on connect, one
// snapshot (a session_created per visible Session, oldest first, then
// sessions_synced) and then every change, in the hub's order. Every event
// is a full statement of what it names (last one wins), so a client that
// reconnects just takes the new snapshot. Each client has its own bounded
// buffer (Options.ClientBuffer events); a client whose buffer is full is
// disconnected and reconnects. A slow client never slows the hub or the
// other clients.

// Session list event types on /api/events (event: server_event).
const (
	eventSessionCreated = "session_created"
	eventSessionState   = "session_state"
	eventSessionTitle   = "session_title"
	eventSessionDeleted = "session_deleted"
	eventSessionsSynced = "sessions_synced"
)

// listEvent is one /api/events server event.
type listEvent struct {
	Type    string          `json:"type"`
	ID      string          `json:"id,omitempty"`
	Session *client.Session `json:"session,omitempty"`
	State   string          `json:"state,omitempty"`
	Status  string          `json:"status,omitempty"`
	Title   *string         `json:"title,omitempty"`
	// PendingApprovals counts the approval requests the Session waits on
	// (its own and its subagents'); with state running and a count above
	// zero the Session is waiting for approval.
	PendingApprovals *int `json:"pendingApprovals,omitempty"`
}

type hubSession struct {
	view      client.Session
	principal string
	pending   map[string]struct{} // "<session that asked>/<tool_call_id>"
}

type hubClient struct {
	principal string
	ch        chan []byte   // encoded SSE events; bounded
	gone      chan struct{} // closed when the hub drops the client
}

// eventsHub is the /api/events fan-out; its zero value is ready to use.
type eventsHub struct {
	mu       sync.Mutex
	starting bool
	ready    chan struct{} // closed when the first snapshot is loaded (or failed)
	err      error         // why the hub stopped; guarded by mu
	sessions map[string]*hubSession
	clients  map[*hubClient]struct{}
}

func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) *apiError {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	if !s.track() {
		return errorf(http.StatusServiceUnavailable, omni.CodeUnavailable, "the gateway is shutting down")
	}
	defer s.streams.Done()
	c, err := s.subscribeEvents(ctx, principal(r.Context()))
	if err != nil {
		return unavailable("watch sessions", err)
	}
	defer s.events.drop(c)

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	hb := time.NewTicker(s.opts.Heartbeat)
	defer hb.Stop()
	for {
		var b []byte
		select {
		case <-ctx.Done():
			return nil
		case <-c.gone:
			return nil
		case <-hb.C:
			b = []byte(": heartbeat\n\n")
		case b = <-c.ch:
		}
		rc.SetWriteDeadline(time.Now().Add(s.opts.WriteTimeout))
		if _, err := w.Write(b); err != nil {
			return nil
		}
	more:
		for { // write what else is queued, then flush once
			select {
			case b = <-c.ch:
				if _, err := w.Write(b); err != nil {
					return nil
				}
			default:
				break more
			}
		}
		if rc.Flush() != nil {
			return nil
		}
	}
}

// subscribeEvents starts the hub if needed and registers a client with its
// snapshot queued.
func (s *Server) subscribeEvents(ctx context.Context, who string) (*hubClient, error) {
	h := &s.events
	h.mu.Lock()
	if !h.starting || h.err != nil {
		if !s.track() {
			h.mu.Unlock()
			return nil, errors.New("the gateway is shutting down")
		}
		h.starting, h.err = true, nil
		h.ready = make(chan struct{})
		h.sessions = map[string]*hubSession{}
		h.clients = map[*hubClient]struct{}{}
		var once sync.Once
		ready := h.ready
		markReady := func() { once.Do(func() { close(ready) }) }
		go func() {
			defer s.streams.Done()
			err := s.runEvents(h, markReady)
			h.mu.Lock()
			h.err = errors.Join(err, errors.New("session watch stopped"))
			for c := range h.clients {
				close(c.gone)
				delete(h.clients, c)
			}
			h.mu.Unlock()
			markReady()
		}()
	}
	ready := h.ready
	h.mu.Unlock()
	select {
	case <-ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}

	c := &hubClient{principal: who, ch: make(chan []byte, max(s.opts.ClientBuffer, 2)), gone: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return nil, h.err
	}
	var list []*hubSession
	for _, hs := range h.sessions {
		if s.canSee(hs, who) {
			list = append(list, hs)
		}
	}
	sort.Slice(list, func(i, j int) bool {
		a, b := list[i].view, list[j].view
		if a.CreatedUnixMs != b.CreatedUnixMs {
			return a.CreatedUnixMs < b.CreatedUnixMs
		}
		return a.ID < b.ID
	})
	var snap bytes.Buffer
	for _, hs := range list {
		snap.Write(encodeListEvent(createdEvent(hs)))
	}
	snap.Write(encodeListEvent(listEvent{Type: eventSessionsSynced}))
	c.ch <- snap.Bytes()
	h.clients[c] = struct{}{}
	return c, nil
}

func (s *Server) canSee(hs *hubSession, who string) bool {
	return !s.auth.enabled() || hs.principal == who
}

func (h *eventsHub) drop(c *hubClient) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.clients[c]; ok {
		delete(h.clients, c)
		close(c.gone)
	}
}

// broadcast queues ev for every client that may see hs; h.mu must be held.
func (h *eventsHub) broadcast(s *Server, hs *hubSession, ev listEvent) {
	b := encodeListEvent(ev)
	for c := range h.clients {
		if !s.canSee(hs, c.principal) {
			continue
		}
		select {
		case c.ch <- b:
		default: // full: disconnect; it reconnects and takes a new snapshot
			delete(h.clients, c)
			close(c.gone)
			s.log.Info().Int("buffer", cap(c.ch)).Msg("events client too slow: disconnected")
		}
	}
}

func encodeListEvent(ev listEvent) []byte {
	b, _ := json.Marshal(ev)
	out := make([]byte, 0, len(b)+32)
	out = append(out, "event: server_event\ndata: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

func createdEvent(hs *hubSession) listEvent {
	v := hs.view
	n := len(hs.pending)
	return listEvent{Type: eventSessionCreated, ID: v.ID, Session: &v, PendingApprovals: &n}
}

func stateEvent(hs *hubSession) listEvent {
	n := len(hs.pending)
	ev := listEvent{Type: eventSessionState, ID: hs.view.ID, State: hs.view.State, PendingApprovals: &n}
	if hs.view.State == omni.StateIdle {
		ev.Status = hs.view.LastStatus
	}
	return ev
}

// runEvents feeds the hub until the server closes or the bus fails.
func (s *Server) runEvents(h *eventsHub, markReady func()) error {
	// ctx ends with the server, or when this returns: that releases the
	// session watch and the consumer's reader goroutine.
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	// The approvals consumer starts before the records are read, so no
	// request or decision falls between the snapshot and the live part.
	// It is a bus.Tail: it survives the loss of its consumer's server.
	info, err := s.stream.Info(ctx)
	if err != nil {
		markReady()
		return err
	}
	msgs := make(chan jetstream.Msg)
	tl, err := bus.StartTail(ctx, s.js, omni.SessionsStream,
		[]string{omni.SessionSubject("*", omni.ClassServer), omni.SessionSubject("*", omni.ClassEvent)},
		info.State.LastSeq+1, bus.TailOptions{
			OnError: func(err error, replacing bool) {
				s.log.Warn().Err(err).Bool("replacing", replacing).Msg("events: the approvals consumer")
			},
		}, func(m jetstream.Msg) {
			select {
			case msgs <- m:
			case <-ctx.Done():
			}
		})
	if err != nil {
		markReady()
		return err
	}
	defer tl.Stop()
	defer cancel() // first: a delivery waiting on msgs returns, then Stop

	changes, err := s.sessions.Watch(ctx)
	if err != nil {
		markReady()
		return err
	}
	initial := true
	for initial {
		select {
		case <-ctx.Done():
			markReady()
			return ctx.Err()
		case c, ok := <-changes:
			if !ok {
				markReady()
				return errors.New("session watch ended")
			}
			if c == nil {
				initial = false
				break
			}
			h.mu.Lock()
			h.applyRecord(s, c)
			h.mu.Unlock()
		}
	}
	s.seedPending(ctx, h)
	markReady()

	for {
		select {
		case <-ctx.Done():
			return nil
		case c, ok := <-changes:
			if !ok {
				return errors.New("session watch ended")
			}
			if c != nil {
				h.mu.Lock()
				h.applyRecord(s, c)
				h.mu.Unlock()
			}
		case m := <-msgs:
			sid, class, _ := omni.ParseSessionSubject(m.Subject())
			h.mu.Lock()
			h.applyMessage(s, sid, class, m.Data())
			h.mu.Unlock()
		}
	}
}

// seedPending asks the engines of running Sessions which approvals they
// wait on (the approvals consumer only sees requests made from now on).
func (s *Server) seedPending(ctx context.Context, h *eventsHub) {
	h.mu.Lock()
	var running []string
	for id, hs := range h.sessions {
		if hs.view.State == omni.StateRunning {
			running = append(running, id)
		}
	}
	h.mu.Unlock()
	var wg sync.WaitGroup
	for _, id := range running {
		wg.Add(1)
		go func() {
			defer wg.Done()
			evs := s.pending(ctx, id)
			h.mu.Lock()
			defer h.mu.Unlock()
			for _, b := range evs {
				h.applyMessage(s, id, omni.ClassServer, b)
			}
		}()
	}
	wg.Wait()
}

// applyRecord folds one record change; h.mu must be held.
func (h *eventsHub) applyRecord(s *Server, c *bus.RecordChange) {
	hs, known := h.sessions[c.ID]
	if c.Deleted || c.Record.Deleted {
		if known {
			delete(h.sessions, c.ID)
			h.broadcast(s, hs, listEvent{Type: eventSessionDeleted, ID: c.ID})
		}
		return
	}
	v := view(c.Record)
	if !known {
		hs = &hubSession{view: v, principal: c.Record.Principal, pending: map[string]struct{}{}}
		h.sessions[c.ID] = hs
		h.broadcast(s, hs, createdEvent(hs))
		return
	}
	old := hs.view
	hs.view, hs.principal = v, c.Record.Principal
	if v.State == omni.StateIdle {
		clear(hs.pending)
	}
	if old.State != v.State || old.LastStatus != v.LastStatus {
		h.broadcast(s, hs, stateEvent(hs))
	}
	if old.Title != v.Title {
		t := v.Title
		h.broadcast(s, hs, listEvent{Type: eventSessionTitle, ID: v.ID, Title: &t})
	}
}

var approvalDecisionType = []byte(`"` + omni.TypeApprovalDecision + `"`)

// applyMessage folds an approval request, an approval decision or an idle
// task_state of Session sid; h.mu must be held.
func (h *eventsHub) applyMessage(s *Server, sid, class string, data []byte) {
	switch class {
	case omni.ClassServer:
		var ev omni.ServerEvent
		if json.Unmarshal(data, &ev) != nil {
			return
		}
		hs := h.sessions[sid]
		if hs == nil {
			return
		}
		switch ev.Type {
		case omni.ServerApprovalRequest:
			var tc omni.Message
			if omni.Unmarshal(ev.ToolCall, &tc) != nil || tc.Payload.ToolCallID == "" {
				return
			}
			asker := sid
			if n := len(ev.Origin); n > 0 {
				asker = ev.Origin[n-1]
			}
			key := asker + "/" + tc.Payload.ToolCallID
			if _, dup := hs.pending[key]; !dup {
				hs.pending[key] = struct{}{}
				h.broadcast(s, hs, stateEvent(hs))
			}
		case omni.ServerTaskState:
			if ev.State == omni.StateIdle && len(hs.pending) > 0 {
				clear(hs.pending)
				h.broadcast(s, hs, stateEvent(hs))
			}
		}
	case omni.ClassEvent:
		if !bytes.Contains(data, approvalDecisionType) {
			return
		}
		m, err := omni.Decode(data)
		if err != nil || m.Payload.Type != omni.TypeApprovalDecision {
			return
		}
		key := sid + "/" + m.Payload.ToolCallID
		for _, hs := range h.sessions {
			if _, ok := hs.pending[key]; ok {
				delete(hs.pending, key)
				h.broadcast(s, hs, stateEvent(hs))
			}
		}
	}
}

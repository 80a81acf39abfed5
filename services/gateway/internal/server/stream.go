package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/omni"
)

// SSE fan-out contract.
//
// Every SSE client gets its own ordered JetStream consumer on the Session's
// client classes (partial, model, event, nested, server), positioned at the
// sequence after its Last-Event-ID (or at the stream's end for a fresh
// connection), and its own bounded buffer of Options.ClientBuffer events
// between that consumer and the HTTP writer. There is no shared in-process
// broadcast: JetStream is the fan-out, so
//
//   - ordering: a client receives the Session's messages in stream order,
//     each exactly once per connection, ids strictly increasing;
//   - isolation: consumers are pull-based and the engine publishes to the
//     stream, never to clients, so a client that stops reading slows neither
//     the engine nor any other client;
//   - slow clients: when a client's buffer is full (it reads slower than the
//     Session produces, or a write blocks past Options.WriteTimeout) it is
//     disconnected. Nothing is lost: it reconnects with Last-Event-ID and the
//     gap is replayed from JetStream, or it gets resync_required when the
//     gap has left retention.
//
// Snapshot placement: the authoritative task_state (from the Session
// record) and the pending approval_requests (asked from the owning engine)
// are read when the consumer has caught up with what was stored when it was
// created — immediately for a fresh connection — and queued between the
// replayed gap and the live tail of that same consumer. Everything published
// after the snapshot was read comes after it on the connection; nothing is
// skipped and nothing is sent twice.

type streamMode int

const (
	modeFresh  streamMode = iota // no Last-Event-ID: snapshot, then live
	modeReplay                   // gap from Last-Event-ID, snapshot, live
	modeResync                   // stale id: resync_required, snapshot, live
)

// sseItem is one entry of a client's buffer: a stream message (seq > 0) or
// a group of id-less events (snapshot, resync_required).
type sseItem struct {
	seq    uint64
	server bool
	data   []byte
	extra  [][]byte // id-less server events
}

// parseEventID splits <epoch>-<seq>.
func parseEventID(id string) (epoch int64, seq uint64, ok bool) {
	e, q, found := strings.Cut(strings.TrimSpace(id), "-")
	if !found {
		return 0, 0, false
	}
	epoch, err1 := strconv.ParseInt(e, 10, 64)
	seq, err2 := strconv.ParseUint(q, 10, 64)
	return epoch, seq, err1 == nil && err2 == nil
}

// epochOf identifies the stream's incarnation: its creation time in unix ms.
func epochOf(info *jetstream.StreamInfo) int64 { return info.Created.UnixMilli() }

type sseStream struct {
	s     *Server
	sid   string
	epoch int64
	mode  streamMode
	f     *follower
}

// openStream decides where a client's consumer starts and creates it. A
// replay start is re-checked after the consumer exists, because a consumer
// created at an evicted sequence silently starts later.
func (s *Server) openStream(ctx context.Context, sid, lastID string) (*sseStream, error) {
	forceResync := false
	for attempt := 0; ; attempt++ {
		info, err := s.stream.Info(ctx)
		if err != nil {
			return nil, err
		}
		st := &sseStream{s: s, sid: sid, epoch: epochOf(info), mode: modeFresh}
		first, last := info.State.FirstSeq, info.State.LastSeq
		start := last + 1
		if lastID != "" {
			epoch, seq, ok := parseEventID(lastID)
			switch {
			case forceResync || !ok || epoch != st.epoch || seq > last:
				st.mode = modeResync
			case seq+1 <= last && seq+1 < first:
				st.mode = modeResync
			default:
				st.mode, start = modeReplay, seq+1
			}
		}
		st.f, err = s.follow(ctx, sid, omni.ClientClasses, start)
		if err != nil {
			return nil, err
		}
		if st.mode != modeReplay || start > last {
			return st, nil
		}
		after, err := s.stream.Info(ctx)
		if err != nil {
			st.f.close()
			return nil, err
		}
		if epochOf(after) == st.epoch && after.State.FirstSeq <= start {
			return st, nil
		}
		st.f.close()
		if attempt >= 2 {
			return nil, errors.New("stream kept changing while positioning the consumer")
		}
		forceResync = true
	}
}

func (s *Server) handleStream(w http.ResponseWriter, r *http.Request) *apiError {
	rec, e := s.load(r)
	if e != nil {
		return e
	}
	lastID := r.Header.Get("Last-Event-ID")
	if lastID == "" {
		lastID = r.URL.Query().Get("lastEventId")
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stopOnClose := context.AfterFunc(s.ctx, cancel)
	defer stopOnClose()
	if !s.track() {
		return errorf(http.StatusServiceUnavailable, omni.CodeUnavailable, "the gateway is shutting down")
	}
	defer s.streams.Done()

	st, err := s.openStream(ctx, rec.ID, lastID)
	if err != nil {
		return unavailable("open stream", err)
	}
	defer st.f.close()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()

	m := s.metrics
	m.sseConnected.Add(1)
	m.sseClients.Add(1)
	defer m.sseClients.Add(-1)
	if st.mode == modeResync {
		m.sseResyncs.Add(1)
	}
	log := s.log.With().Str("session_id", rec.ID).Logger()
	log.Debug().Int("mode", int(st.mode)).Str("last_event_id", lastID).Msg("sse client connected")

	q := newQueue(s.opts.ClientBuffer)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		st.pump(ctx, cancel, q)
	}()
	defer wg.Wait()
	defer st.f.it.Stop() // unblocks the pump's Next; runs before wg.Wait
	defer cancel()

	// The ResponseWriter buffers (4 KiB) by itself: an idle connection
	// keeps no buffer of ours, and a batch costs one flush.
	bw := &errWriter{w: w}
	hb := time.NewTicker(s.opts.Heartbeat)
	defer hb.Stop()
	flush := func() bool {
		rc.SetWriteDeadline(time.Now().Add(s.opts.WriteTimeout))
		return bw.err == nil && rc.Flush() == nil
	}
	var batch []sseItem
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hb.C:
			bw.WriteString(": heartbeat\n\n")
			if !flush() {
				return nil
			}
		case <-q.notify:
			var closed bool
			batch, closed = q.drain(batch)
			if len(batch) > 0 {
				rc.SetWriteDeadline(time.Now().Add(s.opts.WriteTimeout))
				for i := range batch {
					st.write(bw, batch[i])
					batch[i] = sseItem{} // release the message for GC
				}
				if !flush() {
					return nil
				}
			}
			if closed {
				return nil
			}
		}
	}
}

var serverEventLine = []byte("event: server_event\n")

// errWriter writes to w until the first error, which it keeps.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(b []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(b)
	e.err = err
	return n, err
}

func (e *errWriter) WriteString(s string) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := io.WriteString(e.w, s)
	e.err = err
	return n, err
}

func (st *sseStream) write(bw *errWriter, it sseItem) {
	m := st.s.metrics
	if it.seq > 0 {
		var b [48]byte
		id := append(b[:0], "id: "...)
		id = strconv.AppendInt(id, st.epoch, 10)
		id = append(id, '-')
		id = strconv.AppendUint(id, it.seq, 10)
		id = append(id, '\n')
		bw.Write(id)
		if it.server {
			bw.Write(serverEventLine)
		}
		writeData(bw, it.data)
		m.sseEvents.Add(1)
	}
	for _, ev := range it.extra {
		bw.Write(serverEventLine)
		writeData(bw, ev)
		m.sseEvents.Add(1)
	}
}

// writeData writes the data lines and the blank line ending an event. The
// bus carries single-line JSON, written as it is; a multi-line payload is
// split into several data lines, which SSE joins back with newlines.
func writeData(bw *errWriter, data []byte) {
	data = bytes.TrimRight(data, "\r\n")
	for {
		line, rest, more := bytes.Cut(data, []byte{'\n'})
		bw.WriteString("data: ")
		bw.Write(bytes.TrimSuffix(line, []byte{'\r'}))
		bw.WriteString("\n")
		if !more {
			break
		}
		data = rest
	}
	bw.WriteString("\n")
}

var resyncEvent = []byte(`{"type":"resync_required"}`)

// pump moves the consumer's messages into the client's queue and places
// the snapshot once the consumer has caught up. A full queue disconnects
// the client (cancel); pump closes the queue when it returns.
func (st *sseStream) pump(ctx context.Context, cancel context.CancelFunc, q *queue) {
	defer q.close()
	s := st.s
	send := func(it sseItem) bool {
		if q.push(it) {
			return true
		}
		s.metrics.sseSlow.Add(1)
		s.log.Info().Str("session_id", st.sid).Int("buffer", q.limit).Msg("sse client too slow: disconnected")
		cancel()
		return false
	}
	snapshotSent := false
	snapshot := func() bool {
		snapshotSent = true
		return send(sseItem{extra: st.snapshot(ctx)})
	}
	switch {
	case st.mode == modeResync:
		if !send(sseItem{extra: [][]byte{resyncEvent}}) || !snapshot() {
			return
		}
	case st.mode == modeFresh || st.f.pending == 0:
		if !snapshot() {
			return
		}
	}
	var delivered uint64
	for {
		m, err := st.f.it.Next()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				s.log.Warn().Err(err).Str("session_id", st.sid).Msg("sse consumer failed")
			}
			cancel()
			return
		}
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		_, class, _ := omni.ParseSessionSubject(m.Subject())
		if !send(sseItem{seq: md.Sequence.Stream, server: class == omni.ClassServer, data: m.Data()}) {
			return
		}
		if !snapshotSent {
			s.metrics.sseReplayed.Add(1)
			delivered++
			if (delivered >= st.f.pending || md.NumPending == 0) && !snapshot() {
				return
			}
		}
	}
}

// snapshot returns the authoritative task_state from the Session record,
// then every approval_request still pending at the owning engine.
func (st *sseStream) snapshot(ctx context.Context) [][]byte {
	ev := omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateIdle}
	rec, _, err := st.s.sessions.Get(ctx, st.sid)
	if err == nil {
		ev.State = stateOf(rec)
		if ev.State == omni.StateIdle {
			ev.Status = rec.LastStatus
		}
	} else if ctx.Err() == nil {
		st.s.log.Warn().Err(err).Str("session_id", st.sid).Msg("sse snapshot: read session")
	}
	b, _ := json.Marshal(ev)
	out := [][]byte{b}
	if ev.State != omni.StateIdle {
		out = append(out, st.s.pending(ctx, st.sid)...)
	}
	return out
}

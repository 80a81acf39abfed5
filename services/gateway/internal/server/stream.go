package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// SSE fan-out contract.
//
// A gateway holds one live subscription to FLOE_SESSIONS for all the SSE
// clients it serves (the tail, tail.go), however many clients and Sessions:
// the consumers on the stream do not grow with the clients. Each client
// has a bounded queue of Options.ClientBuffer events that the tail fills
// and the client's writer drains:
//
//   - ordering: a client receives its Session's client classes (partial,
//     model, event, nested, server) in stream order, each exactly once per
//     connection, ids strictly increasing;
//   - isolation: the engine publishes to the stream, never to clients, and
//     the tail never waits for a client, so a client that stops reading
//     slows neither the engine nor any other client;
//   - slow clients: when a client's queue is full (it reads slower than
//     its Session produces, or a write blocks past Options.WriteTimeout) it
//     is disconnected. Nothing is lost: it reconnects with Last-Event-ID
//     and the gap is replayed from JetStream, or it gets resync_required
//     when the gap has left retention (below the stream's first sequence,
//     or below the Session record's PurgedThrough: an idle Session's
//     messages purged by the engine, FLOE_IDLE_KEEP).
//
// Reconnects: the client registers with the tail first (which returns the
// tail's position P), then its gap [Last-Event-ID+1, P] is replayed by a
// short-lived ordered consumer deleted right after, then the snapshot, then
// its queue, whose entries at or below the last replayed sequence are
// dropped: no gap and no duplicate at the handover.
//
// Catching up: until a connection is live (its gap replayed, its snapshot
// written) a full queue does not disconnect it: the tail drops it, and it
// registers again and replays from JetStream what the dropped queue held,
// until it keeps up.
//
// Snapshot placement: the authoritative task_state (from the Session
// record) and the pending approval_requests (asked from the owning engine)
// are read after the replay and written between it and the live tail.
// Everything published after the snapshot was read comes after it on the
// connection; nothing is skipped and nothing is sent twice.
//
// An idle connection costs its handler's goroutine (waiting on its queue,
// a heartbeat ticker and its context) and net/http's: no consumer, no
// goroutine of its own, no buffer between batches (each batch is built in
// a pooled buffer and written at once). With Options.DetachSSE the
// handler takes the HTTP/1.1 connection over once the request is accepted
// and writes the chunked response itself: net/http's 10 KiB of buffers and
// its request state are released, and the connection costs one writer
// goroutine and one reading the socket to notice the client leaving.

type streamMode int

const (
	modeFresh  streamMode = iota // no Last-Event-ID: snapshot, then live
	modeReplay                   // gap from Last-Event-ID, snapshot, live
	modeResync                   // stale id: resync_required, snapshot, live
)

// sseItem is one entry of a client's queue: a stream message.
type sseItem struct {
	seq    uint64
	stored int64 // when the stream stored it, unix ns
	server bool  // on the server class: event: server_event
	data   []byte
}

// parseEventID splits <epoch>-<seq>.
func parseEventID(id string) (epoch int64, seq uint64, ok bool) { return client.ParseEventID(id) }

// eventID formats a stream position as an SSE event id.
func eventID(epoch int64, seq uint64) string {
	return strconv.FormatInt(epoch, 10) + "-" + strconv.FormatUint(seq, 10)
}

// epochOf identifies the stream's incarnation: its creation time in unix ms.
func epochOf(info *jetstream.StreamInfo) int64 { return info.Created.UnixMilli() }

// position is where a client's stream starts: the mode, and for a replay
// the first sequence of the gap.
type position struct {
	epoch int64
	mode  streamMode
	start uint64
}

// locate decides the mode from the Last-Event-ID, the stream's state and
// the Session's purged range (its record's PurgedThrough): an id below it
// asks for messages the stream no longer holds for this Session.
func (s *Server) locate(ctx context.Context, lastID string, purged uint64) (position, error) {
	info, err := s.stream.Info(ctx)
	if err != nil {
		return position{}, err
	}
	p := position{epoch: epochOf(info), mode: modeFresh}
	if lastID == "" {
		return p, nil
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	epoch, seq, ok := parseEventID(lastID)
	switch {
	case !ok || epoch != p.epoch || seq > last:
		p.mode = modeResync
	case seq+1 <= last && seq+1 < first, seq < purged:
		p.mode = modeResync
	default:
		p.mode, p.start = modeReplay, seq+1
	}
	return p, nil
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
	if !s.track() {
		return errorf(http.StatusServiceUnavailable, omni.CodeUnavailable, "the gateway is shutting down")
	}
	detached := false // run owns the stream from then on
	defer func() {
		if !detached {
			s.streams.Done()
		}
	}()
	// The stream ends with the server, the client, or the tail cutting it
	// off.
	ctx, cancel := context.WithCancel(s.ctx)
	defer func() {
		if !detached {
			cancel()
		}
	}()

	pos, err := s.locate(ctx, lastID, rec.PurgedThrough)
	if err != nil {
		return unavailable("open stream", err)
	}
	k := &sseConn{s: s, sid: rec.ID, pos: pos, cancel: cancel}
	k.c = &sseClient{sid: rec.ID, q: newQueue(s.opts.ClientBuffer), kick: k.kick}
	if k.live, err = s.tail.subscribe(ctx, k.c); err != nil {
		return unavailable("open stream", err)
	}
	switch pos.mode {
	case modeFresh:
		k.last = k.live
	case modeReplay:
		k.last = pos.start - 1 // the client has everything up to its id
	}

	if s.opts.DetachSSE && r.ProtoMajor == 1 && r.ProtoMinor >= 1 {
		if nc, _, err := http.NewResponseController(w).Hijack(); err == nil {
			// From here the connection is ours: this handler returns (and
			// net/http drops its buffers), run serves it.
			detached = true
			nc.SetDeadline(time.Time{})
			k.out = &connSink{c: nc, timeout: s.opts.WriteTimeout}
			go k.run(ctx, w.Header(), nc)
			return nil
		}
	}
	stop := context.AfterFunc(r.Context(), cancel)
	defer stop()
	h := w.Header()
	for k, v := range sseHeaders {
		h.Set(k, v)
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	k.out = &httpSink{w: w, rc: rc, timeout: s.opts.WriteTimeout}
	k.serve(ctx)
	return nil
}

var sseHeaders = map[string]string{
	"Content-Type":      "text/event-stream",
	"Cache-Control":     "no-cache",
	"X-Accel-Buffering": "no",
}

// sseConn is one SSE connection's writer.
type sseConn struct {
	s      *Server
	sid    string
	pos    position
	c      *sseClient
	cancel context.CancelFunc
	out    sink
	live   uint64 // the tail's position when the client registered
	last   uint64 // the last stream sequence written (or skipped as seen)
	buf    []byte // the batch being built; nil between batches
	slow   atomic.Bool

	mu     sync.Mutex
	isLive bool // guarded by mu: catch-up done, a full queue now disconnects
	behind bool // guarded by mu: the tail dropped the client while catching up
}

// kick is the tail cutting this client off.
// Before the connection is live (replaying, reading the snapshot) a full
// queue is no reason to give up: the client is marked as behind and
// catches up from JetStream (catchUp).
func (k *sseConn) kick(slow bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if slow && !k.isLive {
		k.behind = true
		return
	}
	if slow {
		k.slow.Store(true)
	}
	k.cancel()
}

// goLive moves the connection to live, unless the tail dropped it while
// it was catching up; then it reports false and the writer catches up
// again.
func (k *sseConn) goLive() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.behind {
		k.behind = false
		return false
	}
	k.isLive = true
	return true
}

// catchUp registers the client at the tail again and replays from
// JetStream what its dropped queue held, up to the tail's new position.
func (k *sseConn) catchUp(ctx context.Context) error {
	k.s.metrics.sseCatchUps.Inc()
	k.c = &sseClient{sid: k.sid, q: newQueue(k.s.opts.ClientBuffer), kick: k.kick}
	live, err := k.s.tail.subscribe(ctx, k.c)
	if err != nil {
		return err
	}
	k.live = live
	if k.last >= live {
		return nil
	}
	err = k.replay(ctx, k.last+1)
	if errors.Is(err, errGapGone) {
		k.s.metrics.sseResyncs.Inc()
		k.serverEvent(resyncEvent)
		err = nil
	}
	if err == nil && k.last < live {
		k.last = live
	}
	if err == nil {
		err = k.flush()
	}
	return err
}

// run serves a detached connection: it writes the response head, then
// the stream, while a second goroutine reads the socket only to notice the
// client going away.
func (k *sseConn) run(ctx context.Context, header http.Header, nc net.Conn) {
	defer k.s.streams.Done()
	defer k.cancel()
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		var b [1]byte
		for {
			if _, err := nc.Read(b[:]); err != nil {
				k.cancel()
				return
			}
		}
	}()
	defer func() {
		nc.Close()
		<-readDone
	}()
	cs := k.out.(*connSink)
	k.buf = appendHead(k.pooled(), header)
	err := cs.write(k.buf)
	k.release()
	if err != nil {
		return
	}
	k.serve(ctx)
	cs.end()
}

// appendHead appends the HTTP/1.1 response head of a chunked SSE stream,
// with the headers the handler chain already set.
func appendHead(b []byte, header http.Header) []byte {
	b = append(b, "HTTP/1.1 200 OK\r\n"...)
	line := func(k, v string) {
		b = append(b, k...)
		b = append(b, ": "...)
		b = append(b, strings.Map(func(r rune) rune {
			if r == '\r' || r == '\n' {
				return ' '
			}
			return r
		}, v)...)
		b = append(b, "\r\n"...)
	}
	for k, v := range sseHeaders {
		line(k, v)
	}
	for k, vs := range header {
		if _, ours := sseHeaders[k]; ours || k == "Content-Length" || k == "Transfer-Encoding" || k == "Connection" {
			continue
		}
		for _, v := range vs {
			line(k, v)
		}
	}
	line("Date", time.Now().UTC().Format(http.TimeFormat))
	return append(b, "Transfer-Encoding: chunked\r\n\r\n"...)
}

// serve writes the stream: resync_required or the replayed gap, the
// snapshot, then the live tail until ctx ends.
func (k *sseConn) serve(ctx context.Context) {
	s := k.s
	defer func() { s.tail.unsubscribe(k.c) }()
	m := s.metrics
	m.sseConnected.Inc()
	m.sseClients.Inc()
	defer m.sseClients.Dec()
	defer func() {
		if k.slow.Load() {
			m.sseSlow.Inc()
			s.log.Info().Str("session_id", k.sid).Int("buffer", k.c.q.limit).Msg("sse client too slow: disconnected")
		}
	}()
	if k.pos.mode != modeFresh {
		m.sseReconnects.Inc()
	}
	resync := k.pos.mode == modeResync
	if k.pos.mode == modeReplay && k.pos.start <= k.live {
		err := k.replay(ctx, k.pos.start)
		switch {
		case errors.Is(err, errGapGone):
			resync, k.last = true, 0
		case err != nil:
			if ctx.Err() == nil {
				s.log.Warn().Err(err).Str("session_id", k.sid).Msg("sse replay failed")
			}
			return
		}
	}
	if k.pos.mode == modeReplay && k.last < k.live {
		k.last = k.live // nothing of the Session in the rest of the gap
	}
	if resync {
		m.sseResyncs.Inc()
		k.serverEvent(resyncEvent)
	}
	for _, ev := range k.snapshot(ctx) {
		k.serverEvent(ev)
	}
	if k.flush() != nil {
		return
	}
	for !k.goLive() {
		if err := k.catchUp(ctx); err != nil {
			if ctx.Err() == nil {
				s.log.Warn().Err(err).Str("session_id", k.sid).Msg("sse catch-up failed")
			}
			return
		}
	}

	hb := time.NewTicker(s.opts.Heartbeat)
	defer hb.Stop()
	var batch []sseItem
	for {
		select {
		case <-ctx.Done():
			return
		case <-hb.C:
			k.buf = append(k.pooled(), ": heartbeat\n\n"...)
			if k.flush() != nil {
				return
			}
		case <-k.c.q.notify:
			var closed bool
			batch, closed = k.c.q.drain(batch)
			now := time.Now().UnixNano()
			for i := range batch {
				if it := &batch[i]; it.seq > k.last {
					k.event(it.seq, it.server, it.data)
					m.sseLatency.Observe(float64(now-it.stored) / 1e9)
				}
				batch[i] = sseItem{} // release the message for GC
			}
			if k.flush() != nil || closed {
				return
			}
		}
	}
}

// errGapGone: messages of the gap left the stream while it was being
// replayed (or the stream was recreated).
var errGapGone = errors.New("the gap is no longer retained")

// replay writes the Session's messages from start up to at least the
// tail's position at registration, from a short-lived consumer.
func (k *sseConn) replay(ctx context.Context, start uint64) error {
	s := k.s
	select {
	case s.replays <- struct{}{}:
		defer func() { <-s.replays }()
	case <-ctx.Done():
		return ctx.Err()
	}
	// A consumer created at an evicted sequence silently starts later.
	evicted := func() error {
		after, err := s.stream.Info(ctx)
		if err != nil {
			return err
		}
		if epochOf(after) != k.pos.epoch || after.State.FirstSeq > start {
			return errGapGone
		}
		return nil
	}
	err := s.scan(ctx, k.sid, omni.ClientClasses, start, evicted, func(m bus.StreamMsg) error {
		k.event(m.Seq, m.Class == omni.ClassServer, m.Data)
		s.metrics.sseReplayed.Inc()
		if len(k.buf) >= replayBatch {
			return k.flush()
		}
		return nil
	})
	if err != nil {
		return err
	}
	// The engine records an idle Session's purge before it purges: a
	// record read after the replay that names part of the gap as purged
	// may have had messages removed under the replay.
	return s.purgedSince(ctx, k.sid, start)
}

// purgedSince is errGapGone when the Session's record says that its
// messages from start on were purged (PurgedThrough >= start).
func (s *Server) purgedSince(ctx context.Context, sid string, start uint64) error {
	rec, _, err := s.sessions.Get(ctx, sid)
	if errors.Is(err, bus.ErrSessionNotFound) {
		return nil // deleted meanwhile: the stream ends
	}
	if err != nil {
		return err
	}
	if rec.PurgedThrough >= start {
		return errGapGone
	}
	return nil
}

// maxReplays bounds the replays running at once, each one short-lived
// consumer: a reconnect storm waits its turn instead of multiplying the
// consumers on the stream.
const maxReplays = 32

// replayBatch is the most a replay buffers before writing.
const replayBatch = 64 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// pooled returns k.buf, taking a buffer from the pool when there is none.
func (k *sseConn) pooled() []byte {
	if k.buf == nil {
		k.buf = (*bufPool.Get().(*[]byte))[:0]
	}
	return k.buf
}

// release returns k.buf to the pool; an idle connection holds no buffer.
func (k *sseConn) release() {
	if k.buf == nil {
		return
	}
	if cap(k.buf) <= 256<<10 {
		b := k.buf[:0]
		bufPool.Put(&b)
	}
	k.buf = nil
}

// flush writes the batch built so far, if any.
func (k *sseConn) flush() error {
	if len(k.buf) == 0 {
		return nil
	}
	err := k.out.write(k.buf)
	k.release()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// The client took no write for WriteTimeout: as slow as one whose
		// buffer filled, and counted with them.
		k.slow.Store(true)
	}
	return err
}

var serverEventLine = []byte("event: server_event\n")

// event appends one stream event with its id.
func (k *sseConn) event(seq uint64, server bool, data []byte) {
	b := append(k.pooled(), "id: "...)
	b = strconv.AppendInt(b, k.pos.epoch, 10)
	b = append(b, '-')
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, '\n')
	if server {
		b = append(b, serverEventLine...)
	}
	k.buf = appendData(b, data)
	k.last = seq
	k.s.metrics.sseEvents.Inc()
}

// serverEvent appends an id-less server event (snapshot, resync_required).
func (k *sseConn) serverEvent(data []byte) {
	k.buf = appendData(append(k.pooled(), serverEventLine...), data)
	k.s.metrics.sseEvents.Inc()
}

// appendData appends the data lines and the blank line ending an event.
// The bus carries single-line JSON, written as it is; a multi-line payload
// is split into several data lines, which SSE joins back with newlines.
func appendData(b, data []byte) []byte {
	data = bytes.TrimRight(data, "\r\n")
	for {
		line, rest, more := bytes.Cut(data, []byte{'\n'})
		b = append(b, "data: "...)
		b = append(b, bytes.TrimSuffix(line, []byte{'\r'})...)
		b = append(b, '\n')
		if !more {
			break
		}
		data = rest
	}
	return append(b, '\n')
}

var resyncEvent = []byte(`{"type":"resync_required"}`)

// snapshot returns the authoritative task_state from the Session record,
// then every approval_request still pending at the owning engine.
func (k *sseConn) snapshot(ctx context.Context) [][]byte {
	s := k.s
	ev := omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateIdle}
	rec, _, err := s.sessions.Get(ctx, k.sid)
	if err == nil {
		ev.State = stateOf(rec)
		if ev.State == omni.StateIdle {
			ev.Status = rec.LastStatus
		}
	} else if ctx.Err() == nil {
		s.log.Warn().Err(err).Str("session_id", k.sid).Msg("sse snapshot: read session")
	}
	b, _ := json.Marshal(ev)
	out := [][]byte{b}
	if ev.State != omni.StateIdle {
		out = append(out, s.pending(ctx, k.sid)...)
	}
	return out
}

// sink is where a connection's batches go, each written at once within
// the write timeout.
type sink interface {
	write(p []byte) error
}

// connSink writes HTTP/1.1 chunks on a detached connection; the first
// write is the response head.
type connSink struct {
	c       net.Conn
	timeout time.Duration
	chunked bool // the head is written: later writes are chunks
	failed  bool // a write failed: the response cannot be ended cleanly
}

var crlf = []byte("\r\n")

func (cs *connSink) write(p []byte) error {
	cs.c.SetWriteDeadline(time.Now().Add(cs.timeout))
	var err error
	if !cs.chunked {
		cs.chunked = true
		_, err = cs.c.Write(p)
	} else {
		var h [18]byte
		hb := strconv.AppendUint(h[:0], uint64(len(p)), 16)
		hb = append(hb, '\r', '\n')
		bufs := net.Buffers{hb, p, crlf}
		_, err = bufs.WriteTo(cs.c)
	}
	cs.failed = cs.failed || err != nil
	return err
}

// end writes the last chunk, so the client sees a complete response.
func (cs *connSink) end() {
	if cs.failed || !cs.chunked {
		return
	}
	cs.c.SetWriteDeadline(time.Now().Add(time.Second))
	cs.c.Write([]byte("0\r\n\r\n"))
}

// httpSink writes a batch through the ResponseWriter and flushes it,
// within the write timeout.
type httpSink struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (hs *httpSink) write(p []byte) error {
	hs.rc.SetWriteDeadline(time.Now().Add(hs.timeout))
	if _, err := hs.w.Write(p); err != nil {
		return err
	}
	return hs.rc.Flush()
}

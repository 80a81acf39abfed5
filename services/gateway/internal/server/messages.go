package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
)

// historyResult is a Session's history: Trace records plus the complete
// messages the tracer has not written yet, and the running Task's open
// segments.
type historyResult struct {
	msgs [][]byte
	// positions are the msgs' record ordinals (trace.CutAtRecord), nil
	// when not all are known.
	positions []int
	// page is set for a windowed read (trace.LoadWindow).
	page    *trace.Page
	live    bool
	cursor  uint64
	epoch   int64
	agg     omni.Aggregator
	skipped int
}

// history reads a Session's messages through trace.Load: Trace files up to
// the tracer's recorded position, then FLOE_SESSIONS after its sequence, so
// a lagging tracer hides nothing and nothing appears twice. withLive also
// folds the current Task's partial and nested messages, from the Task's
// task_state running event on, into open segments.
//
// With a window, only the window's records are read into msgs (and only
// they are decoded).
func (s *Server) history(ctx context.Context, rec *omni.SessionRecord, withLive bool, w *trace.Window) (*historyResult, error) {
	h := &historyResult{}
	sid := rec.ID
	info, err := s.stream.Info(ctx)
	if err != nil {
		return nil, err
	}
	running := false
	opt := trace.Options{}
	if withLive {
		opt.Classes = []string{omni.ClassPartial, omni.ClassNested, omni.ClassServer}
		var taskStart uint64
		taskStart, running, err = s.taskStart(ctx, sid)
		if err != nil {
			return nil, err
		}
		if running {
			opt.From = max(taskStart, 1)
		}
		opt.OnStream = func(m bus.StreamMsg, _ bool) error {
			switch m.Class {
			case omni.ClassServer:
				var ev omni.ServerEvent
				if json.Unmarshal(m.Data, &ev) == nil && ev.Type == omni.ServerTaskState {
					// A new Task (or the end of one) closes whatever an
					// interrupted Task left open.
					h.agg = omni.Aggregator{}
					running = ev.State == omni.StateRunning
				}
			case omni.ClassPartial, omni.ClassNested, omni.ClassModel:
				var msg omni.Message
				if omni.Unmarshal(m.Data, &msg) == nil {
					h.agg.Add(&msg)
				}
			}
			return nil
		}
	}
	var th *trace.History
	if w != nil {
		th, h.page, err = trace.LoadWindow(ctx, s.js, s.opts.Home, sid, *w, opt)
		if err == nil {
			th.Records, th.Skipped = h.page.Records, h.page.Skipped
		}
	} else {
		th, err = trace.Load(ctx, s.js, s.opts.Home, sid, opt)
	}
	if err != nil {
		return nil, err
	}
	if th.HavePos && !th.FromStream {
		h.cursor = th.Pos.Seq
	}
	h.cursor = max(h.cursor, th.LastSeq, info.State.LastSeq)
	h.epoch = epochOf(info)
	h.skipped = th.Skipped
	if h.skipped > 0 {
		s.log.Warn().Str("session_id", sid).Int("lines", h.skipped).Bool("from_stream", th.FromStream).Msg("skipped malformed trace lines")
	}
	h.msgs = make([][]byte, len(th.Records))
	for i := range th.Records {
		h.msgs[i] = th.Records[i].Data
	}
	switch {
	case h.page != nil:
		h.positions = h.page.Ordinals
	case th.Skipped == 0 && th.Bad == 0:
		// Every line and stream body became a record: a record's index is
		// its ordinal.
		h.positions = make([]int, len(h.msgs))
		for i := range h.positions {
			h.positions[i] = i
		}
	}
	h.live = withLive && (running || stateOf(rec) == omni.StateRunning)
	return h, nil
}

// taskStart finds the Session's last task_state event: its sequence, and
// whether it says running (a Task is in progress on the stream).
func (s *Server) taskStart(ctx context.Context, sid string) (uint64, bool, error) {
	subj := omni.SessionSubject(sid, omni.ClassServer)
	m, err := s.stream.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	var ev omni.ServerEvent
	if json.Unmarshal(m.Data, &ev) == nil && ev.Type == omni.ServerTaskState {
		return m.Sequence, ev.State == omni.StateRunning, nil
	}
	// The last server event is something else (an approval_request): scan
	// the Session's server events, which are few.
	var seq uint64
	running := false
	err = s.scan(ctx, sid, []string{omni.ClassServer}, 1, nil, func(m bus.StreamMsg) error {
		var ev omni.ServerEvent
		if json.Unmarshal(m.Data, &ev) == nil && ev.Type == omni.ServerTaskState {
			seq, running = m.Seq, ev.State == omni.StateRunning
		}
		return nil
	})
	return seq, running, err
}

// hasModelAfterHead reports whether the current context (the records after
// the last session_meta) holds any model message: what a compaction needs.
func (h *historyResult) hasModelAfterHead() bool {
	found := false
	for _, b := range h.msgs {
		var m omni.Message
		if omni.Unmarshal(b, &m) != nil {
			continue
		}
		switch m.Type {
		case omni.KindSessionMeta:
			found = false
		case omni.KindModel:
			found = true
		}
	}
	return found
}

func (s *Server) handleMessages(rw http.ResponseWriter, r *http.Request) *apiError {
	rec, e := s.load(r)
	if e != nil {
		return e
	}
	w, e := windowOf(r)
	if e != nil {
		return e
	}
	// A page before a cursor is history only: the live part belongs to
	// the newest window.
	withLive := w == nil || !w.HaveBefore
	h, err := s.history(r.Context(), rec, withLive, w)
	if errors.Is(err, trace.ErrCursor) {
		return badRequest("before: %v", err)
	}
	if err != nil {
		return unavailable("read messages", err)
	}
	var live *liveAnswer
	if h.live {
		live = &liveAnswer{cursor: eventID(h.epoch, h.cursor), fragments: [][]byte{}}
		for _, m := range h.agg.Open() {
			b, err := omni.Marshal(&m)
			if err != nil {
				return internalError("encode fragment", err)
			}
			live.fragments = append(live.fragments, b)
		}
	}
	writeMessages(rw, h.msgs, h.positions, h.page, live)
	return nil
}

// maxTailTasks bounds tailTasks (a larger window is the whole history's
// cost again; page instead).
const maxTailTasks = 10_000

// windowOf reads the window query of /messages: tailTasks=N (the newest N
// Tasks) and before=<cursor> (the page before a window's start); neither
// is the whole history, before alone everything before the cursor.
func windowOf(r *http.Request) (*trace.Window, *apiError) {
	q := r.URL.Query()
	tail, before := q.Get("tailTasks"), q.Get("before")
	if tail == "" && before == "" {
		return nil, nil
	}
	w := &trace.Window{Tasks: maxTailTasks}
	if tail != "" {
		n, err := strconv.Atoi(tail)
		if err != nil || n <= 0 || n > maxTailTasks {
			return nil, badRequest("tailTasks %q is not a whole number from 1 to %d", tail, maxTailTasks)
		}
		w.Tasks = n
	}
	if before != "" {
		n, err := strconv.Atoi(before)
		if err != nil || n < 0 {
			return nil, badRequest("before %q is not a cursor this Session's history gave", before)
		}
		w.Before, w.HaveBefore = n, true
	}
	return w, nil
}

// liveAnswer is client.Live with its fragments encoded.
type liveAnswer struct {
	cursor    string
	fragments [][]byte
}

// writeMessages writes the answer of /messages (client.Messages) with
// every record as its bytes (protocol.md §2: bodies pass through, never
// re-encoded; encoding/json would compact each again and escape its <, >
// and &, which also made it most of the handler's time).
//
// A windowed answer (page set) also carries "window": {"start": the cursor
// of the page before it, "more": whether there is one}; "positions" are the
// messages' record ordinals, when known.
func writeMessages(w http.ResponseWriter, msgs [][]byte, positions []int, page *trace.Page, live *liveAnswer) {
	const head = `{"messages":`
	var liveHead, window, pos []byte
	tail := "}\n"
	size := len(head) + rawArraySize(msgs)
	if len(msgs) > 0 && len(positions) == len(msgs) {
		pos = append(pos, `,"positions":[`...)
		for i, n := range positions {
			if i > 0 {
				pos = append(pos, ',')
			}
			pos = strconv.AppendInt(pos, int64(n), 10)
		}
		pos = append(pos, ']')
		size += len(pos)
	}
	if page != nil {
		window = fmt.Appendf(nil, `,"window":{"start":"%d","more":%t}`, page.Start, page.More)
		size += len(window)
	}
	if live != nil {
		cursor, _ := json.Marshal(live.cursor) // a string: cannot fail
		liveHead = append(append([]byte(`,"live":{"cursor":`), cursor...), `,"fragments":`...)
		tail = "}}\n"
		size += len(liveHead) + rawArraySize(live.fragments)
	}
	size += len(tail)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Length", strconv.Itoa(size))
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.WriteString(head)
	writeRawArray(bw, msgs)
	bw.Write(pos)
	bw.Write(window)
	if live != nil {
		bw.Write(liveHead)
		writeRawArray(bw, live.fragments)
	}
	bw.WriteString(tail)
	bw.Flush() // a write error is the client gone: nothing to tell it
}

// rawArraySize is the size of writeRawArray's output.
func rawArraySize(vals [][]byte) int {
	n := len("[]") + max(len(vals)-1, 0)
	for _, v := range vals {
		n += len(v)
	}
	return n
}

// writeRawArray writes a JSON array of values that are JSON already.
func writeRawArray(w *bufio.Writer, vals [][]byte) {
	w.WriteByte('[')
	for i, v := range vals {
		if i > 0 {
			w.WriteByte(',')
		}
		w.Write(v)
	}
	w.WriteByte(']')
}

package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// historyResult is a Session's history: Trace records plus the complete
// messages the tracer has not written yet, and the running Task's open
// segments.
type historyResult struct {
	msgs    [][]byte
	live    bool
	cursor  uint64
	agg     omni.Aggregator
	skipped int
}

// history reads a Session's messages. Trace files are read up to the
// tracer's recorded position (omni.TracePos: file index and size at stream
// sequence Seq); everything after that sequence comes from FLOE_SESSIONS, so
// a lagging tracer hides nothing and nothing appears twice. withLive also
// folds the current Task's partial and nested messages, from the Task's
// task_state running event on, into open segments.
func (s *Server) history(ctx context.Context, rec *omni.SessionRecord, withLive bool) (*historyResult, error) {
	h := &historyResult{}
	sid := rec.ID
	pos, havePos, err := omni.ReadTracePos(s.opts.Home, sid)
	if errors.Is(err, omni.ErrBadTracePos) {
		s.log.Warn().Err(err).Str("session_id", sid).Msg("ignoring damaged trace position")
		havePos, err = false, nil
	}
	if err != nil {
		return nil, err
	}
	files, err := omni.TraceFiles(s.opts.Home, sid)
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		idx, ok := omni.TraceIndexOf(f, sid)
		if !ok {
			continue
		}
		limit := int64(-1)
		if havePos {
			if idx > pos.Index {
				continue
			}
			if idx == pos.Index {
				limit = pos.Size
			}
		}
		n, err := readTraceRecords(f, limit, &h.msgs)
		if err != nil {
			return nil, err
		}
		h.skipped += n
	}
	if h.skipped > 0 {
		s.log.Warn().Str("session_id", sid).Int("lines", h.skipped).Msg("skipped malformed trace lines")
	}

	info, err := s.stream.Info(ctx)
	if err != nil {
		return nil, err
	}
	last := info.State.LastSeq
	// streamFrom is the first sequence whose complete messages are not in
	// the Trace files read above.
	var streamFrom uint64
	switch {
	case havePos:
		streamFrom = pos.Seq + 1
		h.cursor = pos.Seq
	case len(files) == 0:
		streamFrom = 1
	default:
		// Trace files without a tracer position (imported, or written by
		// another tool): they are the whole history.
		streamFrom = last + 1
	}

	classes := []string{omni.ClassMeta, omni.ClassModel, omni.ClassEvent}
	start := streamFrom
	running := false
	if withLive {
		classes = append(classes, omni.ClassPartial, omni.ClassNested, omni.ClassServer)
		var taskStart uint64
		taskStart, running, err = s.taskStart(ctx, sid)
		if err != nil {
			return nil, err
		}
		if running && taskStart < start {
			start = taskStart
		}
	}
	h.cursor = max(h.cursor, last)
	if start <= last {
		err = s.scan(ctx, sid, classes, start, func(m bus.StreamMsg) error {
			h.cursor = max(h.cursor, m.Seq)
			switch m.Class {
			case omni.ClassServer:
				var ev omni.ServerEvent
				if json.Unmarshal(m.Data, &ev) == nil && ev.Type == omni.ServerTaskState {
					// A new Task (or the end of one) closes whatever an
					// interrupted Task left open.
					h.agg = omni.Aggregator{}
					running = ev.State == omni.StateRunning
				}
				return nil
			case omni.ClassMeta, omni.ClassModel, omni.ClassEvent:
				if m.Seq >= streamFrom {
					h.msgs = append(h.msgs, m.Data)
				}
			}
			if withLive && (m.Class == omni.ClassPartial || m.Class == omni.ClassNested || m.Class == omni.ClassModel) {
				var msg omni.Message
				if omni.Unmarshal(m.Data, &msg) == nil {
					h.agg.Add(&msg)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
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
	err = s.scan(ctx, sid, []string{omni.ClassServer}, 1, func(m bus.StreamMsg) error {
		var ev omni.ServerEvent
		if json.Unmarshal(m.Data, &ev) == nil && ev.Type == omni.ServerTaskState {
			seq, running = m.Seq, ev.State == omni.StateRunning
		}
		return nil
	})
	return seq, running, err
}

// readTraceRecords appends the valid records of one Trace file (its first
// limit bytes when limit >= 0) as their original bytes, skipping malformed
// lines as omni.ReadTrace does; it returns how many it skipped.
func readTraceRecords(path string, limit int64, out *[][]byte) (int, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil // removed meanwhile (rotation never removes; deletion does)
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var r io.Reader = f
	if limit >= 0 {
		r = io.LimitReader(f, limit)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return 0, err
	}
	skipped := 0
	for len(data) > 0 {
		line, rest, _ := bytes.Cut(data, []byte{'\n'})
		data = rest
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		if _, err := omni.Decode(line); err != nil {
			skipped++
			continue
		}
		*out = append(*out, line)
	}
	return skipped, nil
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

func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) *apiError {
	rec, e := s.load(r)
	if e != nil {
		return e
	}
	h, err := s.history(r.Context(), rec, true)
	if err != nil {
		return unavailable("read messages", err)
	}
	out := client.Messages{Messages: make([]json.RawMessage, len(h.msgs))}
	for i, b := range h.msgs {
		out.Messages[i] = b
	}
	if h.live {
		live := &client.Live{Cursor: h.cursor, Fragments: []json.RawMessage{}}
		for _, m := range h.agg.Open() {
			b, err := omni.Marshal(&m)
			if err != nil {
				return internalError("encode fragment", err)
			}
			live.Fragments = append(live.Fragments, b)
		}
		out.Live = live
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

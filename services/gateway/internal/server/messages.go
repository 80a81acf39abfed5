package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway/client"
)

// historyResult is a Session's history: Trace records plus the complete
// messages the tracer has not written yet, and the running Task's open
// segments.
type historyResult struct {
	msgs    [][]byte
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
func (s *Server) history(ctx context.Context, rec *omni.SessionRecord, withLive bool) (*historyResult, error) {
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
	th, err := trace.Load(ctx, s.js, s.opts.Home, sid, opt)
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
		live := &client.Live{Cursor: eventID(h.epoch, h.cursor), Fragments: []json.RawMessage{}}
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

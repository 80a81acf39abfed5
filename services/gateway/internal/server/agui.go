package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
	"floe.dev/services/gateway/internal/agui"
)

// AG-UI 1.0 (protocol.md §9): POST /api/agui runs a RunAgentInput and answers the
// run's events; GET /api/agui/{threadId}/{runId} replays a run (after
// Last-Event-ID) and follows it to its end. Both map the Session's stream
// with agui.Mapper, from the Task's start, so a replay equals the live run.

// aguiThread binds an AG-UI thread to its Session and remembers its last
// run (floe_protocols key agui.thread.<hash of threadId>).
type aguiThread struct {
	SessionID string `json:"sessionId"`
	aguiRunRef
}

// aguiRunRef places a run in its Task: the runs of one Task are its
// segments (agui.Mapper), numbered from 1; From is a stream sequence at or
// before the Task's start.
type aguiRunRef struct {
	RunID   string `json:"runId,omitempty"`
	TaskID  string `json:"taskId,omitempty"`
	From    uint64 `json:"from,omitempty"`
	Segment int    `json:"segment,omitempty"`
}

// aguiRun is one run (key agui.run.<hash of threadId, runId>).
type aguiRun struct {
	ThreadID  string `json:"threadId"`
	SessionID string `json:"sessionId"`
	aguiRunRef
}

func threadKey(threadID string) string     { return protoKey("agui.thread", threadID) }
func runKey(threadID, runID string) string { return protoKey("agui.run", threadID, runID) }
func aguiBadInput(err error) *apiError     { return badRequest("%v", err) }

// aguiThreadOf resolves threadID to its Session: a Session id names that
// Session; any other id is bound in the bucket, and with create a new
// Session is made and bound when it is not. The caller must be allowed to
// see the Session (404 otherwise).
func (s *Server) aguiThreadOf(ctx context.Context, b *bindings, threadID string, create bool) (*omni.SessionRecord, *aguiThread, *apiError) {
	var th aguiThread
	err := b.get(ctx, threadKey(threadID), &th)
	if err != nil && !errors.Is(err, errNoBinding) {
		return nil, nil, unavailable("read thread", err)
	}
	if err == nil {
		rec, e := s.visibleSession(ctx, th.SessionID)
		return rec, &th, e
	}
	// A Session's id names that Session (404 when the caller may not see
	// it, as on the REST routes).
	if rec, _, err := s.sessions.Get(ctx, threadID); err == nil {
		if !s.visible(ctx, rec) {
			return nil, nil, errNotFound
		}
		return rec, &aguiThread{SessionID: rec.ID}, nil
	} else if !errors.Is(err, bus.ErrSessionNotFound) {
		return nil, nil, unavailable("read session", err)
	}
	if !create {
		return nil, nil, errNotFound
	}
	rec, e := s.createSession(ctx, client.CreateSession{})
	if e != nil {
		return nil, nil, e
	}
	th = aguiThread{SessionID: rec.ID}
	ok, err := b.create(ctx, threadKey(threadID), &th)
	if err != nil {
		return nil, nil, unavailable("bind thread", err)
	}
	if !ok { // another request bound it first: use that Session
		return s.aguiThreadOf(ctx, b, threadID, false)
	}
	s.log.Info().Str("session_id", rec.ID).Str("thread_id", threadID).Msg("ag-ui thread bound to a new session")
	return rec, &th, nil
}

func (s *Server) handleAGUIRun(w http.ResponseWriter, r *http.Request) *apiError {
	var raw json.RawMessage
	if e := s.decodeBody(w, r, &raw, false); e != nil {
		return e
	}
	in, err := agui.ParseInput(raw)
	if err != nil {
		return aguiBadInput(err)
	}
	ctx := r.Context()
	b, e := s.protocols(ctx)
	if e != nil {
		return e
	}
	rec, th, e := s.aguiThreadOf(ctx, b, in.ThreadID, true)
	if e != nil {
		return e
	}
	run := aguiRun{ThreadID: in.ThreadID, SessionID: rec.ID}
	run.RunID = in.RunID
	resuming := len(in.Resume) > 0 && th.TaskID != "" && stateOf(rec) != omni.StateIdle && rec.TaskID == th.TaskID
	if resuming {
		for _, rs := range in.Resume {
			d, _ := rs.Decision() // checked by ParseInput
			rep, err := s.control(ctx, rec.ID, omni.CtlApprove, omni.Control{ToolCallID: agui.RawCallID(rs.InterruptID), Decision: d}, s.opts.ControlTimeout)
			switch {
			case bus.IsNoResponders(err):
				// The Task's engine is gone or failing over; the run shows
				// how the Task goes on.
			case err != nil:
				return controlFailed("approve", err)
			case !rep.OK && rep.Code != omni.CodeNotFound:
				return replyError(rep)
			}
		}
		run.TaskID, run.From, run.Segment = th.TaskID, th.From, th.Segment+1
	} else {
		parts, err := in.Prompt()
		if err != nil {
			return aguiBadInput(err)
		}
		if len(parts) == 0 {
			return badRequest("the run has no new user message and answers no pending interrupt")
		}
		input := make([]omni.InputPart, len(parts))
		for i, p := range parts {
			if p.ImageURL != "" {
				input[i] = omni.InputPart{Type: client.InputImageURL, ImageURL: p.ImageURL}
			} else {
				input[i] = omni.InputPart{Type: client.InputText, Text: p.Text}
			}
		}
		task := omni.Task{Kind: omni.TaskRun, SessionID: rec.ID, Input: input}
		if e := s.fitsBus(&task); e != nil {
			return e
		}
		from, _, err := s.lastSeq(ctx)
		if err != nil {
			return unavailable("read stream", err)
		}
		id, e := s.submitTask(ctx, rec, omni.StateRunning, task)
		if e != nil {
			return e
		}
		run.TaskID, run.From, run.Segment = id, from+1, 1
	}
	s.log.Info().Str("session_id", rec.ID).Str("task_id", run.TaskID).Str("thread_id", run.ThreadID).Str("run_id", run.RunID).
		Int("segment", run.Segment).Msg("ag-ui run")
	th.aguiRunRef = run.aguiRunRef
	if err := b.put(ctx, runKey(run.ThreadID, run.RunID), &run); err != nil {
		return unavailable("store run", err)
	}
	if err := b.put(ctx, threadKey(run.ThreadID), th); err != nil {
		return unavailable("store thread", err)
	}
	return s.streamAGUIRun(w, r, &run, "", rec.PurgedThrough)
}

func (s *Server) handleAGUIReplay(w http.ResponseWriter, r *http.Request) *apiError {
	ctx := r.Context()
	b, e := s.protocols(ctx)
	if e != nil {
		return e
	}
	threadID, runID := r.PathValue("threadId"), r.PathValue("runId")
	rec, _, e := s.aguiThreadOf(ctx, b, threadID, false)
	if e != nil {
		return e
	}
	var run aguiRun
	if err := b.get(ctx, runKey(threadID, runID), &run); errors.Is(err, errNoBinding) || (err == nil && run.SessionID != rec.ID) {
		return errorf(http.StatusNotFound, omni.CodeNotFound, "no run %q in thread %q", runID, threadID)
	} else if err != nil {
		return unavailable("read run", err)
	}
	last := r.Header.Get("Last-Event-ID")
	if last == "" {
		last = r.URL.Query().Get("lastEventId")
	}
	return s.streamAGUIRun(w, r, &run, last, rec.PurgedThrough)
}

// eventPos is an event's place in the stream: its message's sequence and
// its index among that message's events (-1: every event of the message).
type eventPos struct {
	seq uint64
	k   int
}

// parseAGUIID reads <epoch>-<seq>[:k]; ok is false for anything else.
func parseAGUIID(id string) (epoch int64, p eventPos, ok bool) {
	head, kstr, hasK := strings.Cut(id, ":")
	e, seq, good := parseEventID(head)
	if !good {
		return 0, eventPos{}, false
	}
	p = eventPos{seq: seq, k: -1}
	if hasK {
		k, err := strconv.Atoi(kstr)
		if err != nil || k < 0 {
			return 0, eventPos{}, false
		}
		p.k = k
	}
	return e, p, true
}

// after reports whether o comes after p.
func (p eventPos) after(o agui.Out) bool {
	if o.Seq != p.seq {
		return o.Seq > p.seq
	}
	return p.k >= 0 && o.Index > p.k
}

// streamAGUIRun answers the run's events as SSE: from its RUN_STARTED, or
// only those after lastID, following the stream live to the run's end.
// purged is the Session record's PurgedThrough.
func (s *Server) streamAGUIRun(w http.ResponseWriter, r *http.Request, run *aguiRun, lastID string, purged uint64) *apiError {
	kept, epoch, err := s.retained(r.Context(), run.From, purged)
	if err != nil {
		return unavailable("read stream", err)
	}
	if !kept {
		return errorf(http.StatusGone, omni.CodeExpired, "run %q: its messages have left the stream's retention", run.RunID)
	}
	skip := eventPos{}
	if lastID != "" {
		if e, p, ok := parseAGUIID(lastID); ok && e == epoch {
			skip = p
		}
	}
	lctx, done := s.longLived(r)
	if lctx == nil {
		return errorf(http.StatusServiceUnavailable, omni.CodeUnavailable, "the gateway is shutting down")
	}
	defer done()
	ctx, cancel := context.WithCancel(lctx)
	write := s.sseStart(w)
	batches := make(chan []byte, 16)
	defer func() {
		cancel()
		for range batches { // the reader ends with ctx
		}
	}()
	readErr := make(chan error, 1)
	go func() {
		defer close(batches)
		m := agui.New(run.TaskID)
		var buf []byte
		readErr <- s.readSession(ctx, run.SessionID, run.From, func(it streamItem) error {
			outs := m.Feed(it.seq, it.server, it.data)
			ended := false
			for _, o := range outs {
				if o.Segment != run.Segment {
					continue
				}
				ended = ended || agui.Terminal(o.Event)
				if !skip.after(o) {
					continue
				}
				switch o.Event["type"] {
				case agui.RunStarted, agui.RunFinished:
					o.Event["threadId"], o.Event["runId"] = run.ThreadID, run.RunID
				}
				data, err := json.Marshal(o.Event)
				if err != nil {
					return err
				}
				buf = append(buf, "id: "...)
				buf = append(buf, o.ID(epoch)...)
				buf = append(buf, '\n')
				buf = appendData(buf, data)
			}
			if len(buf) > 0 {
				select {
				case batches <- buf:
					buf = nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if ended || m.Segment() > run.Segment || m.Done() {
				return errStopRead
			}
			return nil
		})
	}()
	hb := time.NewTicker(s.heartbeatEvery())
	defer hb.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hb.C:
			if write([]byte(": heartbeat\n\n")) != nil {
				return nil
			}
		case b, ok := <-batches:
			if !ok {
				if err := <-readErr; err != nil && ctx.Err() == nil {
					s.log.Warn().Err(err).Str("session_id", run.SessionID).Msg("ag-ui run stream failed")
				}
				return nil
			}
			if write(b) != nil {
				return nil
			}
		}
	}
}

package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// control sends one control request to the engine owning the Session's
// Task (core NATS request, msgpack both ways). bus.IsNoResponders(err)
// means no engine holds the Session.
func (s *Server) control(ctx context.Context, sid, verb string, c omni.Control, timeout time.Duration) (*omni.ControlReply, error) {
	msg, err := bus.PackMsg(omni.ControlSubject(sid, verb), &c)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := s.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return nil, err
	}
	var rep omni.ControlReply
	if err := omni.Unpack(resp.Data, &rep); err != nil {
		return nil, err
	}
	return &rep, nil
}

// replyError maps an engine's refusal to an HTTP answer.
func replyError(rep *omni.ControlReply) *apiError {
	msg := rep.Message
	if msg == "" {
		msg = "the engine refused: " + rep.Code
	}
	switch rep.Code {
	case omni.CodeNotFound:
		return errorf(http.StatusNotFound, rep.Code, "%s", msg)
	case omni.CodeBadRequest:
		return errorf(http.StatusBadRequest, rep.Code, "%s", msg)
	case omni.CodeNotRunning, omni.CodeTaskInProgress, omni.CodeCompacting, omni.CodeNothingToCompact:
		return errorf(http.StatusConflict, rep.Code, "%s", msg)
	case omni.CodeUnavailable:
		return errorf(http.StatusServiceUnavailable, rep.Code, "%s", msg)
	}
	return errorf(http.StatusInternalServerError, omni.CodeInternal, "%s", msg)
}

func controlFailed(verb string, err error) *apiError {
	return &apiError{Status: http.StatusServiceUnavailable, Code: omni.CodeUnavailable, Message: verb + ": the engine did not answer, retry later", Err: err}
}

// controlWhileRunning sends a control request; while nobody answers but the
// record says a Task holds the Session (it may still be queued, or its
// engine failing over), it retries for up to QueueWait. It returns the reply,
// or rep == nil with the last record when no engine answered (idle record,
// or still none after the wait).
func (s *Server) controlWhileRunning(ctx context.Context, sid, verb string, c omni.Control) (*omni.ControlReply, *omni.SessionRecord, error) {
	deadline := time.Now().Add(s.opts.QueueWait)
	for {
		rep, err := s.control(ctx, sid, verb, c, s.opts.ControlTimeout)
		if err == nil {
			return rep, nil, nil
		}
		if !bus.IsNoResponders(err) {
			return nil, nil, err
		}
		rec, _, gerr := s.sessions.Get(ctx, sid)
		if gerr != nil {
			return nil, nil, gerr
		}
		if stateOf(rec) == omni.StateIdle || rec.Deleted || !time.Now().Before(deadline) {
			return nil, rec, nil
		}
		if err := retry.Sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, nil, err
		}
	}
}

func (s *Server) handleApprove(w http.ResponseWriter, r *http.Request) *apiError {
	rec, e := s.load(r)
	if e != nil {
		return e
	}
	var req client.Decision
	if e := s.decodeBody(w, r, &req, false); e != nil {
		return e
	}
	if req.Decision != omni.DecisionAllow && req.Decision != omni.DecisionDeny {
		return badRequest("decision %q is not allow or deny", req.Decision)
	}
	if req.Scope != "" && (req.Scope != omni.ScopeSession || req.Decision != omni.DecisionAllow) {
		return badRequest("scope %q: only \"session\", with decision allow", req.Scope)
	}
	tc := r.PathValue("toolCallId")
	rep, err := s.control(r.Context(), rec.ID, omni.CtlApprove, omni.Control{ToolCallID: tc, Decision: req.Decision, Scope: req.Scope}, s.opts.ControlTimeout)
	if bus.IsNoResponders(err) {
		return errorf(http.StatusNotFound, omni.CodeNotFound, "no approval is pending for tool call %q", tc)
	}
	if err != nil {
		return controlFailed("approve", err)
	}
	if !rep.OK {
		return replyError(rep)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// handleAbort interrupts the running Task: 202 when an engine took the
// abort, 204 when the Session is idle. A Task that no engine answers for
// within QueueWait (still queued with no engine up, or its engine gone) is
// cancelled here: its queued message is purged, the record released with
// status aborted, and task_state idle published, so the Session never stays
// stuck; the engine, which re-checks its hold on the record, drops it.
func (s *Server) handleAbort(w http.ResponseWriter, r *http.Request) *apiError {
	rec, e := s.load(r)
	if e != nil {
		return e
	}
	var req struct{}
	if e := s.decodeBody(w, r, &req, true); e != nil {
		return e
	}
	interrupted, e := s.abortTask(r.Context(), rec)
	if e != nil {
		return e
	}
	if interrupted {
		w.WriteHeader(http.StatusAccepted)
	} else {
		w.WriteHeader(http.StatusNoContent)
	}
	return nil
}

// abortTask interrupts the Session's running Task (see handleAbort): true
// when a Task was interrupted, false when the Session was idle.
func (s *Server) abortTask(ctx context.Context, rec *omni.SessionRecord) (bool, *apiError) {
	rep, last, err := s.controlWhileRunning(ctx, rec.ID, omni.CtlAbort, omni.Control{})
	if err != nil {
		return false, controlFailed("abort", err)
	}
	if rep != nil {
		if rep.OK {
			return true, nil
		}
		if rep.Code == omni.CodeNotRunning {
			return false, nil
		}
		return false, replyError(rep)
	}
	if stateOf(last) == omni.StateIdle || last.Deleted {
		return false, nil
	}
	if err := s.cancelOrphan(ctx, last); err != nil {
		return false, unavailable("cancel task", err)
	}
	return true, nil
}

// cancelOrphan releases a record held by a Task no engine answers for.
func (s *Server) cancelOrphan(ctx context.Context, rec *omni.SessionRecord) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), submitTimeout)
	defer cancel()
	tasks, err := s.js.Stream(ctx, omni.TasksStream)
	if err != nil {
		return err
	}
	if err := tasks.Purge(ctx, jetstream.WithPurgeSubject(omni.TaskSubject(rec.ID))); err != nil {
		return err
	}
	if err := s.sessions.End(ctx, rec.ID, rec.TaskID, omni.StatusAborted); err != nil {
		return err
	}
	ev, _ := json.Marshal(omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateIdle, Status: omni.StatusAborted, TaskID: rec.TaskID})
	if _, err := s.js.Publish(ctx, omni.SessionSubject(rec.ID, omni.ClassServer), ev); err != nil {
		return err
	}
	s.log.Warn().Str("session_id", rec.ID).Str("task_id", rec.TaskID).Msg("cancelled a task no engine answered for")
	return nil
}

func (s *Server) handleSteer(w http.ResponseWriter, r *http.Request) *apiError {
	rec, e := s.load(r)
	if e != nil {
		return e
	}
	var req client.Steer
	if e := s.decodeBody(w, r, &req, false); e != nil {
		return e
	}
	if req.Text == "" {
		return badRequest("text is empty")
	}
	rep, _, err := s.controlWhileRunning(r.Context(), rec.ID, omni.CtlSteer, omni.Control{Text: req.Text})
	if err != nil {
		return controlFailed("steer", err)
	}
	if rep == nil {
		return errorf(http.StatusConflict, omni.CodeNotRunning, "no task is running")
	}
	if !rep.OK {
		return replyError(rep)
	}
	w.WriteHeader(http.StatusAccepted)
	return nil
}

func (s *Server) handleRetryNow(w http.ResponseWriter, r *http.Request) *apiError {
	rec, e := s.load(r)
	if e != nil {
		return e
	}
	var req struct{}
	if e := s.decodeBody(w, r, &req, true); e != nil {
		return e
	}
	rep, err := s.control(r.Context(), rec.ID, omni.CtlRetryNow, omni.Control{}, s.opts.ControlTimeout)
	if bus.IsNoResponders(err) {
		writeJSON(w, http.StatusOK, client.RetryNowResult{Skipped: false})
		return nil
	}
	if err != nil {
		return controlFailed("retry-now", err)
	}
	if !rep.OK {
		if rep.Code == omni.CodeNotRunning {
			writeJSON(w, http.StatusOK, client.RetryNowResult{Skipped: false})
			return nil
		}
		return replyError(rep)
	}
	writeJSON(w, http.StatusOK, client.RetryNowResult{Skipped: rep.Skipped})
	return nil
}

// pending asks the owning engine for its pending approval requests, each the
// JSON of an approval_request server event; none when no engine holds the
// Session.
func (s *Server) pending(ctx context.Context, sid string) [][]byte {
	timeout := min(s.opts.ControlTimeout, 2*time.Second)
	rep, err := s.control(ctx, sid, omni.CtlPending, omni.Control{}, timeout)
	if err != nil {
		if !bus.IsNoResponders(err) && !errors.Is(err, context.Canceled) {
			s.log.Warn().Err(err).Str("session_id", sid).Msg("pending approvals")
		}
		return nil
	}
	return rep.Pending
}

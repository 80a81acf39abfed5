package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
	"floe.dev/services/gateway/internal/a2a"
	"floe.dev/services/gateway/internal/agui"
)

// eventOut places the i-th of n events of the message seq (for its SSE id).
func eventOut(seq uint64, i, n int) agui.Out { return agui.Out{Seq: seq, Index: i, Of: n} }

// A2A 1.0 (protocol.md §9): the Agent Card and the JSON-RPC binding at /a2a.
// Contexts are Sessions, tasks are Tasks; a2a.Folder builds a Task from the
// Session's stream, and the binding of a task id to its Session lives in
// the floe_protocols bucket (key a2a.task.<hash of task id>).

// a2aTask binds an A2A task (a Floe Task id) to its Session; From is a
// stream sequence at or before the Task's start.
type a2aTask struct {
	SessionID string `json:"sessionId"`
	From      uint64 `json:"from"`
}

func a2aTaskKey(id string) string { return protoKey("a2a.task", id) }

func (s *Server) protocolRoutes(m *http.ServeMux) {
	m.HandleFunc("POST /api/agui", s.serve(s.handleAGUIRun))
	m.HandleFunc("GET /api/agui/{threadId}/{runId}", s.serve(s.handleAGUIReplay))
	m.HandleFunc("GET /.well-known/agent-card.json", s.handleAgentCard)
	m.HandleFunc("POST /a2a", s.serve(s.handleA2A))
}

// publicBase is the gateway's URL as clients reach it: Options.PublicURL,
// else the request's host.
func (s *Server) publicBase(r *http.Request) string {
	if s.opts.PublicURL != "" {
		return strings.TrimRight(s.opts.PublicURL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

func (s *Server) handleAgentCard(w http.ResponseWriter, r *http.Request) {
	card := map[string]any{
		"name":        "Floe",
		"description": "Floe agent harness: an LLM agent with tools (shell, files, subagents) running in its Sessions; each context is a Session, each task a Task.",
		"version":     "1.0.0",
		"supportedInterfaces": []any{map[string]any{
			"url": s.publicBase(r) + "/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0",
		}},
		"capabilities":       map[string]any{"streaming": true, "pushNotifications": false},
		"defaultInputModes":  []string{"text/plain", "application/json"},
		"defaultOutputModes": []string{"text/plain"},
		"skills":             s.skills(r.Context()),
	}
	if s.auth.enabled() {
		card["securitySchemes"] = map[string]any{"bearer": map[string]any{
			"httpAuthSecurityScheme": map[string]any{"scheme": "Bearer", "description": "a Floe API token (FLOE_API_TOKEN)"},
		}}
		card["securityRequirements"] = []any{map[string]any{"schemes": map[string]any{"bearer": map[string]any{"list": []string{}}}}}
	}
	writeJSON(w, http.StatusOK, card)
}

// skills are the tools the default pool's runners offer (asked on
// floe.toollist.default), or one general skill when none answers.
func (s *Server) skills(ctx context.Context) []any {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	body, _ := omni.Pack(&omni.ToolListRequest{})
	var out []any
	if m, err := s.nc.RequestWithContext(ctx, omni.ToolListSubject(omni.DefaultPool), body); err == nil {
		var tl omni.ToolList
		if omni.Unpack(m.Data, &tl) == nil {
			for _, t := range tl.Tools {
				out = append(out, map[string]any{"id": t.Name, "name": t.Name, "description": t.Description, "tags": []string{"tool"}})
			}
		}
	}
	if len(out) == 0 {
		out = append(out, map[string]any{"id": "agent", "name": "Floe agent",
			"description": "Carries out a task with the tools of its Workspace.", "tags": []string{"agent"}})
	}
	return out
}

// writeRPC answers one JSON-RPC response.
func writeRPC(w http.ResponseWriter, id json.RawMessage, result any, e *a2a.Error) {
	writeJSON(w, http.StatusOK, a2a.Reply(id, result, e))
}

func rpcFromAPI(e *apiError) *a2a.Error {
	switch e.Status {
	case http.StatusNotFound:
		return a2a.Errorf(a2a.CodeTaskNotFound, "%s", e.Message)
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return a2a.Errorf(a2a.CodeInvalidParams, "%s", e.Message)
	}
	return a2a.Errorf(a2a.CodeInternal, "%s (%s)", e.Message, e.Code)
}

func (s *Server) handleA2A(w http.ResponseWriter, r *http.Request) *apiError {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errorf(http.StatusRequestEntityTooLarge, omni.CodeTooLarge, "request body is larger than %d bytes", s.opts.MaxBody)
		}
		return &apiError{Status: http.StatusBadRequest, Code: omni.CodeBadRequest, Message: "read request body failed", Err: err}
	}
	req, rerr := a2a.ParseRequest(body)
	var id json.RawMessage
	if req != nil {
		id = req.ID
	}
	if rerr != nil {
		writeRPC(w, id, nil, rerr)
		return nil
	}
	ctx := r.Context()
	b, e := s.protocols(ctx)
	if e != nil {
		writeRPC(w, id, nil, rpcFromAPI(e))
		return nil
	}
	switch req.Method {
	case a2a.MethodSendMessage, a2a.MethodSendStreamingMessage:
		return s.a2aSend(w, r, b, req)
	case a2a.MethodGetTask:
		p, rec, tr, ok := s.a2aTaskOf(ctx, w, b, req)
		if !ok {
			return nil
		}
		f, _, ok := s.a2aFoldOrReply(ctx, w, req, rec.ID, p.ID, tr.From)
		if !ok {
			return nil
		}
		writeRPC(w, id, withHistory(f.Task(), p.HistoryLength), nil)
	case a2a.MethodCancelTask:
		return s.a2aCancel(w, r, b, req)
	case a2a.MethodSubscribeToTask:
		p, rec, tr, ok := s.a2aTaskOf(ctx, w, b, req)
		if !ok {
			return nil
		}
		last := r.Header.Get("Last-Event-ID")
		if last != "" {
			return s.a2aStreamAfter(w, r, id, rec.ID, p.ID, tr.From, last)
		}
		f, pos, ok := s.a2aFoldOrReply(ctx, w, req, rec.ID, p.ID, tr.From)
		if !ok {
			return nil
		}
		return s.a2aStream(w, r, id, rec.ID, f, pos, true)
	}
	return nil
}

func withHistory(t a2a.Task, n *int) a2a.Task {
	if n != nil && *n >= 0 && len(t.History) > *n {
		t.History = t.History[len(t.History)-*n:]
	}
	return t
}

// a2aTaskOf decodes the TaskParams of a task method (get, subscribe,
// cancel) and loads the Task's Session and binding; on a problem it has
// written the error reply and ok is false.
func (s *Server) a2aTaskOf(ctx context.Context, w http.ResponseWriter, b *bindings, req *a2a.Request) (p a2a.TaskParams, rec *omni.SessionRecord, tr *a2aTask, ok bool) {
	if e := a2a.DecodeParams(req.Params, &p); e != nil {
		writeRPC(w, req.ID, nil, e)
		return p, nil, nil, false
	}
	rec, tr, e := s.a2aLoad(ctx, b, p.ID)
	if e != nil {
		writeRPC(w, req.ID, nil, e)
		return p, nil, nil, false
	}
	return p, rec, tr, true
}

// a2aFoldOrReply is a2aFold that, when the bus cannot be read, has written
// the error reply and returns ok false.
func (s *Server) a2aFoldOrReply(ctx context.Context, w http.ResponseWriter, req *a2a.Request, sid, taskID string, from uint64) (*a2a.Folder, uint64, bool) {
	f, pos, err := s.a2aFold(ctx, sid, taskID, from)
	if err != nil {
		writeRPC(w, req.ID, nil, a2a.Errorf(a2a.CodeInternal, "read the task: the bus is unavailable"))
		return nil, 0, false
	}
	return f, pos, true
}

// a2aLoad returns the Session and binding of task id; task not found when
// there is none or the caller may not see its Session.
func (s *Server) a2aLoad(ctx context.Context, b *bindings, id string) (*omni.SessionRecord, *a2aTask, *a2a.Error) {
	if id == "" {
		return nil, nil, a2a.Errorf(a2a.CodeInvalidParams, "params.id is missing")
	}
	var tr a2aTask
	if err := b.get(ctx, a2aTaskKey(id), &tr); errors.Is(err, errNoBinding) {
		return nil, nil, a2a.Errorf(a2a.CodeTaskNotFound, "task %q not found", id)
	} else if err != nil {
		return nil, nil, a2a.Errorf(a2a.CodeInternal, "read the task: the bus is unavailable")
	}
	rec, e := s.visibleSession(ctx, tr.SessionID)
	if e != nil {
		if e.Status == http.StatusNotFound {
			return nil, nil, a2a.Errorf(a2a.CodeTaskNotFound, "task %q not found", id)
		}
		return nil, nil, rpcFromAPI(e)
	}
	if kept, _, err := s.retained(ctx, tr.From, rec.PurgedThrough); err != nil {
		return nil, nil, a2a.Errorf(a2a.CodeInternal, "read the task: the bus is unavailable")
	} else if !kept {
		return nil, nil, a2a.Errorf(a2a.CodeTaskNotFound, "task %q: its messages have left the stream's retention", id)
	}
	return rec, &tr, nil
}

// a2aFold folds the Task's stored messages and returns the folder and the
// last sequence it read (from-1 when none).
func (s *Server) a2aFold(ctx context.Context, sid, taskID string, from uint64) (*a2a.Folder, uint64, error) {
	f := a2a.NewFolder(taskID, sid)
	pos := from - 1
	err := s.scan(ctx, sid, omni.ClientClasses, from, nil, func(m bus.StreamMsg) error {
		f.Feed(m.Seq, m.Class == omni.ClassServer, m.Data)
		pos = m.Seq
		return nil
	})
	return f, pos, err
}

// a2aFollow feeds f the messages after pos until its state stops a stream
// (terminal or input required), or ctx ends.
func (s *Server) a2aFollow(ctx context.Context, sid string, f *a2a.Folder, pos uint64) error {
	return s.readSession(ctx, sid, pos+1, func(it streamItem) error {
		for _, u := range f.Feed(it.seq, it.server, it.data) {
			if u.StatusUpdate != nil && a2a.Stops(u.StatusUpdate.Status.State) {
				return errStopRead
			}
		}
		return nil
	})
}

func (s *Server) a2aSend(w http.ResponseWriter, r *http.Request, b *bindings, req *a2a.Request) *apiError {
	ctx := r.Context()
	var p a2a.SendParams
	if e := a2a.DecodeParams(req.Params, &p); e != nil {
		writeRPC(w, req.ID, nil, e)
		return nil
	}
	if e := a2a.CheckMessage(p.Message); e != nil {
		writeRPC(w, req.ID, nil, e)
		return nil
	}
	msg := p.Message
	var (
		f   *a2a.Folder
		pos uint64
		sid string
	)
	if msg.TaskID != "" {
		// An answer on an existing task: the decision of its pending approval.
		rec, tr, e := s.a2aLoad(ctx, b, msg.TaskID)
		if e != nil {
			writeRPC(w, req.ID, nil, e)
			return nil
		}
		var ok bool
		if f, pos, ok = s.a2aFoldOrReply(ctx, w, req, rec.ID, msg.TaskID, tr.From); !ok {
			return nil
		}
		if a2a.Terminal(f.State()) {
			writeRPC(w, req.ID, nil, a2a.Errorf(a2a.CodeUnsupported, "task %q is in the terminal state %s", msg.TaskID, f.State()))
			return nil
		}
		pending := f.Pending()
		if len(pending) == 0 {
			writeRPC(w, req.ID, nil, a2a.Errorf(a2a.CodeInvalidParams, "task %q is not waiting for input", msg.TaskID))
			return nil
		}
		d, e := a2a.Decision(msg)
		if e != nil {
			writeRPC(w, req.ID, nil, e)
			return nil
		}
		rep, err := s.control(ctx, rec.ID, omni.CtlApprove, omni.Control{ToolCallID: pending[0], Decision: d}, s.opts.ControlTimeout)
		switch {
		case err != nil && !bus.IsNoResponders(err):
			writeRPC(w, req.ID, nil, a2a.Errorf(a2a.CodeInternal, "the engine did not answer, retry later"))
			return nil
		case err == nil && !rep.OK && rep.Code != omni.CodeNotFound:
			writeRPC(w, req.ID, nil, rpcFromAPI(replyError(rep)))
			return nil
		}
		sid = rec.ID
	} else {
		var rec *omni.SessionRecord
		var e *apiError
		if msg.ContextID != "" {
			if rec, e = s.visibleSession(ctx, msg.ContextID); e != nil {
				if e.Status == http.StatusNotFound {
					writeRPC(w, req.ID, nil, a2a.Errorf(a2a.CodeInvalidParams, "unknown contextId %q: omit it to start a new context", msg.ContextID))
				} else {
					writeRPC(w, req.ID, nil, rpcFromAPI(e))
				}
				return nil
			}
		} else if rec, e = s.createSession(ctx, client.CreateSession{}); e != nil {
			writeRPC(w, req.ID, nil, rpcFromAPI(e))
			return nil
		}
		ins, rerr := a2a.Inputs(msg)
		if rerr != nil {
			writeRPC(w, req.ID, nil, rerr)
			return nil
		}
		input := make([]omni.InputPart, len(ins))
		for i, in := range ins {
			if in.ImageURL != "" {
				input[i] = omni.InputPart{Type: client.InputImageURL, ImageURL: in.ImageURL}
			} else {
				input[i] = omni.InputPart{Type: client.InputText, Text: in.Text}
			}
		}
		task := omni.Task{Kind: omni.TaskRun, SessionID: rec.ID, Input: input}
		if e := s.fitsBus(&task); e != nil {
			writeRPC(w, req.ID, nil, rpcFromAPI(e))
			return nil
		}
		last, _, err := s.lastSeq(ctx)
		if err != nil {
			writeRPC(w, req.ID, nil, a2a.Errorf(a2a.CodeInternal, "the bus is unavailable, retry later"))
			return nil
		}
		taskID, e := s.submitTask(ctx, rec, omni.StateRunning, task)
		if e != nil {
			if e.Status == http.StatusConflict {
				writeRPC(w, req.ID, nil, a2a.Errorf(a2a.CodeUnsupported, "context %q already runs a task (%s): wait for it, or cancel it", rec.ID, e.Code))
			} else {
				writeRPC(w, req.ID, nil, rpcFromAPI(e))
			}
			return nil
		}
		if err := b.put(ctx, a2aTaskKey(taskID), &a2aTask{SessionID: rec.ID, From: last + 1}); err != nil {
			writeRPC(w, req.ID, nil, a2a.Errorf(a2a.CodeInternal, "store the task: the bus is unavailable"))
			return nil
		}
		sid, f, pos = rec.ID, a2a.NewFolder(taskID, rec.ID), last
	}
	if req.Method == a2a.MethodSendStreamingMessage {
		return s.a2aStream(w, r, req.ID, sid, f, pos, true)
	}
	var hist *int
	if p.Configuration != nil {
		hist = p.Configuration.HistoryLength
	}
	if p.Configuration == nil || !p.Configuration.ReturnImmediately {
		if err := s.a2aFollow(ctx, sid, f, pos); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			writeRPC(w, req.ID, nil, a2a.Errorf(a2a.CodeInternal, "follow the task: %v", err))
			return nil
		}
	}
	t := withHistory(f.Task(), hist)
	writeRPC(w, req.ID, map[string]any{"task": t}, nil)
	return nil
}

func (s *Server) a2aCancel(w http.ResponseWriter, r *http.Request, b *bindings, req *a2a.Request) *apiError {
	ctx := r.Context()
	p, rec, tr, ok := s.a2aTaskOf(ctx, w, b, req)
	if !ok {
		return nil
	}
	f, pos, ok := s.a2aFoldOrReply(ctx, w, req, rec.ID, p.ID, tr.From)
	if !ok {
		return nil
	}
	if a2a.Terminal(f.State()) || rec.TaskID != p.ID {
		writeRPC(w, req.ID, nil, a2a.Errorf(a2a.CodeNotCancelable, "task %q is %s: it cannot be canceled", p.ID, f.State()))
		return nil
	}
	if _, e := s.abortTask(ctx, rec); e != nil {
		writeRPC(w, req.ID, nil, rpcFromAPI(e))
		return nil
	}
	// The answer comes once the abort is done: the Task's end is on the
	// stream.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for !a2a.Terminal(f.State()) {
		err := s.readSession(wctx, rec.ID, pos+1, func(it streamItem) error {
			pos = it.seq
			f.Feed(it.seq, it.server, it.data)
			if a2a.Terminal(f.State()) {
				return errStopRead
			}
			return nil
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			writeRPC(w, req.ID, nil, a2a.Errorf(a2a.CodeInternal, "the task did not end within 30s of its cancel: %v", err))
			return nil
		}
	}
	writeRPC(w, req.ID, f.Task(), nil)
	return nil
}

// a2aStream answers a streaming method: with first, the Task as folded up
// to pos, then every update after pos until the Task stops (terminal, or
// input required). Each SSE event's id is <epoch>-<seq>[:k] of the message
// it comes from (the Task's, of the last message it folds).
func (s *Server) a2aStream(w http.ResponseWriter, r *http.Request, id json.RawMessage, sid string, f *a2a.Folder, pos uint64, first bool) *apiError {
	_, epoch, err := s.lastSeq(r.Context())
	if err != nil {
		writeRPC(w, id, nil, a2a.Errorf(a2a.CodeInternal, "the bus is unavailable, retry later"))
		return nil
	}
	ctx, done := s.longLived(r)
	if ctx == nil {
		writeRPC(w, id, nil, a2a.Errorf(a2a.CodeInternal, "the gateway is shutting down"))
		return nil
	}
	defer done()
	write := s.sseStart(w)
	if first {
		t := f.Task()
		var buf []byte
		buf = appendRPCEvent(buf, fmt.Sprintf("%d-%d", epoch, pos), id, a2a.StreamResult{Task: &t})
		if write(buf) != nil || a2a.Stops(f.State()) {
			return nil
		}
	}
	s.a2aPump(ctx, write, id, epoch, sid, f, pos+1, eventPos{})
	return nil
}

// a2aStreamAfter answers SubscribeToTask with Last-Event-ID: exactly the
// updates after that id (the Task is folded up to it silently).
func (s *Server) a2aStreamAfter(w http.ResponseWriter, r *http.Request, id json.RawMessage, sid, taskID string, from uint64, lastID string) *apiError {
	_, epoch, err := s.lastSeq(r.Context())
	if err != nil {
		writeRPC(w, id, nil, a2a.Errorf(a2a.CodeInternal, "the bus is unavailable, retry later"))
		return nil
	}
	e, skip, ok := parseAGUIID(lastID)
	if !ok || e != epoch {
		// Not a position of this stream: the Task first, as without an id.
		f, pos, err := s.a2aFold(r.Context(), sid, taskID, from)
		if err != nil {
			writeRPC(w, id, nil, a2a.Errorf(a2a.CodeInternal, "the bus is unavailable, retry later"))
			return nil
		}
		return s.a2aStream(w, r, id, sid, f, pos, true)
	}
	ctx, done := s.longLived(r)
	if ctx == nil {
		writeRPC(w, id, nil, a2a.Errorf(a2a.CodeInternal, "the gateway is shutting down"))
		return nil
	}
	defer done()
	write := s.sseStart(w)
	s.a2aPump(ctx, write, id, epoch, sid, a2a.NewFolder(taskID, sid), from, skip)
	return nil
}

// a2aPump feeds f the Session's messages from start, writing the updates
// after skip, until the Task stops; heartbeats keep the connection alive.
func (s *Server) a2aPump(ctx context.Context, write func([]byte) error, id json.RawMessage, epoch int64, sid string, f *a2a.Folder, start uint64, skip eventPos) {
	ctx, cancel := context.WithCancel(ctx)
	batches := make(chan []byte, 16)
	go func() {
		defer close(batches)
		err := s.readSession(ctx, sid, start, func(it streamItem) error {
			ups := f.Feed(it.seq, it.server, it.data)
			var buf []byte
			stop := false
			for i, u := range ups {
				o := eventOut(it.seq, i, len(ups))
				if u.StatusUpdate != nil && a2a.Stops(u.StatusUpdate.Status.State) {
					stop = true
				}
				if skip.seq != 0 && !skip.after(o) {
					continue
				}
				buf = appendRPCEvent(buf, o.ID(epoch), id, u)
			}
			if len(buf) > 0 {
				select {
				case batches <- buf:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if stop {
				return errStopRead
			}
			return nil
		})
		if err != nil && ctx.Err() == nil {
			s.log.Warn().Err(err).Str("session_id", sid).Msg("a2a stream failed")
		}
	}()
	defer func() {
		cancel()
		for range batches {
		}
	}()
	hb := time.NewTicker(s.heartbeatEvery())
	defer hb.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hb.C:
			if write([]byte(": heartbeat\n\n")) != nil {
				return
			}
		case b, ok := <-batches:
			if !ok || write(b) != nil {
				return
			}
		}
	}
}

// appendRPCEvent appends one SSE event holding a JSON-RPC response.
func appendRPCEvent(buf []byte, eventID string, id json.RawMessage, result any) []byte {
	data, _ := json.Marshal(a2a.Reply(id, result, nil))
	buf = append(buf, "id: "...)
	buf = append(buf, eventID...)
	buf = append(buf, '\n')
	return appendData(buf, bytes.TrimSpace(data))
}

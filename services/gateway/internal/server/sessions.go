package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/omni/cmdpolicy"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway/client"
	"floe.dev/services/gateway/internal/confine"
)

// visible reports whether the caller may see r: with authentication off
// every Session is visible; with it on, only the caller's own.
func (s *Server) visible(ctx context.Context, r *omni.SessionRecord) bool {
	if r.Deleted {
		return false
	}
	return !s.auth.enabled() || r.Principal == principal(ctx)
}

// load returns the Session named by the request's {id}; 404 when it does
// not exist or the caller may not see it (never revealing which).
func (s *Server) load(r *http.Request) (*omni.SessionRecord, *apiError) {
	id := r.PathValue("id")
	rec, _, err := s.sessions.Get(r.Context(), id)
	if errors.Is(err, bus.ErrSessionNotFound) {
		return nil, errNotFound
	}
	var ue *bus.UndecodableError
	if errors.As(err, &ue) {
		if !s.mayRepair(r.Context(), ue) {
			return nil, errNotFound
		}
		return nil, &apiError{Status: http.StatusInternalServerError, Code: omni.CodeInternal,
			Message: "the session's record does not decode; it can only be deleted", Err: err}
	}
	if err != nil {
		return nil, unavailable("read session", err)
	}
	if !s.visible(r.Context(), rec) {
		return nil, errNotFound
	}
	return rec, nil
}

func stateOf(r *omni.SessionRecord) string {
	if r.State == "" {
		return omni.StateIdle
	}
	return r.State
}

func view(r *omni.SessionRecord) client.Session {
	v := client.Session{
		ID: r.ID, Model: r.Model, Workspace: r.Workspace, ApprovalMode: r.ApprovalMode,
		SystemPrompt: r.SystemPrompt, MaxTurns: r.MaxTurns, Title: r.Title,
		State: stateOf(r), TaskID: r.TaskID, LastStatus: r.LastStatus, Parent: r.Parent,
		CreatedAt:     time.UnixMilli(r.CreatedUnixMs).UTC().Format(omni.TimeLayout),
		CreatedUnixMs: r.CreatedUnixMs,
		AllowedTools:  r.AllowedTools,
	}
	if c := r.Compaction; c != (omni.CompactionConfig{}) {
		v.Compaction = &client.Compaction{MaxContextLength: c.MaxContextLength, MaxSessionTurns: c.MaxSessionTurns, Mode: c.Mode}
	}
	if v.ApprovalMode == "" {
		v.ApprovalMode = omni.ApproveAllowAll
	}
	if f := r.ForkedFrom; f != nil {
		v.ForkedFrom = &client.ForkedFrom{SessionID: f.SessionID, Seq: f.Seq, Record: f.Record}
	}
	p := r.CommandPolicy
	if p == nil {
		p = cmdpolicy.Factory() // what the engine applies to older records
	}
	v.CommandPolicy = &client.CommandPolicy{Source: p.Source, Rules: make([]client.CommandRule, len(p.Rules))}
	for i, cr := range p.Rules {
		v.CommandPolicy.Rules[i] = client.CommandRule{Name: cr.Name, Pattern: cr.Pattern, Description: cr.Description, Enabled: cr.Enabled}
	}
	return v
}

// scriptedProvider is the provider part of scripted model references.
const scriptedProvider = "scripted"

func badRequest(format string, args ...any) *apiError {
	return errorf(http.StatusBadRequest, omni.CodeBadRequest, format, args...)
}

const maxTitle = 512

// checkModel checks a model reference a Session is to use and returns it
// as the Session keeps it.
func (s *Server) checkModel(ref string) (string, *apiError) {
	p, m, ok := strings.Cut(ref, ":")
	if !ok || p == "" || m == "" {
		return "", badRequest("model %q is not provider:model_id", ref)
	}
	if p == "replay" {
		// The replay provider reads any Trace file it is given: it is for
		// floe replay --execute, never for a Session created here.
		return "", badRequest("model %q: the replay provider only serves floe replay --execute", ref)
	}
	if p == scriptedProvider && ref != s.opts.DefaultModel {
		// A script path is a file the engine reads: only scripts from
		// the configured directory (the operator's own default model
		// aside).
		id, err := confine.ScriptedModel(m, s.opts.ScriptsDir)
		if err != nil {
			return "", badRequest("%v", err)
		}
		return scriptedProvider + ":" + id, nil
	}
	return ref, nil
}

func (s *Server) handleCreate(w http.ResponseWriter, r *http.Request) *apiError {
	var req client.CreateSession
	if e := s.decodeBody(w, r, &req, true); e != nil {
		return e
	}
	rec, e := s.createSession(r.Context(), req)
	if e != nil {
		return e
	}
	w.Header().Set("Location", "/api/sessions/"+rec.ID)
	writeJSON(w, http.StatusCreated, view(rec))
	return nil
}

// createSession checks req and stores a new Session of the caller's
// principal: the one way Sessions are created (REST, AG-UI threads, A2A
// contexts).
func (s *Server) createSession(ctx context.Context, req client.CreateSession) (*omni.SessionRecord, *apiError) {
	rec := &omni.SessionRecord{
		Model: req.Model, Workspace: req.Workspace, ApprovalMode: req.ApprovalMode,
		SystemPrompt: req.SystemPrompt, MaxTurns: req.MaxTurns, Title: req.Title,
		Principal: principal(ctx), State: omni.StateIdle,
		CommandPolicy: s.opts.CommandPolicy,
	}
	if rec.CommandPolicy == nil {
		rec.CommandPolicy = cmdpolicy.Factory()
	}
	if rec.Model == "" {
		rec.Model = s.opts.DefaultModel
	}
	var e *apiError
	if rec.Model, e = s.checkModel(rec.Model); e != nil {
		return nil, e
	}
	if s.opts.CheckModel != nil {
		if err := s.opts.CheckModel(rec.Model); err != nil {
			return nil, errorf(http.StatusBadRequest, omni.CodeModelUnavailable, "%v", err)
		}
	}
	if rec.ApprovalMode == "" {
		rec.ApprovalMode = omni.ApproveAllowAll
	}
	if !omni.ValidApprovalMode(rec.ApprovalMode) {
		return nil, badRequest("approvalMode %q is not allow-all, deny-all, read-only or always-ask", rec.ApprovalMode)
	}
	if rec.MaxTurns < 0 {
		return nil, badRequest("maxTurns must not be negative")
	}
	if len(rec.Title) > maxTitle {
		return nil, badRequest("title is longer than %d bytes", maxTitle)
	}
	if c := req.Compaction; c != nil {
		if c.MaxContextLength < 0 || c.MaxSessionTurns < 0 {
			return nil, badRequest("compaction limits must not be negative")
		}
		if c.Mode != "" && c.Mode != omni.ModeSummarize && c.Mode != omni.ModeDiscard {
			return nil, badRequest("compaction mode %q is not summarize or discard", c.Mode)
		}
		rec.Compaction = omni.CompactionConfig{MaxContextLength: c.MaxContextLength, MaxSessionTurns: c.MaxSessionTurns, Mode: c.Mode}
	}
	if rec.Workspace != "" {
		// The gateway never creates a requested Workspace: it must exist
		// inside an allowed root, and the Session keeps its resolved path.
		ws, err := confine.Workspace(rec.Workspace, s.opts.WorkspaceRoots, s.opts.Home)
		if err != nil {
			return nil, badRequest("%v", err)
		}
		rec.Workspace = ws
	}

	now := time.Now()
	rec.CreatedUnixMs = now.UnixMilli()
	var err error
	for range 3 {
		rec.ID = omni.NewSessionID(now, randHex(4))
		ws := rec.Workspace
		if req.Workspace == "" {
			ws = filepath.Join(s.opts.Home, "workspaces", rec.ID)
		}
		if req.Workspace == "" {
			if err := os.MkdirAll(ws, 0o755); err != nil {
				return nil, internalError("create workspace", err)
			}
		}
		rec.Workspace = filepath.Clean(ws)
		if rec.Instructions, err = omni.ReadInstructions(rec.Workspace); err != nil {
			return nil, badRequest("workspace: %v", err)
		}
		err = s.sessions.Create(ctx, rec)
		if !errors.Is(err, bus.ErrSessionExists) {
			break
		}
		if req.Workspace == "" {
			os.Remove(ws)
			rec.Workspace = ""
		}
	}
	if err != nil {
		return nil, unavailable("create session", err)
	}
	s.log.Info().Str("session_id", rec.ID).Str("model", rec.Model).Msg("session created")
	return rec, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request) *apiError {
	recs, bad, err := s.sessions.List(r.Context())
	if err != nil {
		return unavailable("list sessions", err)
	}
	s.undecodable(bad)
	out := client.SessionList{Sessions: []client.Session{}}
	for _, rec := range recs {
		if s.visible(r.Context(), rec) {
			out.Sessions = append(out.Sessions, view(rec))
		}
	}
	sort.Slice(out.Sessions, func(i, j int) bool {
		a, b := out.Sessions[i], out.Sessions[j]
		if a.CreatedUnixMs != b.CreatedUnixMs {
			return a.CreatedUnixMs < b.CreatedUnixMs
		}
		return a.ID < b.ID
	})
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) handleGet(w http.ResponseWriter, r *http.Request) *apiError {
	rec, e := s.load(r)
	if e != nil {
		return e
	}
	v := view(rec)
	v.Sandbox = s.sandbox(r.Context())
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (s *Server) handlePatch(w http.ResponseWriter, r *http.Request) *apiError {
	if _, e := s.load(r); e != nil {
		return e
	}
	var req client.SessionPatch
	if e := s.decodeBody(w, r, &req, false); e != nil {
		return e
	}
	if req.ApprovalMode != nil && !omni.ValidApprovalMode(*req.ApprovalMode) {
		return badRequest("approvalMode %q is not allow-all, deny-all, read-only or always-ask", *req.ApprovalMode)
	}
	if req.Title != nil && len(*req.Title) > maxTitle {
		return badRequest("title is longer than %d bytes", maxTitle)
	}
	ctx := r.Context()
	rec, err := s.sessions.Update(ctx, r.PathValue("id"), func(rec *omni.SessionRecord) error {
		if !s.visible(ctx, rec) {
			return bus.ErrSessionNotFound
		}
		if req.ApprovalMode != nil {
			rec.ApprovalMode = *req.ApprovalMode
		}
		if req.Title != nil {
			rec.Title, rec.TitleSource = *req.Title, "" // a person's title is never replaced
		}
		return nil
	})
	if errors.Is(err, bus.ErrSessionNotFound) {
		return errNotFound
	}
	if err != nil {
		return unavailable("update session", err)
	}
	writeJSON(w, http.StatusOK, view(rec))
	return nil
}

var errBusyDelete = errors.New("session busy")

// handleDelete removes a Session: the record is first marked deleted (so no
// Task can start), then the tracer purges its messages from FLOE_SESSIONS
// and removes its Trace files and position, and the record is dropped. A failed
// step leaves the record marked, and a repeated DELETE resumes the cleanup.
// The Workspace is the user's and is kept.
func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) *apiError {
	ctx := r.Context()
	id := r.PathValue("id")
	var busy string
	rec, err := s.sessions.Update(ctx, id, func(rec *omni.SessionRecord) error {
		if !s.auth.enabled() || rec.Principal == principal(ctx) {
			if st := stateOf(rec); st != omni.StateIdle && !rec.Deleted {
				busy = st
				return errBusyDelete
			}
			rec.Deleted = true
			return nil
		}
		return bus.ErrSessionNotFound
	})
	var ue *bus.UndecodableError
	switch {
	case errors.As(err, &ue):
		if !s.mayRepair(ctx, ue) {
			return errNotFound
		}
		// Nothing can run on a record nobody decodes: clean up as for a
		// record marked deleted.
		s.log.Warn().Err(err).Str("session_id", id).Str("principal", principal(ctx)).Msg("deleting an undecodable session record")
		rec = &omni.SessionRecord{ID: id}
	case errors.Is(err, bus.ErrSessionNotFound):
		return errNotFound
	case errors.Is(err, errBusyDelete):
		return busyError(busy)
	case err != nil:
		return unavailable("delete session", err)
	}
	files, e := s.deleteTrace(ctx, id)
	if e != nil {
		return e
	}
	if err := s.sessions.Delete(ctx, rec.ID); err != nil {
		return unavailable("delete session record", err)
	}
	s.log.Info().Str("session_id", id).Int("trace_files", files).Msg("session deleted")
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// deleteTrace asks the tracer, the only writer and deleter of Trace files,
// to purge the Session's messages from FLOE_SESSIONS (the gateway's NATS
// user may not purge the stream) and delete its Trace (files and
// position), and returns how many files it removed. A Session with
// nothing on the stream or on disk needs no tracer; otherwise it asks
// again while no tracer listens (one starting or restarting), and no
// answer within 10 s is a 503 (a repeated DELETE tries again).
func (s *Server) deleteTrace(ctx context.Context, id string) (int, *apiError) {
	req, err := omni.Pack(&omni.TraceDelete{Purge: true})
	if err != nil {
		return 0, internalError("encode trace delete", err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nothingHere := func() bool {
		files, ferr := trace.Files(s.opts.Home, id)
		_, hasPos, perr := trace.ReadPos(s.opts.Home, id)
		_, serr := s.stream.GetLastMsgForSubject(ctx, omni.SessionWildcard(id))
		return ferr == nil && len(files) == 0 && !hasPos && perr == nil && errors.Is(serr, jetstream.ErrMsgNotFound)
	}
	m, err := s.nc.RequestWithContext(rctx, omni.TraceDeleteSubject(id), req)
	// No tracer listening (one starting or restarting) answers at once:
	// ask again until one does or the 10 s are up.
	for err != nil {
		if nothingHere() {
			return 0, nil // nothing to purge nor delete here
		}
		if !bus.IsNoResponders(err) || retry.Sleep(rctx, 200*time.Millisecond) != nil {
			return 0, unavailable("ask the tracer to delete the session's messages and trace", err)
		}
		m, err = s.nc.RequestWithContext(rctx, omni.TraceDeleteSubject(id), req)
	}
	var reply omni.TraceDeleteReply
	if err := omni.Unpack(m.Data, &reply); err != nil {
		return 0, unavailable("ask the tracer to delete the trace", err)
	}
	if reply.Error != "" {
		return reply.Files, internalError("delete trace", errors.New(reply.Error))
	}
	return reply.Files, nil
}

// mayRepair reports whether the caller may delete (or be told about) a
// record that does not decode: its owner when the principal field still
// reads, any caller when it does not (with authentication off, anyone).
func (s *Server) mayRepair(ctx context.Context, ue *bus.UndecodableError) bool {
	return !s.auth.enabled() || ue.Principal == "" || ue.Principal == principal(ctx)
}

// undecodable counts the records a list skipped (the gauge) and logs each
// one the first time this gateway meets it.
func (s *Server) undecodable(bad []*bus.UndecodableError) {
	s.metrics.undecodable.Set(float64(len(bad)))
	for _, ue := range bad {
		if _, seen := s.badRecords.LoadOrStore(ue.ID+"@"+strconv.FormatUint(ue.Revision, 10), true); !seen {
			s.log.Error().Err(ue.Err).Str("session_id", ue.ID).Uint64("revision", ue.Revision).Msg("session record does not decode; skipped in lists (DELETE it to remove it)")
		}
	}
}

// busyError is the 409 of a Session that runs a Task or compacts.
func busyError(state string) *apiError {
	if state == omni.StateCompacting {
		return errorf(http.StatusConflict, omni.CodeCompacting, "the session is compacting")
	}
	return errorf(http.StatusConflict, omni.CodeTaskInProgress, "a task is in progress")
}

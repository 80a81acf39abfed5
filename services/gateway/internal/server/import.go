package server

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/omni/cmdpolicy"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway/client"
	"floe.dev/services/gateway/internal/confine"
)

// maxImportLine caps one record of an imported Trace: the bus's maximum
// message size, so that every imported record could have been streamed.
const maxImportLine = 8 << 20

// importBodyLimit is the import route's body cap for a Trace file of at
// most maxFile bytes: its base64 size plus room for the other fields.
func importBodyLimit(maxFile int64) int64 {
	return 4*((maxFile+2)/3) + 64<<10
}

// handleImport serves POST /api/traces/import (protocol.md §3, §5): a Trace file
// written by Floe or by the original harness becomes a new Session whose
// history is that file, landed as index 1 in the date directory of its
// first record. Nothing is created unless the whole request is good.
//
// At most Options.MaxImports run at once (429 with Retry-After beyond);
// the body is read as a stream into a temporary file (importbody.go); one
// Session id is imported once however many requests race for it.
func (s *Server) handleImport(w http.ResponseWriter, r *http.Request) *apiError {
	select {
	case s.imports <- struct{}{}:
		defer func() { <-s.imports }()
	default:
		w.Header().Set("Retry-After", "1")
		return errorf(http.StatusTooManyRequests, omni.CodeRateLimited, "%d imports are running; retry later", cap(s.imports))
	}
	limit := importBodyLimit(s.opts.MaxImport)
	if r.ContentLength > limit {
		return errorf(http.StatusRequestEntityTooLarge, omni.CodeTooLarge, "request body is larger than %d bytes", limit)
	}
	if !isJSON(r.Header.Get("Content-Type")) {
		return errorf(http.StatusUnsupportedMediaType, omni.CodeUnsupportedMedia, "request body must be application/json")
	}
	rc := http.NewResponseController(w)
	if s.opts.ReadBodyTimeout > 0 {
		_ = rc.SetReadDeadline(time.Now().Add(s.opts.ReadBodyTimeout))
	}
	tmp, err := importTemp(s.opts.Home)
	if err != nil {
		return internalError("write trace file", err)
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name())
	}()
	var imp *imported
	body := bufio.NewReaderSize(http.MaxBytesReader(w, r.Body, limit), 64<<10)
	req, e := readImportBody(body, func(src io.Reader) *apiError {
		var e *apiError
		imp, e = importFile(src, tmp, s.opts.MaxImport)
		return e
	})
	if e != nil {
		return s.bodyError(w, e)
	}
	_ = rc.SetReadDeadline(time.Time{})
	if imp == nil {
		return badRequest("the Trace holds no record; the first must be session_meta")
	}
	if err := tmp.Sync(); err != nil {
		return internalError("write trace file", err)
	}
	meta := &imp.meta.Payload
	sid := meta.SessionID

	ref := req.model
	if ref == "" {
		if meta.ModelID == "" {
			return badRequest("the Trace's session_meta names no model_id; pass model")
		}
		ref = importModel(meta.Provider, meta.ModelID)
	}
	ref, e = s.checkModel(ref)
	if e != nil {
		return e
	}
	ws := req.workspace
	if ws == "" {
		ws = meta.Workspace
	}
	if ws == "" {
		return badRequest("the Trace names no workspace; pass workspace")
	}
	ws, err = confine.Workspace(ws, s.opts.WorkspaceRoots, s.opts.Home)
	if err != nil {
		if req.workspace == "" {
			return badRequest("the Trace's %v; pass workspace to choose one here", err)
		}
		return badRequest("%v", err)
	}

	ctx := r.Context()
	// One import of an id at a time, across gateways sharing this home:
	// the claim is a file created exclusively; the loser gets 409.
	unclaim, e := s.claimImport(sid)
	if e != nil {
		return e
	}
	defer unclaim()
	if e := s.importFree(r, sid); e != nil {
		return e
	}
	rec := &omni.SessionRecord{
		ID: sid, Model: ref, Workspace: ws, ApprovalMode: omni.ApproveAllowAll,
		SystemPrompt: meta.SystemPrompt, Principal: principal(ctx), State: omni.StateIdle,
		CreatedUnixMs: imp.first.UnixMilli(), CommandPolicy: s.opts.CommandPolicy,
	}
	if rec.CommandPolicy == nil {
		rec.CommandPolicy = cmdpolicy.Factory()
	}
	// The mark first: a Trace in another date directory than its id's is
	// found through it (trace.Files).
	if err := trace.MarkImported(s.opts.Home, sid, imp.first); err != nil {
		return internalError("write trace file", err)
	}
	path := trace.File(s.opts.Home, imp.first, sid, 1)
	if err := linkNew(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return traceExists(sid)
		}
		trace.UnmarkImported(s.opts.Home, sid)
		return internalError("write trace file", err)
	}
	if err := s.sessions.Create(ctx, rec); err != nil {
		os.Remove(path)
		trace.UnmarkImported(s.opts.Home, sid)
		if errors.Is(err, bus.ErrSessionExists) {
			return traceExists(sid)
		}
		return unavailable("create session", err)
	}
	s.log.Info().Str("session_id", sid).Str("model", ref).Int("records", imp.records).Msg("trace imported")
	w.Header().Set("Location", "/api/sessions/"+sid)
	writeJSON(w, http.StatusCreated, client.Imported{SessionID: sid, Index: 1, Date: imp.first.UTC().Format("2006-01-02")})
	return nil
}

// bodyError turns a failure to read the body (too large, too slow) into
// its answer; any other error is e itself.
func (s *Server) bodyError(w http.ResponseWriter, e *apiError) *apiError {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(e.Err, &mbe):
		return errorf(http.StatusRequestEntityTooLarge, omni.CodeTooLarge, "request body is larger than %d bytes", mbe.Limit)
	case errors.Is(e.Err, os.ErrDeadlineExceeded):
		w.Header().Set("Connection", "close")
		return &apiError{Status: http.StatusRequestTimeout, Code: omni.CodeRequestTimeout,
			Message: fmt.Sprintf("request body not received within %v", s.opts.ReadBodyTimeout), Err: e.Err}
	}
	return e
}

// claimImport claims Session id sid for this import until the returned
// function runs; 409 while another import holds it. A claim left by a
// crashed gateway expires after staleClaim.
func (s *Server) claimImport(sid string) (func(), *apiError) {
	path := filepath.Join(s.opts.Home, "traces", ".import-"+sid+".claim")
	for attempt := 0; ; attempt++ {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err == nil {
			f.Close()
			return func() { os.Remove(path) }, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, internalError("claim the session id", err)
		}
		if fi, serr := os.Stat(path); attempt == 0 && serr == nil && time.Since(fi.ModTime()) > staleClaim {
			os.Remove(path)
			continue
		}
		return nil, errorf(http.StatusConflict, omni.CodeTraceExists, "session %s is being imported", sid)
	}
}

// staleClaim is the age past which an import claim is a crashed gateway's.
const staleClaim = 10 * time.Minute

func traceExists(sid string) *apiError {
	return errorf(http.StatusConflict, omni.CodeTraceExists, "a session %s already exists", sid)
}

// importFree answers 409 when anything of Session sid exists here: its
// record (even one being deleted), a Trace file or a tracer position.
func (s *Server) importFree(r *http.Request, sid string) *apiError {
	_, _, err := s.sessions.Get(r.Context(), sid)
	switch {
	case err == nil:
		return traceExists(sid)
	case !errors.Is(err, bus.ErrSessionNotFound):
		return unavailable("read session", err)
	}
	files, err := trace.Files(s.opts.Home, sid)
	if err != nil {
		return internalError("list trace files", err)
	}
	if len(files) > 0 {
		return traceExists(sid)
	}
	if _, ok, err := trace.ReadPos(s.opts.Home, sid); ok || errors.Is(err, trace.ErrBadPos) {
		return traceExists(sid)
	}
	return nil
}

// importModel maps the provider a Trace's session_meta names to a Floe
// model reference (protocol.md §5): anthropic stays anthropic, Floe's own
// scripted stays scripted, and every other provider of the original
// (openai, deepseek, openrouter, custom, …) speaks the OpenAI protocol.
func importModel(provider, modelID string) string {
	switch strings.ToLower(provider) {
	case "anthropic":
		return "anthropic:" + modelID
	case scriptedProvider:
		return scriptedProvider + ":" + modelID
	}
	return "openai:" + modelID
}

// imported is a checked Trace file.
type imported struct {
	meta    omni.Message
	first   time.Time // the first record's timestamp
	records int
}

// writeNewParts writes a file that must not exist yet, the concatenation
// of parts, whole or not at all: a temporary file in the same directory,
// synced, then linked to path (which fails with fs.ErrExist when path
// exists).
func writeNewParts(path string, parts [][]byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".import-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	for _, b := range parts {
		if _, err = f.Write(b); err != nil {
			break
		}
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	return os.Link(tmp, path)
}

// linkNew links the checked temporary file tmp to path, which must not
// exist yet (fs.ErrExist when it does).
func linkNew(tmp, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.Link(tmp, path)
}

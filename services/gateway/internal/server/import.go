package server

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
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

// handleImport serves POST /api/traces/import (SPEC §3, §5): a Trace file
// written by Floe or by the original harness becomes a new Session whose
// history is that file, landed as index 1 in the date directory of its
// first record. Nothing is created unless the whole request is good.
func (s *Server) handleImport(w http.ResponseWriter, r *http.Request) *apiError {
	var req client.ImportTrace
	if e := s.decodeBodyLimit(w, r, &req, false, importBodyLimit(s.opts.MaxImport)); e != nil {
		return e
	}
	enc := strings.TrimSpace(req.DataBase64)
	if int64(base64.StdEncoding.DecodedLen(len(enc))) > s.opts.MaxImport+2 {
		return errorf(http.StatusRequestEntityTooLarge, omni.CodeTooLarge, "the Trace file is larger than %d bytes", s.opts.MaxImport)
	}
	data, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return badRequest("dataBase64 is not base64: %v", err)
	}
	if int64(len(data)) > s.opts.MaxImport {
		return errorf(http.StatusRequestEntityTooLarge, omni.CodeTooLarge, "the Trace file is larger than %d bytes", s.opts.MaxImport)
	}
	imp, e := parseImport(data)
	if e != nil {
		return e
	}
	meta := &imp.meta.Payload
	sid := meta.SessionID

	ref := req.Model
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
	ws := req.Workspace
	if ws == "" {
		ws = meta.Workspace
	}
	if ws == "" {
		return badRequest("the Trace names no workspace; pass workspace")
	}
	ws, err = confine.Workspace(ws, s.opts.WorkspaceRoots)
	if err != nil {
		if req.Workspace == "" {
			return badRequest("the Trace's %v; pass workspace to choose one here", err)
		}
		return badRequest("%v", err)
	}

	ctx := r.Context()
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
	if err := writeNew(path, imp.content); err != nil {
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
// model reference (SPEC §5): anthropic stays anthropic, Floe's own
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
	content []byte    // the file as it is written: torn last line dropped
	records int
}

// parseImport checks a Trace file: every line a valid record (a torn last
// line, without its newline, is dropped), none longer than maxImportLine,
// the first a session_meta with a usable session id and timestamp, and no
// session_meta of another Session.
func parseImport(data []byte) (*imported, *apiError) {
	imp := &imported{}
	end := 0 // content kept so far
	for n, rest := 1, data; len(rest) > 0; n++ {
		line := rest
		complete := false
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest, complete = rest[:i], rest[i+1:], true
		} else {
			rest = nil
		}
		if len(line) > maxImportLine {
			return nil, badRequest("line %d is longer than %d bytes", n, maxImportLine)
		}
		text := bytes.TrimSpace(line)
		if len(text) == 0 {
			end += len(line)
			if complete {
				end++
			}
			continue
		}
		m, err := omni.Decode(text)
		if err != nil {
			if !complete {
				break // a torn last line: a write cut short by a crash
			}
			return nil, badRequest("line %d is not a valid record: %v", n, err)
		}
		if imp.records == 0 {
			if m.Type != omni.KindSessionMeta {
				return nil, badRequest("line %d: the first record is %s, want session_meta", n, m.Type)
			}
			sid := m.Payload.SessionID
			if !omni.ValidSessionID(sid) || strings.ContainsAny(sid, `/\`) || sid != filepath.Base(sid) {
				return nil, badRequest("line %d: session id %q cannot name a Session here", n, sid)
			}
			t, err := time.Parse(time.RFC3339Nano, m.Timestamp)
			if err != nil {
				return nil, badRequest("line %d: timestamp %q is not ISO-8601", n, m.Timestamp)
			}
			imp.meta, imp.first = m, t.UTC()
		} else if m.Type == omni.KindSessionMeta && m.Payload.SessionID != imp.meta.Payload.SessionID {
			return nil, badRequest("line %d: session_meta of another session (%s)", n, m.Payload.SessionID)
		}
		imp.records++
		end += len(line)
		if complete {
			end++
		}
	}
	if imp.records == 0 {
		return nil, badRequest("the Trace holds no record; the first must be session_meta")
	}
	imp.content = data[:end:end]
	if end > 0 && data[end-1] != '\n' {
		imp.content = append(imp.content, '\n')
	}
	return imp, nil
}

// writeNew writes a file that must not exist yet, whole or not at all: a
// temporary file in the same directory, synced, then linked to path (which
// fails with fs.ErrExist when path exists).
func writeNew(path string, data []byte) error {
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
	_, err = f.Write(data)
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

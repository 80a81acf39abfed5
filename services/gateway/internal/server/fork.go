package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway/client"
)

// handleFork serves POST /api/sessions/:id/fork (protocol.md §3): a new Session
// with the parent's settings whose Trace _001 is the parent's history up
// to atSeq, closed there as an interrupted Task (trace.CutAt). A subagent
// run open at the cut is forked too, at the same position, and the fork's
// pointer names the child's fork. The parent is only read. Nothing is
// created unless the whole fork is: a bad atSeq answers 400.
func (s *Server) handleFork(w http.ResponseWriter, r *http.Request) *apiError {
	parent, e := s.load(r)
	if e != nil {
		return e
	}
	var req client.Fork
	if e := s.decodeBody(w, r, &req, true); e != nil {
		return e
	}
	ctx := r.Context()
	at, e := s.forkSeq(ctx, req.AtSeq)
	if e != nil {
		return e
	}
	point := cutPoint{seq: at}
	if req.AtRecord != nil {
		if at > 0 {
			return badRequest("atSeq and atRecord are two ways to say where to cut: give one")
		}
		if *req.AtRecord < 0 {
			return badRequest("atRecord %d is not a position of session %s", *req.AtRecord, parent.ID)
		}
		point = cutPoint{record: *req.AtRecord, byRecord: true}
	}
	var created []string
	rec, err := s.fork(ctx, parent, point, "", parent.Depth, &created)
	if err != nil {
		for _, id := range created {
			s.unfork(id)
		}
		if errors.Is(err, trace.ErrNotPosition) && point.byRecord {
			return badRequest("atRecord %d is not a position of session %s", point.record, parent.ID)
		}
		if errors.Is(err, trace.ErrNotPosition) {
			return badRequest("atSeq %d is not a stream position of session %s", at, parent.ID)
		}
		return unavailable("fork session", err)
	}
	s.log.Info().Str("session_id", rec.ID).Str("parent", parent.ID).Uint64("seq", rec.ForkedFrom.Seq).Msg("session forked")
	w.Header().Set("Location", "/api/sessions/"+rec.ID)
	writeJSON(w, http.StatusCreated, view(rec))
	return nil
}

// forkSeq parses atSeq: absent or null (everything so far), a positive
// integer, or an SSE event id "<epoch>-<seq>" (whose epoch must be the
// stream's) or its seq as a string.
func (s *Server) forkSeq(ctx context.Context, raw json.RawMessage) (uint64, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var text string
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &text); err != nil {
			return 0, badRequest("atSeq is not a string: %v", err)
		}
	} else {
		text = string(raw)
	}
	if ep, seqText, ok := strings.Cut(text, "-"); ok {
		epoch, err := strconv.ParseInt(ep, 10, 64)
		if err != nil {
			return 0, badRequest("atSeq %q is neither a sequence nor an event id <epoch>-<seq>", text)
		}
		info, ierr := s.stream.Info(ctx)
		if ierr != nil {
			return 0, unavailable("read stream", ierr)
		}
		if epoch != epochOf(info) {
			return 0, badRequest("atSeq %q is an event id of another incarnation of the stream", text)
		}
		text = seqText
	}
	seq, err := strconv.ParseUint(text, 10, 64)
	if err != nil || seq == 0 {
		return 0, badRequest("atSeq %s is not a positive stream sequence", raw)
	}
	return seq, nil
}

// cutPoint is where a fork cuts: a stream sequence (0: everything so
// far) or, byRecord, a record ordinal (trace.CutAtRecord).
type cutPoint struct {
	seq      uint64
	record   int
	byRecord bool
}

// fork creates the fork of src cut at at as
// a child of parentID (empty for a top-level fork) at depth; every
// Session it creates is appended to created, so a failure can remove
// them.
func (s *Server) fork(ctx context.Context, src *omni.SessionRecord, at cutPoint, parentID string, depth int, created *[]string) (*omni.SessionRecord, error) {
	var cut *trace.Cut
	var err error
	if at.byRecord {
		cut, err = trace.CutAtRecord(ctx, s.js, s.opts.Home, src.ID, at.record)
	} else {
		cut, err = trace.CutAt(ctx, s.js, s.opts.Home, src.ID, at.seq, parentID == "")
	}
	empty := errors.Is(err, trace.ErrNoHead) && parentID == ""
	if err != nil && !empty {
		return nil, err
	}
	if empty {
		// Nothing of the Session yet (no Task ran): the fork is a new
		// Session with its settings, and no Trace until its first Task.
		cut = &trace.Cut{Seq: at.seq}
	}
	now := time.Now()
	rec := &omni.SessionRecord{
		Model: src.Model, Workspace: src.Workspace, ApprovalMode: src.ApprovalMode,
		SystemPrompt: src.SystemPrompt, Instructions: src.Instructions, MaxTurns: src.MaxTurns,
		Compaction: src.Compaction, Title: src.Title, Principal: src.Principal,
		CreatedUnixMs: now.UnixMilli(), State: omni.StateIdle, Parent: parentID, Depth: depth,
		CommandPolicy: src.CommandPolicy,
		ForkedFrom:    &omni.ForkedFrom{SessionID: src.ID, Seq: cut.Seq},
	}
	if at.byRecord {
		rec.ForkedFrom.Record = &at.record
	}
	rec.ID = omni.NewSessionID(now, randHex(4))
	if empty {
		*created = append(*created, rec.ID)
		if err := s.sessions.Create(ctx, rec); err != nil {
			return nil, fmt.Errorf("create session: %w", err)
		}
		return rec, nil
	}
	records := cut.Records
	if len(cut.Children) > 0 && cut.Seq > 0 {
		// Each child whose run was open is forked at the same stream
		// position. (A cut by record on a record read from a Trace file
		// has no position to cut the children at: their pointers stay.)
		records = append([][]byte(nil), records...)
		for _, ch := range cut.Children {
			crec, _, err := s.sessions.Get(ctx, ch.ID)
			if errors.Is(err, bus.ErrSessionNotFound) {
				continue // deleted since: the pointer stays as it was
			}
			if err != nil {
				return nil, err
			}
			child, err := s.fork(ctx, crec, cutPoint{seq: cut.Seq}, rec.ID, crec.Depth, created)
			if errors.Is(err, trace.ErrNoHead) {
				continue // nothing of the child before the cut
			}
			if err != nil {
				return nil, fmt.Errorf("fork subagent %s: %w", ch.ID, err)
			}
			ptr := omni.Subagent(child.ID)
			if m, err := omni.Decode(records[ch.Index]); err == nil {
				ptr.Timestamp = m.Timestamp
			}
			if records[ch.Index], err = omni.Marshal(&ptr); err != nil {
				return nil, err
			}
		}
	}
	head := omni.ForkMeta(&cut.Head, rec.ID, *rec.ForkedFrom)
	var first, last bytes.Buffer
	if err := writeRecord(&first, &head); err != nil {
		return nil, err
	}
	for i := range cut.Close {
		if err := writeRecord(&last, &cut.Close[i]); err != nil {
			return nil, err
		}
	}
	// The carried records are written as they are stored: records read
	// from a Trace file lie one after the other, each with its newline, in
	// the buffer the file was read into, so they are written from there in
	// runs, not copied.
	parts := append([][]byte{first.Bytes()}, lineRuns(records)...)
	parts = append(parts, last.Bytes())
	path := trace.File(s.opts.Home, now, rec.ID, 1)
	if err := writeNewParts(path, parts); err != nil {
		return nil, fmt.Errorf("write trace file: %w", err)
	}
	*created = append(*created, rec.ID)
	if err := s.sessions.Create(ctx, rec); err != nil {
		return nil, fmt.Errorf("create session: %w", err)
	}
	return rec, nil
}

// lineRuns returns records as lines (each followed by a newline), joining
// records that lie one after the other in memory with a newline between
// them into one slice.
func lineRuns(records [][]byte) [][]byte {
	var runs [][]byte
	var run []byte
	for _, b := range records {
		if n := len(run); n > 0 && n+len(b) < cap(run) {
			if ext := run[:n+len(b)+1]; len(b) > 0 && &ext[n] == &b[0] && ext[n+len(b)] == '\n' {
				run = ext
				continue
			}
		}
		if run != nil {
			runs = append(runs, run)
		}
		if len(b) < cap(b) && b[:len(b)+1][len(b)] == '\n' {
			run = b[:len(b)+1]
		} else {
			run = append(append(make([]byte, 0, len(b)+1), b...), '\n')
		}
	}
	if run != nil {
		runs = append(runs, run)
	}
	return runs
}

func writeRecord(buf *bytes.Buffer, m *omni.Message) error {
	b, err := omni.Marshal(m)
	if err != nil {
		return err
	}
	buf.Write(b)
	buf.WriteByte('\n')
	return nil
}

// unfork removes what a failed fork created of Session id: its record and
// its Trace file.
func (s *Server) unfork(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.sessions.Delete(ctx, id); err != nil && !errors.Is(err, bus.ErrSessionNotFound) {
		s.log.Warn().Err(err).Str("session_id", id).Msg("could not remove a failed fork's session")
	}
	if created, ok := omni.SessionCreated(id); ok {
		os.Remove(trace.File(s.opts.Home, created, id, 1))
	}
}

package trace

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// ErrNotPosition is wrapped by CutAt when the sequence asked for is not
// one of the Session's stream positions (another Session's message, a
// sequence the stream never had or no longer retains).
var ErrNotPosition = errors.New("not a stream position of the session")

// ErrNoHead is wrapped by CutAt when the history up to the cut holds no
// session_meta (nothing of the Session yet).
var ErrNoHead = errors.New("no session_meta before the cut")

// A Cut is a Session's history up to a stream position, closed there as
// an interrupted Task: what a fork of the Session at that position
// carries (protocol.md §3, the fork route).
type Cut struct {
	// Head is the session_meta that opens the context the cut falls in
	// (the Session's first, or the one a completed compaction wrote).
	Head omni.Message
	// Records are the context's records after Head up to the cut, as
	// stored. Records the cut leaves incomplete (an uncommitted request's
	// messages) stay: Close drops them from the model context.
	Records [][]byte
	// Close are the records that end what was open at the cut, as an
	// interrupt would have: token_usage and request_end{aborted, attempt}
	// for a request still open (the engine's records of a user abort),
	// request_end{aborted} for a compaction attempt and compaction_end
	// {aborted} for an open compaction, then abort when anything was open
	// (a committed tool call still without output then gets the
	// interrupted placeholder).
	Close []omni.Message
	// Seq is the stream sequence the history was taken up to: the one
	// asked for, or, when none was, the last record's (0 when nothing of
	// the Session is on the stream: an imported Trace not run since).
	Seq uint64
	// Children are the subagent pointers among Records whose run was
	// still open at the cut: Records[Index] points to Session ID.
	Children []Child
}

// A Child is a subagent pointer record of a Cut whose child's run was
// open at the cut.
type Child struct {
	Index int
	ID    string
}

// CutAt reads Session sessionID's history (its Trace files and the
// FLOE_SESSIONS stream after them, as Load does) up to and including
// stream sequence atSeq (0: everything so far) and closes it as an
// interrupted Task (see Cut). With check, atSeq must be one of the
// Session's stream positions (any class: the seq of an SSE event id), else
// the error wraps ErrNotPosition; without it (a subagent cut at its
// parent's position) any sequence is taken.
//
// Records read from Trace files carry no stream sequence. A cut inside
// them is placed by the stream, which holds the same records in the same
// order: the stream's Trace-class messages of the Session up to the
// tracer's position are the last records of the files. Records older than
// what the stream retains, and the records of an imported Trace, have no
// stream position: they are always carried whole.
func CutAt(ctx context.Context, js jetstream.JetStream, home, sessionID string, atSeq uint64, check bool) (*Cut, error) {
	if atSeq > 0 && check {
		if err := checkPosition(ctx, js, sessionID, atSeq); err != nil {
			return nil, err
		}
	}
	// One pass: the records are read and followed as they come, up to
	// atSeq. Only a cut inside the Trace files (which carry no sequences)
	// needs the stream to place it, and a second look at the records.
	h := &History{}
	c := &cutter{at: atSeq}
	if err := h.load(ctx, js, home, sessionID, Options{}, &sink{records: &h.Records, lazy: c.see, reset: c.reset}); err != nil {
		return nil, err
	}
	nFile := 0
	for nFile < len(h.Records) && h.Records[nFile].Seq == 0 {
		nFile++
	}
	if atSeq == 0 || nFile == 0 || !h.HavePos || atSeq >= h.Pos.Seq {
		seq := atSeq
		if seq == 0 {
			seq = h.LastSeq
		}
		if !c.haveHead {
			return noHead(h.Records, seq)
		}
		out := &Cut{Head: c.head, Records: c.records, Seq: seq}
		out.Close, out.Children = c.st.close(c.records)
		return out, nil
	}
	recs, err := placeInFiles(ctx, js, sessionID, atSeq, h, nFile)
	if err != nil {
		return nil, err
	}
	out, err := Close(recs, atSeq)
	if errors.Is(err, ErrNoHead) {
		return noHead(h.Records, atSeq)
	}
	return out, err
}

// CutAtRecord is CutAt by a record's ordinal instead of a stream
// sequence: the Session's history up to and including its record of
// ordinal n, closed as an interrupted Task. An ordinal counts the records
// as LoadWindow does (Trace files' non-blank lines up to the tracer's
// position, malformed ones included, then the Session's Trace-class
// messages in FLOE_SESSIONS after it): what /messages gives as each
// message's position. It reaches what a sequence cannot: records of an
// imported Trace and of files older than the stream's retention. The Cut's
// Seq is the record's stream sequence, 0 when it was read from a Trace
// file. An n past the history's end wraps ErrNotPosition.
func CutAtRecord(ctx context.Context, js jetstream.JetStream, home, sessionID string, n int) (*Cut, error) {
	if n < 0 {
		return nil, fmt.Errorf("trace: cut %s at record %d: %w", sessionID, n, ErrNotPosition)
	}
	h := &History{}
	c := &cutter{upTo: n + 1}
	if err := h.load(ctx, js, home, sessionID, Options{}, &sink{records: &h.Records, lazy: c.see, reset: c.reset}); err != nil {
		return nil, err
	}
	if c.count <= n {
		return nil, fmt.Errorf("trace: cut %s at record %d: %w (the history holds %d)", sessionID, n, ErrNotPosition, c.count)
	}
	if !c.haveHead {
		return noHead(h.Records, c.seq)
	}
	out := &Cut{Head: c.head, Records: c.records, Seq: c.seq}
	out.Close, out.Children = c.st.close(c.records)
	return out, nil
}

// noHead is the Cut before a Session's first session_meta (its first
// Task's task_state): nothing is carried, under the Session's first head.
// ErrNoHead when the Session has none (no Task ran).
func noHead(all []Record, seq uint64) (*Cut, error) {
	for _, r := range all {
		var m omni.Message
		if decode(r.Data, &m) == nil && m.Type == omni.KindSessionMeta && len(m.Origin) == 0 {
			return &Cut{Head: m, Seq: seq}, nil
		}
	}
	return nil, fmt.Errorf("trace: cut: %w", ErrNoHead)
}

// A cutter follows a history as it is read, up to sequence at (0: all):
// the last head, the records after it, and what they leave open.
type cutter struct {
	at       uint64
	head     omni.Message
	haveHead bool
	records  [][]byte
	st       openState
	m        omni.Message // decoding buffer of see
	// upTo, when nonzero, cuts by ordinal instead (CutAtRecord): see takes
	// the first upTo records it is handed and accepts every one, as
	// LoadWindow counts them. count is how many it was handed, seq the
	// sequence of the last one taken.
	upTo, count int
	seq         uint64
}

func (c *cutter) take(seq uint64, data []byte, m *omni.Message) {
	if c.at > 0 && seq > c.at {
		return // past the cut (records from Trace files have no sequence)
	}
	if m.Type == omni.KindSessionMeta && len(m.Origin) == 0 {
		c.head, c.haveHead = *m, true
		c.records, c.st = c.records[:0], openState{}
		return
	}
	c.records = append(c.records, data)
	c.st.apply(len(c.records)-1, m)
}

func (c *cutter) reset() { *c = cutter{at: c.at, upTo: c.upTo} }

// see takes a record as stored: peeked, and decoded only when peek cannot
// tell what the open state needs of it (see peek). It reports false for a
// record that does not decode (a malformed line, skipped like a reader
// skips it).
func (c *cutter) see(seq uint64, data []byte) bool {
	if c.at > 0 && seq > c.at {
		return true // past the cut
	}
	if c.upTo > 0 {
		// By ordinal every record counts, a malformed one too (it is not
		// carried: a reader skips it).
		if c.count++; c.count > c.upTo {
			return true
		}
		c.seq = seq
	}
	p := peek(data)
	if p.kind == peekDecode {
		if decode(data, &c.m) != nil {
			return c.upTo > 0
		}
		c.take(seq, data, &c.m)
		return true
	}
	c.records = append(c.records, data)
	switch p.kind {
	case peekCall:
		c.st.call(p.id, p.name, p.stop)
	case peekOutput:
		c.st.output(p.id)
	case peekBegin:
		c.st.requestBegin()
	}
	return true
}

// checkPosition reports whether FLOE_SESSIONS holds a message of the
// Session at seq.
func checkPosition(ctx context.Context, js jetstream.JetStream, sessionID string, seq uint64) error {
	s, err := js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return fmt.Errorf("trace: cut %s at %d: %w", sessionID, seq, err)
	}
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("trace: cut %s at %d: %w (the stream holds no message there)", sessionID, seq, ErrNotPosition)
	}
	if err != nil {
		return fmt.Errorf("trace: cut %s at %d: %w", sessionID, seq, err)
	}
	if sid, _, ok := omni.ParseSessionSubject(m.Subject); !ok || sid != sessionID {
		return fmt.Errorf("trace: cut %s at %d: %w (another session's message)", sessionID, seq, ErrNotPosition)
	}
	return nil
}

// errPast ends a stream read at the sequence wanted.
var errPast = errors.New("past the cut")

// placeInFiles returns the Session's records up to atSeq, a sequence
// below the tracer's position h.Pos (h.Records, of which the first nFile
// came from Trace files): the stream's Trace-class records of the Session
// up to the position are the files' last ones, with their sequences.
func placeInFiles(ctx context.Context, js jetstream.JetStream, sessionID string, atSeq uint64, h *History, nFile int) ([]Record, error) {
	var tail []Record
	var m omni.Message
	err := bus.Follow(ctx, js, sessionID, omni.TraceClasses, 1, true, func(sm bus.StreamMsg) error {
		if sm.Seq > h.Pos.Seq {
			return errPast
		}
		if decode(sm.Data, &m) == nil {
			tail = append(tail, Record{Seq: sm.Seq, Data: sm.Data})
		}
		return nil
	})
	if err != nil && !errors.Is(err, errPast) {
		return nil, fmt.Errorf("trace: cut %s at %d: %w", sessionID, atSeq, err)
	}
	if len(tail) > nFile {
		return nil, fmt.Errorf("trace: cut %s at %d: the stream holds %d records up to the trace position, the trace files %d", sessionID, atSeq, len(tail), nFile)
	}
	out := h.Records[: nFile-len(tail) : nFile-len(tail)]
	for _, r := range tail {
		if r.Seq > atSeq {
			break
		}
		out = append(out, r)
	}
	return out, nil
}

// Close takes the records of a Session's history up to a cut at seq and
// returns the Cut: the context the cut falls in, closed as an interrupted
// Task. The records must start with a session_meta.
func Close(recs []Record, seq uint64) (*Cut, error) {
	c := &cutter{}
	for _, r := range recs {
		c.see(0, r.Data)
	}
	if !c.haveHead {
		return nil, fmt.Errorf("trace: cut: %w", ErrNoHead)
	}
	out := &Cut{Head: c.head, Seq: seq, Records: c.records}
	out.Close, out.Children = c.st.close(c.records)
	return out, nil
}

// openState follows what a history leaves open: a request, a compaction
// (and its attempt), committed tool calls without output, subagent runs.
// The rules are the fold's (protocol.md §5: a call is committed by its request's
// request_end completed; an abort interrupts every call without output;
// a completed compaction starts a new context).
type openState struct {
	request bool
	// attempt is the open request's attempt (the reconnect ladder's, as
	// the engine numbers it), next the one a request_begin starts: 1,
	// or after a failed attempt whose retry was planned, the one after.
	attempt, next  int64
	compacting     bool
	compactAttempt bool // a compaction attempt's request is open
	reason         string
	mode           string
	// calls are the committed calls still without output, in call
	// order; requestCalls those of the open request.
	calls, requestCalls []string
	subagents           map[string]bool // run_subagent call ids
	// pointers are the subagent pointer records: each belongs to the
	// first run_subagent call (in call order) that has none yet.
	pointers []Child
	pointed  map[string]int // call id → index in pointers
	order    []string       // run_subagent calls in call order
}

func (s *openState) apply(i int, m *omni.Message) {
	if len(m.Origin) > 0 || m.IsPartial() {
		return
	}
	p := &m.Payload
	switch {
	case m.Type == omni.KindModel && p.Type == omni.TypeToolCall:
		s.call(p.ToolCallID, p.Name, p.Stop())
	case m.Type == omni.KindModel && p.Type == omni.TypeToolCallOutput:
		s.output(p.ToolCallID)
	case m.Type != omni.KindEvent:
	case p.Type == omni.TypeRequestBegin:
		s.requestBegin()
	case p.Type == omni.TypeRequestEnd:
		if s.compacting {
			s.compactAttempt = false
		} else if s.request {
			if p.Status == omni.StatusCompleted {
				s.calls = append(s.calls, s.requestCalls...)
			}
			s.request, s.requestCalls = false, nil
			s.next = 0
			if p.Status != omni.StatusCompleted && p.Status != omni.StatusAborted && p.RetryInMs > 0 {
				s.next = max(p.Attempt, 1) + 1 // its retry follows
			}
		}
	case p.Type == omni.TypeAbort:
		// Every call without output is interrupted: none of them gets a
		// subagent pointer after this.
		s.request, s.calls, s.requestCalls, s.order = false, nil, nil, nil
	case p.Type == omni.TypeCompactionBegin:
		s.compacting, s.compactAttempt, s.reason, s.mode = true, false, p.Reason, p.Mode
	case p.Type == omni.TypeCompactionEnd:
		if s.compacting && p.Status == omni.StatusCompleted {
			s.request, s.calls, s.requestCalls, s.order = false, nil, nil, nil
		}
		s.compacting, s.compactAttempt = false, false
	case p.Type == omni.TypeSubagent:
		for _, id := range s.order {
			if _, ok := s.pointed[id]; !ok {
				s.pointed[id] = len(s.pointers)
				s.pointers = append(s.pointers, Child{Index: i, ID: p.SessionID})
				return
			}
		}
	}
}

// call follows a top-level tool_call (stop is its Stop()).
func (s *openState) call(id, name, stop string) {
	if !s.request || s.compacting || stop != omni.StatusCompleted {
		return
	}
	s.requestCalls = append(s.requestCalls, id)
	if name == "run_subagent" {
		if s.subagents == nil {
			s.subagents, s.pointed = make(map[string]bool), make(map[string]int)
		}
		s.subagents[id] = true
		s.order = append(s.order, id)
	}
}

// output follows a top-level tool_call_output. A run_subagent call with its
// output takes no pointer after it (a child that could not be started
// has none: the next pointer is another call's).
func (s *openState) output(id string) {
	s.calls = remove(s.calls, id)
	s.requestCalls = remove(s.requestCalls, id)
	if len(s.order) > 0 {
		s.order = remove(s.order, id)
	}
}

func (s *openState) requestBegin() {
	if s.compacting {
		s.compactAttempt = true
	} else {
		s.request, s.requestCalls = true, nil
		s.attempt, s.next = max(s.next, 1), 0
	}
}

// close returns the records that close what s has open, and the subagent
// pointers whose run was open. records are the context's records (for
// the Session's token usage so far).
//
// An open request is closed as the engine closes one a user aborts:
// token_usage (the Session's usage so far, nothing for the request), then
// request_end{aborted, attempt}, so a fork's Trace is one the engine
// could have written, and floe replay --execute of the fork replays it.
func (s *openState) close(records [][]byte) (out []omni.Message, children []Child) {
	open := s.request || s.compacting || len(s.calls) > 0
	if s.compacting {
		if s.compactAttempt {
			out = append(out, omni.RequestEnd(omni.StatusAborted, "", 0, 0))
		}
		out = append(out, omni.CompactionEnd(s.reason, s.mode, omni.StatusAborted))
	}
	if s.request {
		out = append(out, omni.TokenUsage(lastUsage(records), omni.Usage{}),
			omni.RequestEnd(omni.StatusAborted, "", s.attempt, 0))
	}
	if open {
		out = append(out, omni.Abort(omni.AbortedByUser))
	}
	for _, id := range append(append([]string(nil), s.calls...), s.requestCalls...) {
		if k, ok := s.pointed[id]; ok && s.subagents[id] {
			children = append(children, s.pointers[k])
		}
	}
	return out, children
}

// lastUsage is the Session's usage of the last token_usage among records
// (the fold's, which the engine starts a Task with); zero when none.
// Only that record is decoded.
func lastUsage(records [][]byte) omni.Usage {
	key := []byte(`"type":"` + omni.TypeTokenUsage + `"`)
	for i := len(records) - 1; i >= 0; i-- {
		if !bytes.Contains(records[i], key) {
			continue
		}
		var m omni.Message
		if decode(records[i], &m) != nil || len(m.Origin) > 0 || m.Type != omni.KindEvent || m.Payload.Type != omni.TypeTokenUsage {
			continue
		}
		if m.Payload.Session != nil {
			return *m.Payload.Session
		}
	}
	return omni.Usage{}
}

func remove(ids []string, id string) []string {
	for i, x := range ids {
		if x == id {
			return append(ids[:i:i], ids[i+1:]...)
		}
	}
	return ids
}

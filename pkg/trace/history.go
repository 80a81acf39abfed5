package trace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// Record is one record of a Session's history, as its original bytes (it
// decoded as a valid OmniMessage: malformed lines and bodies are skipped).
type Record struct {
	Seq  uint64 // stream sequence; 0 for a record read from a Trace file
	Data []byte // single-line JSON, exactly as stored
}

// Options tune Load.
type Options struct {
	// LastFiles reads only the last LastFiles Trace files up to the
	// position (0: all of them). Resume reads 2: they always hold the last
	// completed compaction and everything after it.
	LastFiles int
	// Classes are further subject classes read from the stream besides the
	// Trace classes (partial, nested, server for a live view). Messages of
	// these classes never become Records; OnStream sees them.
	Classes []string
	// From, when nonzero and lower than where the Trace ends, starts the
	// stream read there (a running Task's first message), so OnStream sees
	// the messages a live view needs; Trace-class messages the Trace
	// already holds are passed to OnStream but not made Records again.
	From uint64
	// OnStream, when set, is called for every stream message read, in
	// stream order, with whether it became a Record. An error ends Load.
	OnStream func(m bus.StreamMsg, record bool) error
}

// History is a Session's history as Load read it.
type History struct {
	Records []Record
	// Pos is the tracer's position the Trace was read up to (HavePos).
	Pos     Pos
	HavePos bool
	// StreamFrom is the first stream sequence whose Trace-class messages
	// became Records (everything before it came from Trace files).
	StreamFrom uint64
	// LastSeq is the sequence of the last stream message read, or the
	// position's when the stream had nothing after it.
	LastSeq uint64
	// Skipped counts malformed Trace lines skipped (a torn tail, a garbage
	// line), Bad stream bodies that did not decode.
	Skipped, Bad int
	// FromStream is true when the Trace was damaged (Skipped > 0) or had no
	// position, and the stream, which still held the Session from its
	// session_meta, was used instead of the files.
	FromStream bool
}

// Load reads a Session's history: its Trace files up to the tracer's
// position (Pos: whole files below the position's index, that file up to
// its recorded size; bytes and files past it are a crashed tracer's
// unrecorded writes and ignored), then the Session's messages in
// FLOE_SESSIONS after the position's sequence, so a lagging tracer hides
// nothing and nothing appears twice.
//
// When the Trace is damaged (malformed lines skipped) or has no readable
// position, and the stream still holds the Session from its session_meta,
// the stream alone is the history. Trace files without a position that the
// stream cannot replace (an imported Trace) are the whole history up to
// the stream's end. A Session with no Trace is read from the stream alone.
// home may be empty (no Trace at all).
func Load(ctx context.Context, js jetstream.JetStream, home, sessionID string, opt Options) (*History, error) {
	h := &History{}
	err := h.load(ctx, js, home, sessionID, opt, &sink{records: &h.Records})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// A sink takes the records of a history as they are read: it collects
// their bytes (records) or hands each decoded to fn, whose message is only
// valid during the call. restart drops what it took so far.
type sink struct {
	records *[]Record
	// raw keeps every non-blank line and Trace-class stream body without
	// decoding it (LoadWindow decodes only what it returns): m is nil then.
	raw   bool
	fn    func(m *omni.Message)
	reset func()
	// each, when set, is also called with every record (and its sequence)
	// as it is taken (and reset when the sink restarts).
	each func(seq uint64, data []byte, m *omni.Message)
	// lazy, when set, is handed every non-blank line and Trace-class
	// stream body undecoded (m is nil then, as with raw) and decides
	// itself whether it is a valid record: false skips it (counted in
	// Skipped or Bad, as a line that does not decode).
	lazy func(seq uint64, data []byte) bool
	// scratch, when set, is the memory Trace files are read into (grown
	// as needed) in place of a new buffer each: LoadWindow's, which
	// copies out the few records it returns and reuses the rest.
	scratch *[]byte
}

// stable reports whether the sink keeps the records' Data, so that a
// Trace file must be read into memory that stays.
func (s *sink) stable() bool { return s.records != nil }

func (s *sink) take(seq uint64, data []byte, m *omni.Message) bool {
	if s.lazy != nil && !s.lazy(seq, data) {
		return false
	}
	if s.each != nil {
		s.each(seq, data, m)
	}
	if s.records != nil {
		*s.records = append(*s.records, Record{Seq: seq, Data: data})
		return true
	}
	s.fn(m)
	return true
}

// undecoded reports whether the readers hand the sink records without
// decoding them.
func (s *sink) undecoded() bool { return s.raw || s.lazy != nil }

func (s *sink) restart() {
	if s.records != nil {
		*s.records = (*s.records)[:0]
	}
	if s.reset != nil {
		s.reset()
	}
}

func (h *History) load(ctx context.Context, js jetstream.JetStream, home, sessionID string, opt Options, out *sink) error {
	var files []string
	if home != "" {
		pos, ok, err := ReadPos(home, sessionID)
		if err != nil && !errors.Is(err, ErrBadPos) {
			return err
		}
		h.Pos, h.HavePos = pos, ok && err == nil
		if files, err = Files(home, sessionID); err != nil {
			return err
		}
	}
	if len(files) == 0 {
		return h.stream(ctx, js, sessionID, 1, opt, out)
	}
	if h.HavePos {
		var usable []string
		for _, f := range files {
			if idx, _ := IndexOf(f, sessionID); idx > h.Pos.Index {
				break
			}
			usable = append(usable, f)
		}
		files = usable
	}
	if opt.LastFiles > 0 && len(files) > opt.LastFiles {
		files = files[len(files)-opt.LastFiles:]
	}
	for _, f := range files {
		limit := int64(-1)
		if h.HavePos {
			if idx, _ := IndexOf(f, sessionID); idx == h.Pos.Index {
				limit = h.Pos.Size
			}
		}
		skipped, err := readFile(f, limit, out)
		if err != nil {
			return err
		}
		h.Skipped += skipped
	}
	if h.Skipped > 0 || !h.HavePos {
		// A damaged Trace, or one without a position: prefer the stream
		// when it still holds the Session from its head.
		whole := &History{}
		var m omni.Message
		if err := whole.stream(ctx, js, sessionID, 1, opt, &sink{records: &whole.Records}); err == nil && len(whole.Records) > 0 &&
			decode(whole.Records[0].Data, &m) == nil && m.Type == omni.KindSessionMeta {
			out.restart()
			for _, r := range whole.Records {
				if (!out.stable() || out.each != nil) && out.lazy == nil {
					decode(r.Data, &m) // it decoded once already: cannot fail
				}
				out.take(r.Seq, r.Data, &m)
			}
			h.StreamFrom, h.LastSeq, h.Bad, h.FromStream = whole.StreamFrom, whole.LastSeq, whole.Bad, true
			return nil
		}
	}
	if !h.HavePos {
		// Trace files that are the whole history (imported): nothing of
		// the stream joins them.
		last, err := bus.LastSeq(ctx, js)
		if err != nil {
			return err
		}
		return h.stream(ctx, js, sessionID, last+1, opt, out)
	}
	h.LastSeq = h.Pos.Seq
	return h.stream(ctx, js, sessionID, h.Pos.Seq+1, opt, out)
}

// stream appends the Session's Trace-class messages from sequence from
// (and hands opt.OnStream what it asks for).
func (h *History) stream(ctx context.Context, js jetstream.JetStream, sessionID string, from uint64, opt Options, out *sink) error {
	h.StreamFrom = from
	start := from
	if opt.From > 0 && opt.From < start {
		start = opt.From
	}
	classes := omni.TraceClasses
	if len(opt.Classes) > 0 {
		classes = append(append([]string(nil), omni.TraceClasses...), opt.Classes...)
	}
	if start > 1 && len(opt.Classes) == 0 {
		// After a tracer that is caught up (the usual resume), nothing
		// follows the position: a few message gets answer that sooner than
		// a consumer would. When they fail, the consumer answers.
		if held, err := bus.Holds(ctx, js, sessionID, classes, start); err == nil && !held {
			return nil
		}
	}
	var m omni.Message
	err := bus.Follow(ctx, js, sessionID, classes, start, true, func(sm bus.StreamMsg) error {
		h.LastSeq = max(h.LastSeq, sm.Seq)
		record := false
		if sm.Seq >= from && isTraceClass(sm.Class) && out.undecoded() {
			if record = out.take(sm.Seq, sm.Data, nil); !record {
				h.Bad++
			}
		} else if sm.Seq >= from && isTraceClass(sm.Class) {
			if err := decode(sm.Data, &m); err != nil {
				h.Bad++
			} else {
				out.take(sm.Seq, sm.Data, &m)
				record = true
			}
		}
		if opt.OnStream != nil {
			return opt.OnStream(sm, record)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("trace: history of %s from seq %d: %w", sessionID, start, err)
	}
	return nil
}

func isTraceClass(class string) bool {
	for _, c := range omni.TraceClasses {
		if c == class {
			return true
		}
	}
	return false
}

// Replay reads a Session's history for resuming it (what Load reads with
// LastFiles 2: the last two Trace files up to the position and the stream
// after them) and folds it as it is read, so that it is never held in
// memory: it calls fn with each record, decoded, in order. It returns the
// sequence of the last message read and the count of malformed lines and
// bodies skipped. The message is decoded into one value reused for every
// record, but each decoding has its own strings and slices: fn may keep a
// shallow copy of it, never the pointer. When Replay drops what it handed
// over (a damaged Trace that the stream replaces), it calls reset (when
// set) before handing the history over again from its first record.
func Replay(ctx context.Context, js jetstream.JetStream, home, sessionID string, fn func(m *omni.Message), reset func()) (lastSeq uint64, bad int, err error) {
	h := &History{}
	if err := h.load(ctx, js, home, sessionID, Options{LastFiles: 2}, &sink{fn: fn, reset: reset}); err != nil {
		return 0, 0, err
	}
	return h.LastSeq, h.Skipped + h.Bad, nil
}

// readFile hands out the valid records of one Trace file (its first limit
// bytes when limit >= 0), skipping malformed lines as Read does; it returns
// how many it skipped. A file removed meanwhile (a deleted Session) reads
// as empty.
func readFile(path string, limit int64, out *sink) (int, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("trace: open %s: %w", path, err)
	}
	defer f.Close()
	var r io.Reader = f
	if limit >= 0 {
		r = io.LimitReader(f, limit)
	}
	if !out.stable() {
		// Line by line through one buffer: nothing of the file is kept.
		skipped, err := eachLine(readerLines(r, 64<<10), func(line []byte, m *omni.Message) { out.take(0, line, m) })
		if err != nil {
			return 0, fmt.Errorf("trace: read %s: %w", path, err)
		}
		return len(skipped), nil
	}
	// The records keep their Data: one read into one buffer sized from the
	// file, and the Data are slices of it (no copy per line, no growing).
	size := int64(64 << 10)
	if st, err := f.Stat(); err == nil {
		size = st.Size()
	}
	if limit >= 0 {
		size = min(size, limit)
	}
	var data []byte
	if out.scratch != nil {
		// After what earlier files left in it: their records keep
		// their slices (a grown buffer leaves them the old one).
		start := len(*out.scratch)
		buf, rerr := readAll(r, slices.Grow(*out.scratch, int(size)+1))
		data, err, *out.scratch = buf[start:], rerr, buf
	} else {
		data, err = readAll(r, make([]byte, 0, size+1))
	}
	if err != nil {
		return 0, fmt.Errorf("trace: read %s: %w", path, err)
	}
	// Room for the file's records and a few from the stream after them.
	lines := bytes.Count(data, []byte{'\n'}) + 1
	*out.records = slices.Grow(*out.records, lines+lines/16+64)
	if out.undecoded() {
		skipped := 0
		for len(data) > 0 {
			line := data
			if i := bytes.IndexByte(data, '\n'); i >= 0 {
				line = data[:i]
				data = data[i+1:]
			} else {
				data = nil
			}
			if line = bytes.TrimSpace(line); len(line) > 0 && !out.take(0, line, nil) {
				skipped++
			}
		}
		return skipped, nil
	}
	skipped, err := eachLine(dataLines(data), func(line []byte, m *omni.Message) { out.take(0, line, m) })
	if err != nil {
		return 0, fmt.Errorf("trace: read %s: %w", path, err)
	}
	return len(skipped), nil
}

// readAll is io.ReadAll into buf, which is usually big enough already.
func readAll(r io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, 64<<10)
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

package trace

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/omni"
)

// Window selects part of a Session's history: the newest Tasks records
// before the cursor Before (docs/history-window.md).
//
// A cursor is a record's ordinal: its index among the history's records as
// Load reads them, malformed lines included (the Trace files' non-blank
// lines up to the tracer's position, then the Session's Trace-class
// messages in FLOE_SESSIONS after it). Records are only ever appended, and
// a record has the same ordinal whether it is read from the stream or,
// once traced, from a Trace file, so a cursor stays valid while Tasks run.
type Window struct {
	// Tasks is how many Tasks to return (> 0). A Task starts at its
	// Prompt: a user text or image (the run of them, for a Prompt of
	// several parts) outside a compaction, that is neither steering nor
	// the [context_summary] of a compacted context.
	Tasks int
	// Before, when HaveBefore, ends the window before the record of that
	// ordinal (a Window's Start, for the page before it); otherwise the
	// window ends with the history.
	Before     int
	HaveBefore bool
}

// ErrCursor is returned for a Before past the end of the history: not a
// cursor this history gave.
var ErrCursor = errors.New("trace: cursor past the end of the history")

// Page is a Window of a history.
type Page struct {
	// Records are the window's valid records in order (malformed lines are
	// skipped, counted in Skipped); Ordinals their ordinals.
	Records  []Record
	Ordinals []int
	// Start and End are the ordinals the window covers: [Start, End).
	// Start is the cursor of the page before it; Total the history's
	// record count.
	Start, End, Total int
	// More is true when records come before Start (Start > 0).
	More    bool
	Skipped int
}

// LoadWindow reads a Window of a Session's history (what Load reads, with
// opt), decoding only the records it returns and, to find where their
// first Task starts, the Task before them: the other records are counted,
// never decoded. The History carries where it was read (Pos, LastSeq, …);
// its Records are nil.
func LoadWindow(ctx context.Context, js jetstream.JetStream, home, sessionID string, w Window, opt Options) (*History, *Page, error) {
	if w.Tasks <= 0 {
		return nil, nil, fmt.Errorf("trace: window of %d Tasks", w.Tasks)
	}
	h := &History{}
	// The whole history is read into pooled memory (a long Session's
	// Trace is megabytes, a window kilobytes): the window's records are
	// copied out before it goes back.
	mem := windowPool.Get().(*windowMem)
	defer mem.put()
	all := &mem.records
	if err := h.load(ctx, js, home, sessionID, opt, &sink{records: all, raw: true, scratch: &mem.data}); err != nil {
		return nil, nil, err
	}
	p, err := window(*all, w)
	if err != nil {
		return nil, nil, err
	}
	size := 0
	for _, r := range p.Records {
		size += len(r.Data)
	}
	own := make([]byte, 0, size)
	for i, r := range p.Records {
		own = append(own, r.Data...)
		p.Records[i].Data = own[len(own)-len(r.Data) : len(own) : len(own)]
	}
	return h, p, nil
}

// windowMem is LoadWindow's reusable memory: the history's records and
// the bytes of its Trace files.
type windowMem struct {
	records []Record
	data    []byte
}

var windowPool = sync.Pool{New: func() any { return new(windowMem) }}

// maxPooledWindow bounds the memory a pooled windowMem keeps.
const maxPooledWindow = 64 << 20

// put clears m (no Data stays referenced) and pools it unless too large.
func (m *windowMem) put() {
	clear(m.records)
	m.records, m.data = m.records[:0], m.data[:0]
	if cap(m.data) > maxPooledWindow || cap(m.records) > maxPooledWindow/32 {
		return
	}
	windowPool.Put(m)
}

// window is the page w selects of the history all.
func window(all []Record, w Window) (*Page, error) {
	end := len(all)
	if w.HaveBefore {
		if w.Before < 0 || w.Before > end {
			return nil, fmt.Errorf("%w: %d of %d records", ErrCursor, w.Before, end)
		}
		end = w.Before
	}
	p := &Page{End: end, Total: len(all)}
	p.Start, p.More = windowStart(all[:end], w.Tasks)
	var m omni.Message
	for i, r := range all[p.Start:end] {
		if decode(r.Data, &m) != nil {
			p.Skipped++
			continue
		}
		p.Records = append(p.Records, r)
		p.Ordinals = append(p.Ordinals, p.Start+i)
	}
	return p, nil
}

// windowStart returns where the newest tasks Tasks of recs start, walking
// back from the end and decoding only what it walks over; with no Task
// before that start, it is 0 (the history's head, its session_meta, joins
// the first Task). more reports records before the start.
func windowStart(recs []Record, tasks int) (start int, more bool) {
	var m omni.Message
	found := 0
	run := -1             // the earliest Prompt record of the run being walked
	inCompaction := false // walking back: between compaction_end and its begin
	start = -1
	taskAt := func(i int) bool {
		found++
		if found == tasks {
			start = i
			return false
		}
		return found > tasks // a Task before the window: it has more
	}
	for i := len(recs) - 1; i >= 0; i-- {
		if decode(recs[i].Data, &m) != nil {
			continue // malformed: neither ends nor starts a Prompt
		}
		if m.Type == omni.KindEvent {
			switch m.Payload.Type {
			case omni.TypeCompactionEnd:
				inCompaction = true
			case omni.TypeCompactionBegin:
				inCompaction = false
			}
		}
		if !inCompaction && isPrompt(&m) {
			run = i
			continue
		}
		if run >= 0 {
			if taskAt(run) {
				return start, true
			}
			run = -1
		}
	}
	if run >= 0 && taskAt(run) {
		return start, true
	}
	return 0, false
}

// isPrompt reports whether m is (part of) a Prompt: the user's text or
// image, not steering, not a compacted context's summary.
func isPrompt(m *omni.Message) bool {
	p := &m.Payload
	if m.Type != omni.KindModel || p.Role != omni.RoleUser || len(m.Origin) > 0 {
		return false
	}
	switch p.Type {
	case omni.TypeImageURL:
		return true
	case omni.TypeText:
		for _, tag := range []string{omni.TagContextSummary, omni.TagUserSteering} {
			if _, ok := omni.ParseBlock(p.Text, tag); ok {
				return false
			}
		}
		return !steeredNotice(p.Text)
	}
	return false
}

// steeredNotice reports a background completion the original (0.2.6 and
// later) delivered into a running Task: a [background_task_done] block at
// the start of the text with a "delivery: steering" field line. Like
// steering, it is inside the Task, never the start of one (the original's
// isSteeredBackgroundNotice).
func steeredNotice(text string) bool {
	const open, end = "[background_task_done]\n", "\n[/background_task_done]"
	if !strings.HasPrefix(text, open) {
		return false
	}
	body, _, ok := strings.Cut(text[len(open):], end)
	if !ok {
		return false
	}
	for _, line := range strings.Split(body, "\n") {
		if line == "delivery: steering" {
			return true
		}
	}
	return false
}

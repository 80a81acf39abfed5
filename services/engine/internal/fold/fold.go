// Package fold rebuilds a Session's model context from its recorded
// messages (the Trace, or the stream's Trace classes). It is deterministic:
// no clock, no I/O, no randomness — the same records always give the same
// context, which is how a resumed or failed-over Session continues exactly.
//
// Rules (protocol.md §5, seed "Guarantees"): only requests whose request_end status
// is completed are committed; tool outputs attach to their call wherever they
// land in the stream and are fed in call order; a committed call whose output
// never arrived (an interrupted run) gets the interrupted placeholder so
// pairing stays intact; a completed compaction replaces the context with its
// summary.
package fold

import (
	"iter"
	"strings"

	"floe.dev/pkg/omni"
)

// Context is the folded state of a Session.
type Context struct {
	// Meta is the latest session_meta (nil before the first).
	Meta *omni.Message
	// Tools is the payload of the latest tool_list_ready.
	Tools []omni.ToolSpec

	// log is the user messages and committed turns (entries.go: shared
	// with clones, copy-on-write).
	log entries

	open *turn // the request in progress (request_begin seen, no request_end)

	// Usage is the Session's cumulative token usage.
	Usage omni.Usage
	// LastRequestTotal is request.total of the last normal request's
	// token_usage (reset by a completed compaction).
	LastRequestTotal int64
	// Turns counts completed requests since the last completed compaction;
	// TotalTurns since the Session began.
	Turns, TotalTurns int64

	// Compacting is true between compaction_begin and compaction_end.
	Compacting      bool
	compactionText  string          // the last completed attempt's answer
	attemptText     strings.Builder // the attempt in progress
	attemptOpen     bool
	compactionBegin omni.Payload
	// Summary is the summary of the last completed summarize compaction.
	Summary string
	// summaryMsg is the [context_summary] message Messages opens with,
	// made of summaryOf.
	summaryMsg *omni.Message
	summaryOf  string
	// Compactions counts completed compactions.
	Compactions int
	// Closed is true after a completed compaction until the next
	// session_meta: the new context's head (a Trace that ends in a
	// completed compaction, e.g. an engine stopped right after it, or an
	// imported file of the original's) is still to be written.
	Closed bool

	// Records counts folded records.
	Records int
}

type entry struct {
	msg  *omni.Message // a user message
	turn *turn         // or a committed turn
}

// A turn keeps its messages as pointers to copies made when they were
// folded: they are never changed afterwards, so Messages can hand them out
// without copying them again.
type turn struct {
	gen       uint64 // the Context that may change it (entries.go)
	assistant []*omni.Message
	toolCalls int // how many of assistant are tool_call messages
	calls     []string
	// outputs[i] is the output of calls[i], nil while none has arrived
	// (also for the open request: outputs that land before its
	// request_end).
	outputs []*omni.Message
	// interrupted marks calls still without output when the run was
	// aborted: their runners were cancelled, so no output will come; the
	// model gets the interrupted placeholder and nobody waits for them.
	// The value is the call's placeholder output, made once: a request's
	// messages are the same pointers from one request to the next (the
	// providers' wirecache).
	interrupted map[string]*omni.Message
}

// setSummary sets Summary and makes the message Messages opens with once,
// so that it is the same pointer request after request, in every clone
// (the providers' wirecache).
func (c *Context) setSummary(s string) {
	c.Summary, c.summaryMsg, c.summaryOf = s, nil, s
	if s != "" {
		c.summaryMsg = new(omni.UserText(omni.Block(omni.TagContextSummary, s)))
	}
}

// New returns an empty Context.
func New() *Context {
	return &Context{log: newEntries()}
}

// Reset empties c, as New would return it: for a reader that starts the
// history over (trace.Replay).
func (c *Context) Reset() { *c = Context{log: newEntries()} }

// Load folds msgs into a new Context.
func Load(msgs []omni.Message) *Context {
	c := New()
	for i := range msgs {
		c.Apply(&msgs[i])
	}
	return c
}

// Apply folds one record. Partials and origin-tagged messages are ignored.
// What c keeps of m it copies (a shallow copy: the strings and slices of m
// must not be changed afterwards), so m itself may be reused.
func (c *Context) Apply(m *omni.Message) {
	if len(m.Origin) > 0 || m.IsPartial() {
		return
	}
	c.Records++
	p := &m.Payload
	switch m.Type {
	case omni.KindSessionMeta:
		mm := *m
		c.Meta = &mm
		c.Closed = false
	case omni.KindEvent:
		c.applyEvent(m)
	case omni.KindModel:
		switch {
		case c.Compacting:
			// The compaction prompt and the attempts' answers are not
			// conversation; only the answer of the last completed attempt
			// (or, without request brackets, every answer) is kept.
			if p.Type == omni.TypeText && p.Role == omni.RoleAssistant {
				c.attemptText.WriteString(p.Text)
				if !c.attemptOpen {
					c.compactionText = c.attemptText.String()
				}
			}
		case p.Type == omni.TypeToolCallOutput:
			c.attachOutput(m)
		case c.open != nil && p.Role == omni.RoleAssistant:
			mm := *m
			o := c.openTurn()
			o.assistant = append(o.assistant, &mm)
			if p.Type == omni.TypeToolCall {
				o.toolCalls++
			}
			if p.Type == omni.TypeToolCall && p.Stop() == omni.StatusCompleted {
				o.calls = append(o.calls, p.ToolCallID)
				o.outputs = append(o.outputs, nil)
			}
		case p.Role == omni.RoleUser:
			// The [context_summary] text that opens the context after a
			// compaction (the next Trace file's first user record) is the
			// summary itself, kept once however the Trace is read.
			if body, ok := omni.ParseBlock(p.Text, omni.TagContextSummary); ok && p.Type == omni.TypeText && c.log.length() == 0 {
				c.setSummary(body)
				return
			}
			mm := *m
			c.log.add(entry{msg: &mm})
		}
		// An assistant message outside a request (the max-turns notice) is
		// shown to people, not fed back to the model.
	}
}

func (c *Context) applyEvent(m *omni.Message) {
	p := &m.Payload
	switch p.Type {
	case omni.TypeToolListReady:
		if specs, err := p.ToolSpecs(); err == nil {
			c.Tools = specs
		}
	case omni.TypeRequestBegin:
		if c.Compacting {
			c.attemptText.Reset()
			c.attemptOpen = true
			return
		}
		c.open = &turn{gen: c.log.gen}
	case omni.TypeRequestEnd:
		if c.Compacting {
			if c.attemptOpen && p.Status == omni.StatusCompleted {
				c.compactionText = c.attemptText.String()
			}
			c.attemptOpen = false
			return
		}
		if c.open == nil {
			return
		}
		t := c.open
		c.open = nil
		if p.Status != omni.StatusCompleted {
			return
		}
		c.Turns++
		c.TotalTurns++
		if len(t.assistant) == 0 {
			return
		}
		c.log.add(entry{turn: t})
	case omni.TypeTokenUsage:
		if p.Session != nil {
			c.Usage = *p.Session
		}
		if p.Request != nil && !c.Compacting {
			c.LastRequestTotal = p.Request.Total
		}
	case omni.TypeAbort:
		c.open = nil
		running := c.log.pending
		c.log.pending = nil
		for _, i := range running {
			t := c.log.mutable(i)
			for j, id := range t.calls {
				if t.outputs[j] == nil {
					t.interrupt(id)
				}
			}
		}
	case omni.TypeCompactionBegin:
		c.Compacting = true
		c.compactionText = ""
		c.attemptText.Reset()
		c.attemptOpen = false
		c.compactionBegin = *p
	case omni.TypeCompactionEnd:
		if !c.Compacting {
			return
		}
		c.Compacting = false
		if p.Status != omni.StatusCompleted {
			return
		}
		c.Compactions++
		c.Closed = true
		c.log = newEntries()
		c.open = nil
		c.Turns = 0
		c.LastRequestTotal = 0
		c.setSummary("")
		if p.Mode == omni.ModeSummarize {
			c.setSummary(ExtractSummary(c.compactionText))
		}
	}
}

func (c *Context) attachOutput(m *omni.Message) {
	id := m.Payload.ToolCallID
	// An output of a call that was never committed (its request failed) is
	// not part of the context.
	if i := c.log.find(id); i >= 0 {
		if c.log.at(i).turn.awaits(id) {
			c.log.mutable(i).attach(id, m)
			c.log.settled(i)
		}
	} else if c.open != nil && c.open.awaits(id) {
		c.openTurn().attach(id, m)
	}
}

// openTurn returns the open request's turn, c's own to change.
func (c *Context) openTurn() *turn {
	if c.open.gen != c.log.gen {
		c.open = c.open.dup(c.log.gen)
	}
	return c.open
}

// awaits reports whether attach(id, …) would change t: the first call of
// t with id has no output yet.
func (t *turn) awaits(id string) bool {
	for i, cid := range t.calls {
		if cid == id {
			return t.outputs[i] == nil
		}
	}
	return false
}

// interrupt marks call id of t interrupted (t is this Context's own).
func (t *turn) interrupt(id string) {
	if t.interrupted == nil {
		t.interrupted = make(map[string]*omni.Message)
	}
	if t.interrupted[id] == nil {
		m := omni.ToolCallOutput(id, omni.InterruptedOutput, omni.StatusAborted)
		t.interrupted[id] = &m
	}
}

// running reports whether a call of t has neither an output nor the
// interrupted mark (what an abort marks).
func (t *turn) running() bool {
	for i, id := range t.calls {
		if t.outputs[i] == nil && t.interrupted[id] == nil {
			return true
		}
	}
	return false
}

// attach makes (a copy of) m the output of the calls of t with id, unless
// they have one: the first output of a call is its output.
func (t *turn) attach(id string, m *omni.Message) {
	var kept *omni.Message
	for i, cid := range t.calls {
		if cid != id {
			continue
		}
		if kept == nil {
			if t.outputs[i] != nil {
				return
			}
			mm := *m
			kept = &mm
		}
		t.outputs[i] = kept
	}
}

// Unpaired returns the committed tool calls that have no output yet and
// were not interrupted by an abort (so an output may still come), in call
// order.
func (c *Context) Unpaired() []string {
	// O(turns with such a call), not O(context): the fold keeps their
	// indices as it goes (entries.pending).
	var ids []string
	for _, i := range c.log.pending {
		t := c.log.at(i).turn
		for j, id := range t.calls {
			if t.outputs[j] == nil && t.interrupted[id] == nil {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// LastCalls returns the tool calls of the last committed turn, in call order.
func (c *Context) LastCalls() []string {
	for i := c.log.length() - 1; i >= 0; i-- {
		e := c.log.at(i)
		if e.turn != nil {
			return e.turn.calls
		}
		if e.msg != nil {
			return nil
		}
	}
	return nil
}

// PendingCompaction reports a compaction_begin without its compaction_end
// (its engine died mid-way) and that compaction's reason and mode.
func (c *Context) PendingCompaction() (reason, mode string, ok bool) {
	if !c.Compacting {
		return "", "", false
	}
	return c.compactionBegin.Reason, c.compactionBegin.Mode, true
}

// OpenRequest reports whether a request began and never ended (its engine
// died mid-request).
func (c *Context) OpenRequest() bool { return c.open != nil }

// Len is how many user messages and committed turns the context holds.
func (c *Context) Len() int { return c.log.length() }

// Empty reports whether the context holds no messages.
func (c *Context) Empty() bool { return c.log.length() == 0 && c.Summary == "" }

// Messages returns the model context: the summary (if any), then user
// messages and committed turns in order, each turn's outputs in call order.
// A missing output is given the interrupted placeholder.
//
// The slice is new on every call, the messages are shared: c never changes
// a message once folded, and callers must not change them either.
func (c *Context) Messages() []*omni.Message {
	out := make([]*omni.Message, 0, c.log.length()*2+1)
	if c.Summary != "" {
		m := c.summaryMsg
		if m == nil || c.summaryOf != c.Summary {
			m = new(omni.UserText(omni.Block(omni.TagContextSummary, c.Summary)))
		}
		out = append(out, m)
	}
	add := func(es []entry) {
		for _, e := range es {
			if e.msg != nil {
				out = append(out, e.msg)
				continue
			}
			out = append(out, e.turn.assistant...)
			for i, id := range e.turn.calls {
				switch o := e.turn.outputs[i]; {
				case o != nil:
					out = append(out, o)
				case e.turn.interrupted[id] != nil:
					out = append(out, e.turn.interrupted[id])
				default:
					m := omni.ToolCallOutput(id, omni.InterruptedOutput, omni.StatusAborted)
					out = append(out, &m)
				}
			}
		}
	}
	c.log.read(add)
	return out
}

// Backward yields the messages Messages returns, newest first, without
// building the list: for readers that look at the last few (a Task's
// answer, its title material), at O(1) per message they read.
func (c *Context) Backward() iter.Seq[*omni.Message] {
	return func(yield func(*omni.Message) bool) {
		for i := c.log.length() - 1; i >= 0; i-- {
			e := c.log.at(i)
			if e.msg != nil {
				if !yield(e.msg) {
					return
				}
				continue
			}
			for j := len(e.turn.calls) - 1; j >= 0; j-- {
				o := e.turn.outputs[j]
				if o == nil {
					m := omni.ToolCallOutput(e.turn.calls[j], omni.InterruptedOutput, omni.StatusAborted)
					o = &m
				}
				if !yield(o) {
					return
				}
			}
			for j := len(e.turn.assistant) - 1; j >= 0; j-- {
				if !yield(e.turn.assistant[j]) {
					return
				}
			}
		}
		if c.Summary != "" {
			m := omni.UserText(omni.Block(omni.TagContextSummary, c.Summary))
			yield(&m)
		}
	}
}

// HasCall reports whether a committed tool_call message of the context
// has id (one of the ids CallIDs yields), in O(1) whatever the context's
// length.
func (c *Context) HasCall(id string) bool {
	return c.log.find(id) >= 0 || c.log.findOther(id)
}

// CallIDs yields the ids of the committed tool calls in the context (those
// of the tool_call messages Messages returns), oldest first.
func (c *Context) CallIDs() iter.Seq[string] {
	return func(yield func(string) bool) {
		var ids []string
		c.log.read(func(es []entry) {
			for _, e := range es {
				if e.turn != nil && e.turn.toolCalls > 0 {
					for _, m := range e.turn.assistant {
						if m.Payload.Type == omni.TypeToolCall {
							ids = append(ids, m.Payload.ToolCallID)
						}
					}
				}
			}
		})
		for _, id := range ids {
			if !yield(id) {
				return
			}
		}
	}
}

// ExtractSummary applies the tolerance ladder to a compaction output: the
// first non-empty [summary]…[/summary] pair, else the text with the tags
// stripped, else the whole output.
func ExtractSummary(out string) string {
	const open, closeTag = "[summary]", "[/summary]"
	rest := out
	for {
		i := strings.Index(rest, open)
		if i < 0 {
			break
		}
		rest = rest[i+len(open):]
		j := strings.Index(rest, closeTag)
		if j < 0 {
			break
		}
		if s := strings.TrimSpace(rest[:j]); s != "" {
			return s
		}
		rest = rest[j+len(closeTag):]
	}
	stripped := strings.TrimSpace(strings.NewReplacer(open, "", closeTag, "").Replace(out))
	if stripped != "" {
		return stripped
	}
	return out
}

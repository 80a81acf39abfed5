// Package agui maps a Session's stream to AG-UI 1.0 events (protocol.md §9).
//
// A Mapper is fed one Task's messages of the Session's client stream in
// stream order (from before the Task's task_state running up to its
// task_state idle) and returns, for each message, the AG-UI events it
// yields. It is a pure fold: no clock, no random ids. Message ids are
// derived from stream sequences and tool-call ids are the stream's, so a
// replay of the same messages yields the same events, and every gateway
// replica computes the same thing.
//
// Runs: one Floe Task spans its first AG-UI run and the runs that resume it.
// The Mapper numbers them (Segment, from 1). A run ends with RUN_FINISHED
// at the Task's end (outcome success, or cancelled for an abort), with
// RUN_ERROR for a failed Task, or with the interrupt outcome when an
// approval is pending and nothing is open (no model request, text,
// reasoning or tool call in progress in any lane): the next Segment starts
// at that same message with its RUN_STARTED, re-opening the subagents the
// interrupt suspended. Which message cuts a run is a function of the
// stream alone, so every reader agrees on it.
package agui

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"floe.dev/pkg/omni"
)

// Event is one AG-UI event, marshalled as its JSON object.
type Event map[string]any

// Event types of AG-UI 1.0.
const (
	RunStarted            = "RUN_STARTED"
	RunFinished           = "RUN_FINISHED"
	RunError              = "RUN_ERROR"
	StepStarted           = "STEP_STARTED"
	StepFinished          = "STEP_FINISHED"
	TextMessageStart      = "TEXT_MESSAGE_START"
	TextMessageContent    = "TEXT_MESSAGE_CONTENT"
	TextMessageEnd        = "TEXT_MESSAGE_END"
	ReasoningStart        = "REASONING_START"
	ReasoningMessageStart = "REASONING_MESSAGE_START"
	ReasoningMessageCont  = "REASONING_MESSAGE_CONTENT"
	ReasoningMessageEnd   = "REASONING_MESSAGE_END"
	ReasoningEnd          = "REASONING_END"
	ToolCallStart         = "TOOL_CALL_START"
	ToolCallArgs          = "TOOL_CALL_ARGS"
	ToolCallEnd           = "TOOL_CALL_END"
	ToolCallResult        = "TOOL_CALL_RESULT"
	SubagentStarted       = "SUBAGENT_STARTED"
	SubagentFinished      = "SUBAGENT_FINISHED"
	SubagentError         = "SUBAGENT_ERROR"
)

// InterruptReason is the reason of a pending tool approval's interrupt.
const InterruptReason = "tool_approval"

// Out is one event with its place: the stream sequence of the message it
// comes from, its index among that message's events (Index of Of), and the
// run (Segment) it belongs to.
type Out struct {
	Seq     uint64
	Index   int
	Of      int
	Segment int
	Event   Event
}

// ID is the event's SSE id: <epoch>-<seq>, with :<index> appended when
// its message yields several events.
func (o Out) ID(epoch int64) string {
	if o.Of <= 1 {
		return fmt.Sprintf("%d-%d", epoch, o.Seq)
	}
	return fmt.Sprintf("%d-%d:%d", epoch, o.Seq, o.Index)
}

// Terminal reports whether e ends its run.
func Terminal(e Event) bool {
	t := e["type"]
	return t == RunFinished || t == RunError
}

// lane is the open state of one producer: the Session itself ("") or a
// subagent (its Session id).
type lane struct {
	sub       string
	text      message // the assistant's text
	reasoning message
	tool      string          // open tool call id
	step      string          // open step name (a model request)
	lastText  string          // the assistant text of the current request, parent of its tool calls
	streamed  map[string]bool // tool calls streamed as partials
	subCalls  []string        // run_subagent calls without output yet
}

func (l *lane) quiet() bool {
	return l.text.id == "" && l.reasoning.id == "" && l.tool == "" && l.step == ""
}

// message is a lane's text or reasoning: the message open now, if any, and
// how many complete messages to skip because their partials were streamed.
type message struct {
	kind *messageKind
	id   string // the open message's id, "" when none
	skip int
}

// messageKind says which events a text or a reasoning message is.
type messageKind struct {
	prefix            string // message ids: <prefix>-<seq>
	role              string
	outerStart        string // an event before the message's start, "" for none
	start, delta, end string
	outerEnd          string // an event after the message's end, "" for none
}

var (
	textKind = messageKind{prefix: "msg", role: "assistant",
		start: TextMessageStart, delta: TextMessageContent, end: TextMessageEnd}
	reasoningKind = messageKind{prefix: "reasoning", role: "reasoning", outerStart: ReasoningStart,
		start: ReasoningMessageStart, delta: ReasoningMessageCont, end: ReasoningMessageEnd, outerEnd: ReasoningEnd}
)

type interrupt struct {
	id, name, args, sub string
}

// Mapper folds one Task's messages into AG-UI events. The zero value is
// not usable: use New.
type Mapper struct {
	taskID    string
	started   bool
	done      bool
	segment   int
	lanes     map[string]*lane
	pending   []interrupt     // approvals asked and not decided, in order
	announced map[string]bool // pending approvals already in an interrupt outcome
	active    []string        // subagents started and not finished, outer first
	parentOf  map[string]string
	childOf   map[string]string // run_subagent call (its AG-UI id) → child Session
	out       []Event
}

// New returns a Mapper of the Task taskID.
func New(taskID string) *Mapper {
	return &Mapper{taskID: taskID, lanes: map[string]*lane{}, announced: map[string]bool{},
		parentOf: map[string]string{}, childOf: map[string]string{}}
}

// Segment is the run in progress (0 before the Task started).
func (m *Mapper) Segment() int { return m.segment }

// Done reports whether the Task has ended.
func (m *Mapper) Done() bool { return m.done }

// Started reports whether the Task's task_state running was seen.
func (m *Mapper) Started() bool { return m.started }

// Feed folds one message of the Session's client stream (server marks the
// server class) and returns its events. Messages before the Task's start
// and after its end, and malformed ones, yield nothing.
func (m *Mapper) Feed(seq uint64, server bool, data []byte) []Out {
	if m.done {
		return nil
	}
	var segs []int
	emit := func(e Event) {
		m.out = append(m.out, e)
		segs = append(segs, m.segment)
	}
	m.out = m.out[:0]
	if server {
		m.server(data, emit)
	} else if m.started {
		if msg, err := omni.Decode(data); err == nil {
			m.message(seq, &msg, emit)
			m.maybeCut(emit)
		}
	}
	if len(m.out) == 0 {
		return nil
	}
	outs := make([]Out, len(m.out))
	for i, e := range m.out {
		outs[i] = Out{Seq: seq, Index: i, Of: len(m.out), Segment: segs[i], Event: e}
	}
	return outs
}

func (m *Mapper) lane(sub string) *lane {
	l := m.lanes[sub]
	if l == nil {
		l = &lane{sub: sub, streamed: map[string]bool{},
			text: message{kind: &textKind}, reasoning: message{kind: &reasoningKind}}
		m.lanes[sub] = l
	}
	return l
}

// ev builds an event of lane l (subagentRunId set for a subagent's).
func (l *lane) ev(typ string, kv ...any) Event {
	e := Event{"type": typ}
	for i := 0; i+1 < len(kv); i += 2 {
		e[kv[i].(string)] = kv[i+1]
	}
	if l.sub != "" {
		e["subagentRunId"] = l.sub
	}
	return e
}

func (m *Mapper) server(data []byte, emit func(Event)) {
	var ev omni.ServerEvent
	if json.Unmarshal(data, &ev) != nil {
		return
	}
	switch ev.Type {
	case omni.ServerTaskState:
		if len(ev.Origin) > 0 || ev.TaskID != m.taskID {
			return
		}
		switch {
		case !m.started && ev.State == omni.StateRunning:
			m.started, m.segment = true, 1
			emit(Event{"type": RunStarted})
		case ev.State == omni.StateIdle:
			if !m.started { // cancelled while queued: the run still starts and ends
				m.started, m.segment = true, 1
				emit(Event{"type": RunStarted})
			}
			m.finish(ev.Status, emit)
		}
	case omni.ServerApprovalRequest:
		if !m.started {
			return
		}
		tc, err := omni.Decode(ev.ToolCall)
		if err != nil || tc.Payload.ToolCallID == "" {
			return
		}
		sub := ""
		if n := len(ev.Origin); n > 0 {
			sub = ev.Origin[n-1]
		}
		for _, p := range m.pending {
			if p.id == tc.Payload.ToolCallID {
				return
			}
		}
		m.pending = append(m.pending, interrupt{id: tc.Payload.ToolCallID, name: tc.Payload.Name, args: tc.Payload.Arguments, sub: sub})
		m.maybeCut(emit)
	}
}

// message maps one OmniMessage of the running Task.
func (m *Mapper) message(seq uint64, msg *omni.Message, emit func(Event)) {
	sub := ""
	if n := len(msg.Origin); n > 0 {
		sub = msg.Origin[n-1]
	}
	l := m.lane(sub)
	p := &msg.Payload
	switch p.Type {
	case omni.TypeRequestBegin:
		l.closeAll(emit)
		l.step = fmt.Sprintf("model-request-%d", seq)
		l.lastText = ""
		emit(l.ev(StepStarted, "stepName", l.step))
	case omni.TypeRequestEnd:
		l.closeSegments(emit)
		if l.step != "" {
			emit(l.ev(StepFinished, "stepName", l.step))
			l.step = ""
		}
	case omni.TypePartialText:
		if p.Role == omni.RoleUser {
			return
		}
		l.partial(&l.text, p.EventType, p.Text, seq, emit)
	case omni.TypeText:
		if p.Role != omni.RoleAssistant {
			return // the Prompt, steering and harness inputs: the client's own
		}
		l.complete(&l.text, p.Text, seq, emit)
	case omni.TypePartialThinking:
		l.partial(&l.reasoning, p.EventType, p.Thinking, seq, emit)
	case omni.TypeThinking:
		l.complete(&l.reasoning, p.Thinking, seq, emit)
	case omni.TypePartialToolCall:
		switch p.EventType {
		case omni.EventStart:
			l.endTool(emit)
			l.openTool(p.ToolCallID, p.Name, emit)
			l.toolArgs(p.Arguments, emit)
		case omni.EventDelta:
			if l.tool == "" {
				l.openTool(p.ToolCallID, p.Name, emit)
			}
			l.toolArgs(p.Arguments, emit)
		case omni.EventStop:
			if l.tool != "" {
				l.toolArgs(p.Arguments, emit)
				l.streamed[l.tool] = true
				l.endTool(emit)
			}
		}
	case omni.TypeToolCall:
		if p.Name == "run_subagent" {
			l.subCalls = append(l.subCalls, p.ToolCallID)
		}
		if l.streamed[p.ToolCallID] {
			delete(l.streamed, p.ToolCallID)
			return
		}
		l.endTool(emit)
		l.openTool(p.ToolCallID, p.Name, emit)
		l.toolArgs(p.Arguments, emit)
		l.endTool(emit)
	case omni.TypeToolCallOutput:
		if child, ok := m.childOf[CallID(sub, p.ToolCallID)]; ok {
			delete(m.childOf, CallID(sub, p.ToolCallID))
			m.endSubagent(child, p.Stop() == omni.StatusCompleted, p.Output, emit)
		}
		l.subCalls = slices.DeleteFunc(l.subCalls, func(id string) bool { return id == p.ToolCallID })
		emit(l.ev(ToolCallResult, "messageId", fmt.Sprintf("result-%d", seq), "toolCallId", CallID(sub, p.ToolCallID),
			"content", p.Output, "role", "tool"))
	case omni.TypeSubagent:
		child := p.SessionID
		if child == "" || slices.Contains(m.active, child) {
			return
		}
		e := Event{"type": SubagentStarted, "subagentRunId": child, "name": "run_subagent"}
		if n := len(l.subCalls); n > 0 {
			call := CallID(sub, l.subCalls[n-1])
			e["parentToolCallId"] = call
			m.childOf[call] = child
		}
		if sub != "" {
			e["parentSubagentRunId"] = sub
			m.parentOf[child] = sub
		}
		m.active = append(m.active, child)
		emit(e)
	case omni.TypeApprovalDecision:
		m.pending = slices.DeleteFunc(m.pending, func(i interrupt) bool { return i.id == p.ToolCallID })
		delete(m.announced, p.ToolCallID)
	}
}

// partial maps a partial of message m: a start opens a message (ending
// one left open), a delta extends the open one (opening one if none), a
// stop ends it and the complete message that follows is skipped.
func (l *lane) partial(m *message, ev string, text string, seq uint64, emit func(Event)) {
	switch ev {
	case omni.EventStart:
		l.end(m, emit)
		l.open(m, seq, emit)
		l.delta(m, text, emit)
	case omni.EventDelta:
		if m.id == "" {
			l.open(m, seq, emit)
		}
		l.delta(m, text, emit)
	case omni.EventStop:
		if m.id != "" {
			l.delta(m, text, emit)
			l.end(m, emit)
			m.skip++
		}
	}
}

// complete maps a complete message: its start, content and end, unless
// its partials already streamed it.
func (l *lane) complete(m *message, text string, seq uint64, emit func(Event)) {
	if m.skip > 0 {
		m.skip--
		return
	}
	l.end(m, emit)
	l.open(m, seq, emit)
	l.delta(m, text, emit)
	l.end(m, emit)
}

func (l *lane) open(m *message, seq uint64, emit func(Event)) {
	m.id = fmt.Sprintf("%s-%d", m.kind.prefix, seq)
	if m == &l.text {
		l.lastText = m.id
	}
	if m.kind.outerStart != "" {
		emit(l.ev(m.kind.outerStart, "messageId", m.id))
	}
	emit(l.ev(m.kind.start, "messageId", m.id, "role", m.kind.role))
}

func (l *lane) delta(m *message, s string, emit func(Event)) {
	if s != "" && m.id != "" {
		emit(l.ev(m.kind.delta, "messageId", m.id, "delta", s))
	}
}

func (l *lane) end(m *message, emit func(Event)) {
	if m.id == "" {
		return
	}
	emit(l.ev(m.kind.end, "messageId", m.id))
	if m.kind.outerEnd != "" {
		emit(l.ev(m.kind.outerEnd, "messageId", m.id))
	}
	m.id = ""
}

// CallID is the AG-UI tool-call id of the stream's tool_call_id raw in the
// lane of subagent sub: raw itself for the Session's own calls, and
// "<sub>:<raw>" for a subagent's (each Session numbers its calls on its
// own, and AG-UI's ids are one space per run).
func CallID(sub, raw string) string {
	if sub == "" {
		return raw
	}
	return sub + ":" + raw
}

// RawCallID undoes CallID: the stream's tool_call_id of an AG-UI id.
func RawCallID(id string) string {
	if sub, raw, ok := strings.Cut(id, ":"); ok && strings.HasPrefix(sub, "session-") {
		return raw
	}
	return id
}

func (l *lane) openTool(id, name string, emit func(Event)) {
	if id == "" {
		id = "call-unnamed"
	}
	l.tool = id
	e := l.ev(ToolCallStart, "toolCallId", CallID(l.sub, id), "toolCallName", name)
	if l.lastText != "" {
		e["parentMessageId"] = l.lastText
	}
	emit(e)
}

func (l *lane) toolArgs(s string, emit func(Event)) {
	if s != "" && l.tool != "" {
		emit(l.ev(ToolCallArgs, "toolCallId", CallID(l.sub, l.tool), "delta", s))
	}
}

func (l *lane) endTool(emit func(Event)) {
	if l.tool != "" {
		emit(l.ev(ToolCallEnd, "toolCallId", CallID(l.sub, l.tool)))
		l.tool = ""
	}
}

// closeSegments ends the lane's open text, reasoning and tool call.
func (l *lane) closeSegments(emit func(Event)) {
	l.end(&l.text, emit)
	l.end(&l.reasoning, emit)
	l.endTool(emit)
}

// closeAll also finishes the lane's open step.
func (l *lane) closeAll(emit func(Event)) {
	l.closeSegments(emit)
	if l.step != "" {
		emit(l.ev(StepFinished, "stepName", l.step))
		l.step = ""
	}
}

// endSubagent finishes child (and the subagents it started).
func (m *Mapper) endSubagent(child string, ok bool, output string, emit func(Event)) {
	if !slices.Contains(m.active, child) {
		return
	}
	for _, grand := range slices.Clone(m.active) {
		if m.parentOf[grand] == child {
			m.endSubagent(grand, ok, "", emit)
		}
	}
	if l := m.lanes[child]; l != nil {
		l.closeAll(emit)
	}
	m.active = slices.DeleteFunc(m.active, func(s string) bool { return s == child })
	if ok {
		emit(Event{"type": SubagentFinished, "subagentRunId": child, "outcome": map[string]any{"type": "success"}})
		return
	}
	msg := output
	if msg == "" {
		msg = "the subagent did not complete"
	}
	emit(Event{"type": SubagentError, "subagentRunId": child, "message": msg})
}

// finish ends the Task: everything open is closed, then the run's last
// event.
func (m *Mapper) finish(status string, emit func(Event)) {
	for _, l := range m.sortedLanes() {
		l.closeAll(emit)
	}
	for i := len(m.active) - 1; i >= 0; i-- {
		child := m.active[i]
		if status == omni.StatusCompleted {
			emit(Event{"type": SubagentFinished, "subagentRunId": child, "outcome": map[string]any{"type": "success"}})
		} else {
			emit(Event{"type": SubagentError, "subagentRunId": child, "message": "the task ended " + statusOr(status)})
		}
	}
	m.active = nil
	m.done = true
	switch status {
	case omni.StatusCompleted, "":
		emit(Event{"type": RunFinished, "outcome": map[string]any{"type": "success"}})
	case omni.StatusAborted:
		emit(Event{"type": RunFinished, "outcome": map[string]any{"type": "cancelled"}})
	default:
		emit(Event{"type": RunError, "message": "the task ended " + status, "code": status})
	}
}

func statusOr(s string) string {
	if s == "" {
		return "without a status"
	}
	return s
}

// sortedLanes returns the lanes in a fixed order: the Session's own first,
// then subagents innermost first as they were started (reverse).
func (m *Mapper) sortedLanes() []*lane {
	var out []*lane
	for i := len(m.active) - 1; i >= 0; i-- {
		if l := m.lanes[m.active[i]]; l != nil {
			out = append(out, l)
		}
	}
	var rest []string
	for k := range m.lanes {
		if k != "" && !slices.Contains(m.active, k) {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	for _, k := range rest {
		out = append(out, m.lanes[k])
	}
	if l := m.lanes[""]; l != nil {
		out = append(out, l)
	}
	return out
}

// maybeCut ends the run with the interrupt outcome when an approval not yet
// announced is pending and nothing is open, and starts the next run.
func (m *Mapper) maybeCut(emit func(Event)) {
	if !m.started || m.done {
		return
	}
	var fresh []interrupt
	for _, p := range m.pending {
		if !m.announced[p.id] {
			fresh = append(fresh, p)
		}
	}
	if len(fresh) == 0 {
		return
	}
	for _, l := range m.lanes {
		if !l.quiet() {
			return
		}
	}
	ids := make([]string, len(fresh))
	ints := make([]any, len(fresh))
	for i, p := range fresh {
		m.announced[p.id] = true
		id := CallID(p.sub, p.id)
		ids[i] = id
		in := map[string]any{"id": id, "reason": InterruptReason, "toolCallId": id,
			"message":  "approve the tool call " + p.name + "?",
			"payload":  map[string]any{"name": p.name, "arguments": p.args},
			"metadata": map[string]any{"name": p.name, "arguments": p.args}}
		if p.sub != "" {
			in["subagentRunId"] = p.sub
		}
		ints[i] = in
	}
	for i := len(m.active) - 1; i >= 0; i-- {
		emit(Event{"type": SubagentFinished, "subagentRunId": m.active[i],
			"outcome": map[string]any{"type": "suspended", "interruptIds": ids}})
	}
	emit(Event{"type": RunFinished, "outcome": map[string]any{"type": "interrupt", "interrupts": ints}})
	m.segment++
	emit(Event{"type": RunStarted})
	for _, child := range m.active {
		e := Event{"type": SubagentStarted, "subagentRunId": child, "name": "run_subagent"}
		for call, c := range m.childOf {
			if c == child {
				e["parentToolCallId"] = call
			}
		}
		if p := m.parentOf[child]; p != "" {
			e["parentSubagentRunId"] = p
		}
		emit(e)
	}
}

package agui

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"floe.dev/pkg/omni"
)

// msg is one stream message of a test Session.
type msg struct {
	server bool
	data   []byte
}

func model(t *testing.T, p omni.Payload, origin ...string) msg {
	t.Helper()
	m := omni.Model(p)
	if len(origin) > 0 {
		m.Origin = origin
	}
	b, err := omni.Marshal(&m)
	if err != nil {
		t.Fatal(err)
	}
	return msg{data: b}
}

func event(t *testing.T, p omni.Payload, origin ...string) msg {
	t.Helper()
	m := omni.Event(p)
	if len(origin) > 0 {
		m.Origin = origin
	}
	b, err := omni.Marshal(&m)
	if err != nil {
		t.Fatal(err)
	}
	return msg{data: b}
}

func srv(t *testing.T, ev omni.ServerEvent) msg {
	t.Helper()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return msg{server: true, data: b}
}

func partial(t *testing.T, typ, et, field, text string, origin ...string) msg {
	p := omni.Payload{Type: typ, Role: omni.RoleAssistant, EventType: et}
	switch field {
	case "text":
		p.Text = text
	case "thinking":
		p.Thinking = text
	}
	return model(t, p, origin...)
}

func approvalReq(t *testing.T, id, name, args string, origin ...string) msg {
	tc := omni.Model(omni.Payload{Type: omni.TypeToolCall, Role: omni.RoleAssistant, Name: name, Arguments: args, ToolCallID: id})
	raw, err := omni.Marshal(&tc)
	if err != nil {
		t.Fatal(err)
	}
	return srv(t, omni.ServerEvent{Type: omni.ServerApprovalRequest, ToolCall: raw, Origin: origin})
}

// approvalTask is a Task with thinking, text, a tool call asked about
// (the request ends while it is pending), its approval, output and answer.
func approvalTask(t *testing.T) []msg {
	return []msg{
		srv(t, omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateRunning, TaskID: "task-other"}),
		srv(t, omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateRunning, TaskID: "task-1"}),
		model(t, omni.Payload{Type: omni.TypeText, Role: omni.RoleUser, Text: "list it"}),
		event(t, omni.Payload{Type: omni.TypeRequestBegin}),
		partial(t, omni.TypePartialThinking, omni.EventStart, "thinking", "hmm "),
		partial(t, omni.TypePartialThinking, omni.EventStop, "thinking", ""),
		model(t, omni.Payload{Type: omni.TypeThinking, Role: omni.RoleAssistant, Thinking: "hmm "}),
		partial(t, omni.TypePartialText, omni.EventStart, "text", ""),
		partial(t, omni.TypePartialText, omni.EventDelta, "text", "Let me "),
		partial(t, omni.TypePartialText, omni.EventDelta, "text", "look."),
		partial(t, omni.TypePartialText, omni.EventStop, "text", ""),
		model(t, omni.Payload{Type: omni.TypeText, Role: omni.RoleAssistant, Text: "Let me look."}),
		model(t, omni.Payload{Type: omni.TypePartialToolCall, Role: omni.RoleAssistant, EventType: omni.EventStart, Name: "exec_command", ToolCallID: "call_1"}),
		model(t, omni.Payload{Type: omni.TypePartialToolCall, Role: omni.RoleAssistant, EventType: omni.EventDelta, Arguments: `{"cmd":"ls"}`, ToolCallID: "call_1"}),
		model(t, omni.Payload{Type: omni.TypePartialToolCall, Role: omni.RoleAssistant, EventType: omni.EventStop, ToolCallID: "call_1"}),
		model(t, omni.Payload{Type: omni.TypeToolCall, Role: omni.RoleAssistant, Name: "exec_command", Arguments: `{"cmd":"ls"}`, ToolCallID: "call_1"}),
		approvalReq(t, "call_1", "exec_command", `{"cmd":"ls"}`),
		event(t, omni.Payload{Type: omni.TypeTokenUsage}),
		event(t, omni.Payload{Type: omni.TypeRequestEnd, Status: omni.StatusCompleted}), // the cut: nothing open, call_1 pending
		event(t, omni.Payload{Type: omni.TypeApprovalDecision, Decision: omni.DecisionAllow, ToolCallID: "call_1"}),
		model(t, omni.Payload{Type: omni.TypeToolCallOutput, Role: omni.RoleUser, Output: "a.txt\n", ToolCallID: "call_1"}),
		event(t, omni.Payload{Type: omni.TypeRequestBegin}),
		model(t, omni.Payload{Type: omni.TypeText, Role: omni.RoleAssistant, Text: "One file."}),
		event(t, omni.Payload{Type: omni.TypeRequestEnd, Status: omni.StatusCompleted}),
		srv(t, omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateIdle, Status: omni.StatusCompleted, TaskID: "task-1"}),
		model(t, omni.Payload{Type: omni.TypeText, Role: omni.RoleAssistant, Text: "after the end"}),
	}
}

func feedAll(m *Mapper, msgs []msg) []Out {
	var outs []Out
	for i, x := range msgs {
		outs = append(outs, m.Feed(uint64(i+1), x.server, x.data)...)
	}
	return outs
}

func types(outs []Out, segment int) string {
	var s []string
	for _, o := range outs {
		if o.Segment == segment {
			s = append(s, o.Event["type"].(string))
		}
	}
	return strings.Join(s, " ")
}

func TestMapperSplitsATaskIntoRunsAtAPendingApproval(t *testing.T) {
	outs := feedAll(New("task-1"), approvalTask(t))
	want1 := "RUN_STARTED STEP_STARTED REASONING_START REASONING_MESSAGE_START REASONING_MESSAGE_CONTENT REASONING_MESSAGE_END REASONING_END " +
		"TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END " +
		"TOOL_CALL_START TOOL_CALL_ARGS TOOL_CALL_END STEP_FINISHED RUN_FINISHED"
	if got := types(outs, 1); got != want1 {
		t.Errorf("run 1 = %s\nwant %s", got, want1)
	}
	want2 := "RUN_STARTED TOOL_CALL_RESULT STEP_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END STEP_FINISHED RUN_FINISHED"
	if got := types(outs, 2); got != want2 {
		t.Errorf("run 2 = %s\nwant %s", got, want2)
	}
	var cut, end Event
	for _, o := range outs {
		if o.Event["type"] == RunFinished {
			if o.Segment == 1 {
				cut = o.Event
			} else {
				end = o.Event
			}
		}
	}
	outcome, _ := cut["outcome"].(map[string]any)
	ints, _ := outcome["interrupts"].([]any)
	if outcome["type"] != "interrupt" || len(ints) != 1 {
		t.Fatalf("run 1 ends with %v, want the interrupt outcome with one interrupt", cut)
	}
	in := ints[0].(map[string]any)
	if in["id"] != "call_1" || in["toolCallId"] != "call_1" || in["reason"] != InterruptReason ||
		!reflect.DeepEqual(in["payload"], map[string]any{"name": "exec_command", "arguments": `{"cmd":"ls"}`}) {
		t.Errorf("interrupt = %v", in)
	}
	if o, _ := end["outcome"].(map[string]any); o["type"] != "success" {
		t.Errorf("run 2 ends with %v, want outcome success", end)
	}
	// The tool call hangs off the text that precedes it.
	for _, o := range outs {
		if o.Event["type"] == ToolCallStart && o.Event["parentMessageId"] != "msg-8" {
			t.Errorf("TOOL_CALL_START = %v, want parentMessageId msg-8 (the streamed text's start)", o.Event)
		}
	}
}

func TestMapperIDsAreStreamPositions(t *testing.T) {
	outs := feedAll(New("task-1"), approvalTask(t))
	seen := map[string]bool{}
	for _, o := range outs {
		id := o.ID(42)
		if seen[id] {
			t.Fatalf("id %s given twice", id)
		}
		seen[id] = true
		if o.Of == 1 && id != "42-"+itoa(o.Seq) {
			t.Errorf("single event id = %s, want 42-%d", id, o.Seq)
		}
	}
	// The cut message (request_end, seq 19) yields the step's end, the
	// interrupt and the next run's start: three ids with :k.
	var ids []string
	for _, o := range outs {
		if o.Seq == 19 {
			ids = append(ids, o.ID(42))
		}
	}
	if want := []string{"42-19:0", "42-19:1", "42-19:2"}; !reflect.DeepEqual(ids, want) {
		t.Errorf("ids of the cut message = %v, want %v", ids, want)
	}
	// A replay of the same messages gives the same events.
	again := feedAll(New("task-1"), approvalTask(t))
	if !reflect.DeepEqual(outs, again) {
		t.Errorf("a replay differs from the first fold")
	}
}

func itoa(n uint64) string { b, _ := json.Marshal(n); return string(b) }

func TestMapperEndsRuns(t *testing.T) {
	base := []msg{
		srv(t, omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateRunning, TaskID: "task-1"}),
		event(t, omni.Payload{Type: omni.TypeRequestBegin}),
		partial(t, omni.TypePartialText, omni.EventStart, "text", "Work"),
		model(t, omni.Payload{Type: omni.TypePartialToolCall, Role: omni.RoleAssistant, EventType: omni.EventStart, Name: "x", ToolCallID: "c"}),
	}
	tests := []struct {
		status string
		last   Event
	}{
		{omni.StatusAborted, Event{"type": RunFinished, "outcome": map[string]any{"type": "cancelled"}}},
		{omni.StatusFailed, Event{"type": RunError, "message": "the task ended failed", "code": "failed"}},
		{omni.StatusCompleted, Event{"type": RunFinished, "outcome": map[string]any{"type": "success"}}},
	}
	for _, tt := range tests {
		m := New("task-1")
		outs := feedAll(m, append(base[:len(base):len(base)],
			srv(t, omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateIdle, Status: tt.status, TaskID: "task-1"})))
		got := types(outs, 1)
		want := "RUN_STARTED STEP_STARTED TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TOOL_CALL_START TEXT_MESSAGE_END TOOL_CALL_END STEP_FINISHED " + tt.last["type"].(string)
		if got != want {
			t.Errorf("%s: %s\nwant %s", tt.status, got, want)
		}
		if last := outs[len(outs)-1].Event; !reflect.DeepEqual(last, tt.last) {
			t.Errorf("%s: last event %v, want %v", tt.status, last, tt.last)
		}
		if !m.Done() {
			t.Errorf("%s: not done after the Task's end", tt.status)
		}
	}
}

func TestMapperEndsATaskCancelledWhileQueued(t *testing.T) {
	m := New("task-1")
	outs := feedAll(m, []msg{srv(t, omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateIdle, Status: omni.StatusAborted, TaskID: "task-1"})})
	if got := types(outs, 1); got != "RUN_STARTED RUN_FINISHED" || !m.Done() {
		t.Errorf("a Task cancelled before it ran: %s (done %v), want RUN_STARTED RUN_FINISHED", got, m.Done())
	}
}

func TestMapperSubagents(t *testing.T) {
	child := "session-child"
	msgs := []msg{
		srv(t, omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateRunning, TaskID: "task-1"}),
		event(t, omni.Payload{Type: omni.TypeRequestBegin}),
		model(t, omni.Payload{Type: omni.TypeToolCall, Role: omni.RoleAssistant, Name: "run_subagent", Arguments: `{}`, ToolCallID: "sub_1"}),
		event(t, omni.Payload{Type: omni.TypeRequestEnd, Status: omni.StatusCompleted}),
		event(t, omni.Payload{Type: omni.TypeSubagent, SessionID: child}),
		event(t, omni.Payload{Type: omni.TypeRequestBegin}, child),
		model(t, omni.Payload{Type: omni.TypeToolCall, Role: omni.RoleAssistant, Name: "write_file", Arguments: `{}`, ToolCallID: "w_1"}, child),
		event(t, omni.Payload{Type: omni.TypeRequestEnd, Status: omni.StatusCompleted}, child),
		approvalReq(t, "w_1", "write_file", `{}`, child),
		event(t, omni.Payload{Type: omni.TypeApprovalDecision, Decision: omni.DecisionDeny, ToolCallID: "w_1"}, child),
		model(t, omni.Payload{Type: omni.TypeToolCallOutput, Role: omni.RoleUser, Output: "Tool call denied by user.", ToolCallID: "w_1", StopReason: omni.StatusAborted}, child),
		model(t, omni.Payload{Type: omni.TypeText, Role: omni.RoleAssistant, Text: "could not"}, child),
		model(t, omni.Payload{Type: omni.TypeToolCallOutput, Role: omni.RoleUser, Output: "could not", ToolCallID: "sub_1"}),
		srv(t, omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateIdle, Status: omni.StatusCompleted, TaskID: "task-1"}),
	}
	outs := feedAll(New("task-1"), msgs)
	want1 := "RUN_STARTED STEP_STARTED TOOL_CALL_START TOOL_CALL_ARGS TOOL_CALL_END STEP_FINISHED SUBAGENT_STARTED STEP_STARTED TOOL_CALL_START TOOL_CALL_ARGS TOOL_CALL_END STEP_FINISHED SUBAGENT_FINISHED RUN_FINISHED"
	if got := types(outs, 1); got != want1 {
		t.Errorf("run 1 = %s\nwant %s", got, want1)
	}
	want2 := "RUN_STARTED SUBAGENT_STARTED TOOL_CALL_RESULT TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END SUBAGENT_FINISHED TOOL_CALL_RESULT RUN_FINISHED"
	if got := types(outs, 2); got != want2 {
		t.Errorf("run 2 = %s\nwant %s", got, want2)
	}
	for _, o := range outs {
		e := o.Event
		switch e["type"] {
		case SubagentStarted:
			if e["subagentRunId"] != child || e["parentToolCallId"] != "sub_1" {
				t.Errorf("SUBAGENT_STARTED = %v", e)
			}
		case ToolCallStart:
			if o.Seq == 7 && e["toolCallId"] != child+":w_1" {
				t.Errorf("the child's TOOL_CALL_START = %v, want its id in the child's namespace", e)
			}
		case TextMessageStart, StepStarted:
			if o.Seq >= 6 && o.Seq <= 12 && e["subagentRunId"] != child {
				t.Errorf("the child's %v has no subagentRunId", e)
			}
		case SubagentFinished:
			if o.Segment == 1 {
				oc := e["outcome"].(map[string]any)
				if oc["type"] != "suspended" || !reflect.DeepEqual(oc["interruptIds"], []string{child + ":w_1"}) {
					t.Errorf("the cut's SUBAGENT_FINISHED = %v, want suspended on w_1", e)
				}
			}
		}
	}
}

// Each Session numbers its tool calls on its own: a child's call with the
// parent's id is the child's, and its output does not end the subagent.
func TestMapperKeepsTheChildsCallIDsApart(t *testing.T) {
	child := "session-child"
	msgs := []msg{
		srv(t, omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateRunning, TaskID: "task-1"}),
		model(t, omni.Payload{Type: omni.TypeToolCall, Role: omni.RoleAssistant, Name: "run_subagent", Arguments: `{}`, ToolCallID: "sub"}),
		event(t, omni.Payload{Type: omni.TypeSubagent, SessionID: child}),
		model(t, omni.Payload{Type: omni.TypeToolCall, Role: omni.RoleAssistant, Name: "run_subagent", Arguments: `{}`, ToolCallID: "sub"}, child),
		model(t, omni.Payload{Type: omni.TypeToolCallOutput, Role: omni.RoleUser, Output: "too deep", ToolCallID: "sub", StopReason: omni.StatusFailed}, child),
		model(t, omni.Payload{Type: omni.TypeToolCallOutput, Role: omni.RoleUser, Output: "done", ToolCallID: "sub"}),
		srv(t, omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateIdle, Status: omni.StatusCompleted, TaskID: "task-1"}),
	}
	outs := feedAll(New("task-1"), msgs)
	want := "RUN_STARTED TOOL_CALL_START TOOL_CALL_ARGS TOOL_CALL_END SUBAGENT_STARTED TOOL_CALL_START TOOL_CALL_ARGS TOOL_CALL_END TOOL_CALL_RESULT SUBAGENT_FINISHED TOOL_CALL_RESULT RUN_FINISHED"
	if got := types(outs, 1); got != want {
		t.Errorf("events = %s\nwant %s", got, want)
	}
	for _, o := range outs {
		if o.Seq == 5 && o.Event["toolCallId"] != child+":sub" {
			t.Errorf("the child's result = %v, want toolCallId %s:sub", o.Event, child)
		}
	}
}

func TestCallIDRoundTrips(t *testing.T) {
	for _, c := range []struct{ sub, raw string }{{"", "call_1"}, {"session-x", "call_1"}, {"session-x", "a:b"}, {"", "toolu:9"}} {
		if got := RawCallID(CallID(c.sub, c.raw)); got != c.raw {
			t.Errorf("RawCallID(CallID(%q, %q)) = %q", c.sub, c.raw, got)
		}
	}
}

func TestMapperIgnoresOtherTasksAndGarbage(t *testing.T) {
	m := New("task-1")
	for i, data := range [][]byte{nil, []byte("{"), []byte(`{"type":"task_state","state":"running","taskId":"task-2"}`), []byte(`[]`)} {
		if outs := m.Feed(uint64(i+1), true, data); outs != nil {
			t.Errorf("Feed(%q) = %v, want nothing", data, outs)
		}
		if outs := m.Feed(uint64(i+1), false, data); outs != nil {
			t.Errorf("Feed(%q) = %v, want nothing", data, outs)
		}
	}
	if m.Started() {
		t.Errorf("started by another Task's task_state")
	}
}

func TestParseInput(t *testing.T) {
	tests := []struct {
		name, body string
		wantErr    string
		prompt     []Part
	}{
		{"first run", `{"threadId":"t","runId":"r","messages":[{"id":"u1","role":"user","content":"hi"}],"tools":[],"context":[],"state":{},"forwardedProps":{}}`, "", []Part{{Text: "hi"}}},
		{"continued thread", `{"threadId":"t","runId":"r2","messages":[{"id":"u1","role":"user","content":"hi"},{"id":"a","role":"assistant","content":"yo"},{"id":"u2","role":"user","content":[{"type":"text","text":"more"},{"type":"image","source":{"type":"url","value":"http://x/i.png"}}]}]}`, "", []Part{{Text: "more"}, {ImageURL: "http://x/i.png"}}},
		{"resume only", `{"threadId":"t","runId":"r3","messages":[],"resume":[{"interruptId":"c1","status":"resolved","payload":{"decision":"deny"}}]}`, "", nil},
		{"not json", `{`, "malformed RunAgentInput", nil},
		{"array", `[]`, "malformed RunAgentInput", nil},
		{"no threadId", `{"runId":"r","messages":[]}`, "threadId is missing", nil},
		{"threadId not a string", `{"threadId":7,"runId":"r"}`, "threadId is not a string", nil},
		{"empty runId", `{"threadId":"t","runId":""}`, "runId must be", nil},
		{"messages not an array", `{"threadId":"t","runId":"r","messages":{}}`, "messages is not an array", nil},
		{"message without id", `{"threadId":"t","runId":"r","messages":[{"role":"user","content":"x"}]}`, "needs an id and a role", nil},
		{"bad resume status", `{"threadId":"t","runId":"r","resume":[{"interruptId":"c","status":"maybe"}]}`, "is not resolved or cancelled", nil},
		{"bad decision", `{"threadId":"t","runId":"r","resume":[{"interruptId":"c","status":"resolved","payload":{"decision":"perhaps"}}]}`, "is not allow or deny", nil},
		{"bad content part", `{"threadId":"t","runId":"r","messages":[{"id":"u","role":"user","content":[{"type":"audio","source":{"type":"url","value":"x"}}]}]}`, "", nil},
	}
	for _, tt := range tests {
		in, err := ParseInput([]byte(tt.body))
		if tt.wantErr != "" {
			if err == nil || !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: ParseInput = %v, want an error with %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: ParseInput: %v", tt.name, err)
			continue
		}
		parts, err := in.Prompt()
		if tt.name == "bad content part" {
			if err == nil {
				t.Errorf("%s: Prompt accepted an audio part", tt.name)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(parts, tt.prompt) {
			t.Errorf("%s: Prompt = %v, %v; want %v", tt.name, parts, err, tt.prompt)
		}
	}
}

func TestResumeDecision(t *testing.T) {
	for _, tt := range []struct {
		r    Resume
		want string
	}{
		{Resume{InterruptID: "c", Status: "resolved"}, "allow"},
		{Resume{InterruptID: "c", Status: "resolved", Payload: json.RawMessage(`{"decision":"allow"}`)}, "allow"},
		{Resume{InterruptID: "c", Status: "resolved", Payload: json.RawMessage(`{"decision":"deny"}`)}, "deny"},
		{Resume{InterruptID: "c", Status: "cancelled"}, "deny"},
	} {
		if got, err := tt.r.Decision(); err != nil || got != tt.want {
			t.Errorf("Decision(%+v) = %q, %v; want %q", tt.r, got, err, tt.want)
		}
	}
}

func FuzzParseInput(f *testing.F) {
	f.Add([]byte(`{"threadId":"t","runId":"r","messages":[{"id":"u1","role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"threadId":"t","runId":"r","messages":[{"id":"u","role":"user","content":[{"type":"image","source":{"type":"data","value":"AA==","mimeType":"image/png"}}]}],"resume":[{"interruptId":"c","status":"cancelled"}]}`))
	f.Add([]byte(`{"threadId":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := ParseInput(b)
		if err != nil {
			if !errors.Is(err, ErrInput) {
				t.Fatalf("error %v does not wrap ErrInput", err)
			}
			return
		}
		if in.ThreadID == "" || in.RunID == "" {
			t.Fatalf("accepted an input without thread or run id")
		}
		in.Prompt()
		for _, r := range in.Resume {
			if d, err := r.Decision(); err != nil || (d != "allow" && d != "deny") {
				t.Fatalf("accepted resume %+v gives %q, %v", r, d, err)
			}
		}
	})
}

func FuzzMapper(f *testing.F) {
	f.Add([]byte(`{"type":"task_state","state":"running","taskId":"task-1"}`), []byte(`{"timestamp":"2026-01-01T00:00:00.000Z","type":"model_msg","payload":{"type":"partial_text","role":"assistant","event_type":"start","text":"x"}}`), true)
	f.Fuzz(func(t *testing.T, a, b []byte, server bool) {
		m := New("task-1")
		m.Feed(1, true, a)
		m.Feed(2, server, b)
		m.Feed(3, true, []byte(`{"type":"task_state","state":"idle","status":"completed","taskId":"task-1"}`))
	})
}

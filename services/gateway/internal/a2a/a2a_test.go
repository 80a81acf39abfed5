package a2a

import (
	"encoding/json"
	"testing"

	"floe.dev/pkg/omni"
)

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name, body string
		code       int // 0: accepted
		id         string
	}{
		{"send", `{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{}}`, 0, "1"},
		{"subscribe", `{"jsonrpc":"2.0","id":"x","method":"SubscribeToTask","params":{"id":"t"}}`, 0, `"x"`},
		{"not json", `{"jsonrpc":`, CodeParseError, ""},
		{"empty", ``, CodeParseError, ""},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"GetTask"}]`, CodeInvalidRequest, ""},
		{"wrong version", `{"jsonrpc":"1.0","id":2,"method":"GetTask"}`, CodeInvalidRequest, "2"},
		{"no method", `{"jsonrpc":"2.0","id":3}`, CodeInvalidRequest, "3"},
		{"method not a string", `{"jsonrpc":"2.0","id":4,"method":7}`, CodeInvalidRequest, ""},
		{"unknown method", `{"jsonrpc":"2.0","id":5,"method":"message/send"}`, CodeMethodNotFound, "5"},
		{"unsupported", `{"jsonrpc":"2.0","id":6,"method":"CreateTaskPushNotificationConfig"}`, CodeUnsupported, "6"},
	}
	for _, tt := range tests {
		req, err := ParseRequest([]byte(tt.body))
		switch {
		case tt.code == 0 && err != nil:
			t.Errorf("%s: ParseRequest = %v, want accepted", tt.name, err)
		case tt.code != 0 && (err == nil || err.Code != tt.code):
			t.Errorf("%s: ParseRequest error = %v, want code %d", tt.name, err, tt.code)
		}
		if tt.id != "" && (req == nil || string(req.ID) != tt.id) {
			t.Errorf("%s: id = %v, want %s (kept for the error's answer)", tt.name, req, tt.id)
		}
	}
}

func TestReplyForms(t *testing.T) {
	b, _ := json.Marshal(Reply(nil, nil, Errorf(CodeMethodNotFound, "nope")))
	if string(b) != `{"jsonrpc":"2.0","id":null,"error":{"code":-32601,"message":"nope"}}` {
		t.Errorf("error reply = %s", b)
	}
	b, _ = json.Marshal(Reply(json.RawMessage("7"), StreamResult{StatusUpdate: &StatusUpdate{TaskID: "t", ContextID: "c", Status: Status{State: StateWorking}}}, nil))
	if string(b) != `{"jsonrpc":"2.0","id":7,"result":{"statusUpdate":{"taskId":"t","contextId":"c","status":{"state":"TASK_STATE_WORKING"}}}}` {
		t.Errorf("result reply = %s", b)
	}
}

func TestDecisionAndInputs(t *testing.T) {
	allow, deny, other := "allow", " DENY ", "maybe"
	for _, tt := range []struct {
		m    Message
		want string
		ok   bool
	}{
		{Message{Parts: []Part{{Data: json.RawMessage(`{"decision":"allow"}`)}}}, "allow", true},
		{Message{Parts: []Part{{Text: &deny}}}, "deny", true},
		{Message{Parts: []Part{{Text: &allow}}}, "allow", true},
		{Message{Parts: []Part{{Text: &other}}}, "", false},
		{Message{Parts: []Part{{Data: json.RawMessage(`{"decision":"later"}`)}}}, "", false},
	} {
		got, err := Decision(&tt.m)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("Decision(%s) = %q, %v; want %q", mustJSON(tt.m), got, err, tt.want)
		}
	}
	ins, err := Inputs(&Message{Parts: []Part{TextPart("hi"), {Data: json.RawMessage(`{"a":1}`)}, {URL: "http://x/i.png", MediaType: "image/png"}}})
	if err != nil || len(ins) != 3 || ins[0].Text != "hi" || ins[1].Text != `{"a":1}` || ins[2].ImageURL != "http://x/i.png" {
		t.Errorf("Inputs = %+v, %v", ins, err)
	}
	if _, err := Inputs(&Message{Parts: []Part{{URL: "http://x/a.pdf", MediaType: "application/pdf"}}}); err == nil || err.Code != CodeContentType {
		t.Errorf("Inputs(pdf) = %v, want content type not supported", err)
	}
	if err := CheckMessage(&Message{MessageID: "m", Role: RoleAgent, Parts: []Part{TextPart("x")}}); err == nil || err.Code != CodeInvalidParams {
		t.Errorf("CheckMessage(agent role) = %v, want invalid params", err)
	}
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

func feed(f *Folder, seq uint64, server bool, v any) []StreamResult {
	var b []byte
	if m, ok := v.(omni.Message); ok {
		b, _ = omni.Marshal(&m)
	} else {
		b, _ = json.Marshal(v)
	}
	return f.Feed(seq, server, b)
}

func TestFolderBuildsTheTaskFromTheStream(t *testing.T) {
	f := NewFolder("task-1", "session-1")
	if f.State() != StateSubmitted {
		t.Fatalf("new task state %s", f.State())
	}
	tc := omni.Model(omni.Payload{Type: omni.TypeToolCall, Role: omni.RoleAssistant, Name: "exec_command", Arguments: `{"cmd":"ls"}`, ToolCallID: "c1"})
	raw, _ := omni.Marshal(&tc)
	steps := []struct {
		server bool
		v      any
		want   string // the update's kind and state or text
	}{
		{true, omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateRunning, TaskID: "task-1"}, "status " + StateWorking},
		{false, omni.UserText("do it"), ""},
		{false, omni.Model(omni.Payload{Type: omni.TypePartialText, Role: omni.RoleAssistant, EventType: omni.EventStart}), "artifact= "},
		{false, omni.Model(omni.Payload{Type: omni.TypePartialText, Role: omni.RoleAssistant, EventType: omni.EventDelta, Text: "Look"}), "artifact+ Look"},
		{false, omni.Model(omni.Payload{Type: omni.TypePartialText, Role: omni.RoleAssistant, EventType: omni.EventStop}), ""},
		{false, omni.Model(omni.Payload{Type: omni.TypeText, Role: omni.RoleAssistant, Text: "Look"}), ""},
		{true, omni.ServerEvent{Type: omni.ServerApprovalRequest, ToolCall: raw}, "status " + StateInputRequired},
		{false, omni.ApprovalDecision(omni.DecisionAllow, "c1"), "status " + StateWorking},
		{false, omni.Model(omni.Payload{Type: omni.TypeText, Role: omni.RoleAssistant, Text: "Done."}), "artifact= Done."},
		{true, omni.ServerEvent{Type: omni.ServerTaskState, State: omni.StateIdle, Status: omni.StatusCompleted, TaskID: "task-1"}, "status " + StateCompleted},
		{false, omni.Model(omni.Payload{Type: omni.TypeText, Role: omni.RoleAssistant, Text: "late"}), ""},
	}
	for i, st := range steps {
		ups := feed(f, uint64(i+1), st.server, st.v)
		got := ""
		if len(ups) == 1 {
			switch u := ups[0]; {
			case u.StatusUpdate != nil:
				got = "status " + u.StatusUpdate.Status.State
			case u.ArtifactUpdate != nil:
				op := "="
				if u.ArtifactUpdate.Append {
					op = "+"
				}
				got = "artifact" + op + " " + *u.ArtifactUpdate.Artifact.Parts[0].Text
			}
		} else if len(ups) > 1 {
			got = "several"
		}
		if got != st.want {
			t.Errorf("step %d: update %q, want %q", i, got, st.want)
		}
	}
	task := f.Task()
	if task.Status.State != StateCompleted || len(task.Artifacts) != 1 || *task.Artifacts[0].Parts[0].Text != "Done." {
		t.Errorf("final task = %s", mustJSON(task))
	}
	if len(task.History) != 3 || task.History[0].Role != RoleUser || *task.History[0].Parts[0].Text != "do it" ||
		task.History[1].Role != RoleAgent || task.History[1].MessageID != "approval-c1" ||
		task.History[2].Role != RoleUser || string(task.History[2].Parts[0].Data) != `{"decision":"allow","toolCallId":"c1"}` {
		t.Errorf("history = %s", mustJSON(task.History))
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":"m","parts":[{"text":"x"}]}}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"a","method":"GetTask","params":{"id":"t"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := ParseRequest(b)
		if err != nil {
			if err.Code >= 0 {
				t.Fatalf("error code %d is not a JSON-RPC error code", err.Code)
			}
			return
		}
		var p SendParams
		if DecodeParams(req.Params, &p) == nil && CheckMessage(p.Message) == nil {
			Inputs(p.Message)
			Decision(p.Message)
		}
	})
}

func FuzzFolder(f *testing.F) {
	f.Add([]byte(`{"type":"task_state","state":"running","taskId":"task-1"}`), []byte(`{"timestamp":"2026-01-01T00:00:00.000Z","type":"model_msg","payload":{"type":"partial_text","role":"assistant","event_type":"delta","text":"x"}}`), false)
	f.Add([]byte(`{"type":"task_state","state":"running","taskId":"task-1"}`), []byte(`{"type":"approval_request","toolCall":{"type":"model_msg","payload":{"type":"tool_call","role":"assistant","name":"x","arguments":"{}","tool_call_id":"c"}}}`), true)
	f.Fuzz(func(t *testing.T, a, b []byte, server bool) {
		fo := NewFolder("task-1", "session-1")
		fo.Feed(1, true, a)
		fo.Feed(2, server, b)
		fo.Feed(3, true, []byte(`{"type":"task_state","state":"idle","status":"completed","taskId":"task-1"}`))
		if !Terminal(fo.State()) {
			t.Fatalf("state %s after the Task's end", fo.State())
		}
		_ = fo.Task()
	})
}

package omni

import (
	"reflect"
	"strings"
	"testing"
)

func TestPackUnpackRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		in   any
		out  func() any // a fresh pointer to decode into
	}{
		{"Task", &Task{ID: "t1", Kind: TaskRun, SessionID: "s1", Input: []InputPart{{Type: "text", Text: "hi"}, {Type: "image_url", ImageURL: "data:x"}}, ThinkingLevel: "high", ParentSessionID: "s0", ParentToolCallID: "c0"}, func() any { return new(Task) }},
		{"Task compact", &Task{ID: "t2", Kind: TaskCompact, SessionID: "s1", Input: []InputPart{}}, func() any { return new(Task) }},
		{"ToolJob", &ToolJob{SessionID: "s1", ToolCallID: "c1", Name: "exec", Arguments: `{"command":"ls"}`, Workspace: "/w", EnqueuedUnixMs: 1764447022531}, func() any { return new(ToolJob) }},
		{"Heartbeat", &Heartbeat{Runner: "r1", ToolCallIDs: []string{"c1", "c2"}}, func() any { return new(Heartbeat) }},
		{"Cancel", &Cancel{ToolCallIDs: []string{"c1"}}, func() any { return new(Cancel) }},
		{"Cancel all", &Cancel{}, func() any { return new(Cancel) }},
		{"CancelReply", &CancelReply{Runner: "r1", ToolCallIDs: []string{"c2"}}, func() any { return new(CancelReply) }},
		{"Control", &Control{ToolCallID: "c1", Decision: DecisionDeny, Text: "steer ✓"}, func() any { return new(Control) }},
		{"ControlReply", &ControlReply{OK: true, Code: CodeNotRunning, Message: "m", Skipped: true, Pending: [][]byte{[]byte(`{"a":1}`), {0, 1, 2}}}, func() any { return new(ControlReply) }},
		{"InputPart", &InputPart{Type: "text", Text: "x"}, func() any { return new(InputPart) }},
		{"CompactionConfig", &CompactionConfig{MaxContextLength: 100000, MaxSessionTurns: 50, Mode: ModeDiscard}, func() any { return new(CompactionConfig) }},
		{"SessionRecord", &SessionRecord{ID: "s1", Model: "m", Workspace: "/w", ApprovalMode: ApproveReadOnly, SystemPrompt: "p", MaxTurns: 7,
			Compaction: CompactionConfig{MaxContextLength: 1, MaxSessionTurns: 2, Mode: ModeSummarize}, Title: "t", Principal: "alice",
			CreatedUnixMs: 1764447022531, State: StateRunning, TaskID: "t1", LastStatus: StatusFailed, Parent: "s0", Depth: 2, Deleted: true}, func() any { return new(SessionRecord) }},
		{"Usage", &Usage{1, 2, 3, 6}, func() any { return new(Usage) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Pack(tc.in)
			if err != nil {
				t.Fatalf("Pack(%+v) error: %v", tc.in, err)
			}
			out := tc.out()
			if err := Unpack(b, out); err != nil {
				t.Fatalf("Unpack(Pack(%+v)) error: %v", tc.in, err)
			}
			if !reflect.DeepEqual(out, tc.in) {
				t.Errorf("Unpack(Pack(x)) = %+v, want %+v", out, tc.in)
			}
		})
	}
}

func TestPackFieldNamesAreSnakeCase(t *testing.T) {
	b, err := Pack(&ToolJob{SessionID: "s1", ToolCallID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := Unpack(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"session_id", "tool_call_id", "name", "arguments", "workspace", "enqueued_unix_ms"} {
		if _, ok := m[k]; !ok {
			t.Errorf("Pack(ToolJob) keys = %v, want %q", m, k)
		}
	}
}

func TestUnpackGarbageFailsClearly(t *testing.T) {
	good, _ := Pack(&Task{ID: "t1", Kind: TaskRun, SessionID: "s1"})
	inputs := map[string][]byte{
		"empty":          nil,
		"never-used tag": {0xc1},
		"truncated":      good[:len(good)/2],
		"text":           []byte("hello, world"),
		"wrong type":     mustPack(t, []int{1, 2, 3}),
		"json":           []byte(`{"id":"t1"}`),
	}
	for name, b := range inputs {
		var task Task
		err := Unpack(b, &task)
		if err == nil {
			t.Errorf("Unpack(%s %x) = nil error, want one", name, b)
			continue
		}
		if !strings.HasPrefix(err.Error(), "omni: unpack *omni.Task: ") {
			t.Errorf("Unpack(%s) error = %q, want it to start with \"omni: unpack *omni.Task: \"", name, err)
		}
	}
}

func mustPack(t *testing.T, v any) []byte {
	t.Helper()
	b, err := Pack(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestPackUnsupportedValueFails(t *testing.T) {
	if b, err := Pack(make(chan int)); err == nil || !strings.Contains(err.Error(), "omni: pack chan int") {
		t.Errorf("Pack(chan) = %x, %v; want an omni: pack chan int error", b, err)
	}
	if err := Unpack(mustPack(t, &Task{}), Task{}); err == nil {
		t.Errorf("Unpack into a non-pointer = nil error, want one")
	}
}

func TestValidApprovalMode(t *testing.T) {
	for _, m := range []string{ApproveAllowAll, ApproveDenyAll, ApproveReadOnly, ApproveAlwaysAsk} {
		if !ValidApprovalMode(m) {
			t.Errorf("ValidApprovalMode(%q) = false, want true", m)
		}
	}
	for _, m := range []string{"", "allow", "ALLOW-ALL", "read_only"} {
		if ValidApprovalMode(m) {
			t.Errorf("ValidApprovalMode(%q) = true, want false", m)
		}
	}
}

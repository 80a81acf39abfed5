package omni

import (
	"slices"
	"strings"
	"testing"
)

func TestClassOf(t *testing.T) {
	tests := []struct {
		name string
		m    Message
		want string
	}{
		{"session_meta", SessionMeta(Meta{SessionID: "s"}), ClassMeta},
		{"user text", UserText("x"), ClassModel},
		{"thinking", Thinking("x"), ClassModel},
		{"tool_call", ToolCall("exec", "{}", "c"), ClassModel},
		{"tool_call_output", ToolCallOutput("c", "x", ""), ClassModel},
		{"image_url", Model(Payload{Type: TypeImageURL, Role: RoleUser}), ClassModel},
		{"partial_text", Partial(TypeText, EventStart, "x", "", ""), ClassPartial},
		{"partial_thinking", Partial(TypeThinking, EventDelta, "x", "", ""), ClassPartial},
		{"partial_tool_call", Partial(TypeToolCall, EventStop, "x", "exec", "c"), ClassPartial},
		{"partial_tool_call_output", Partial(TypeToolCallOutput, EventDelta, "x", "", "c"), ClassPartial},
		{"request_begin", RequestBegin(), ClassEvent},
		{"request_end", RequestEnd(StatusCompleted, "", 0, 0), ClassEvent},
		{"approval_decision", ApprovalDecision(DecisionAllow, "c"), ClassEvent},
		{"token_usage", TokenUsage(Usage{}, Usage{}), ClassEvent},
		{"compaction_begin", CompactionBegin(CompactTurns, ModeDiscard, 1, 2), ClassEvent},
		{"abort", Abort(""), ClassEvent},
		{"subagent", Subagent("s-child"), ClassEvent},
		{"nested partial", Partial(TypeText, EventDelta, "x", "", "").WithOrigin("s-c"), ClassNested},
		{"nested event", RequestBegin().WithOrigin("s-c"), ClassNested},
		{"nested session_meta", SessionMeta(Meta{SessionID: "s-c"}).WithOrigin("s-c"), ClassNested},
	}
	for _, tc := range tests {
		if got := ClassOf(&tc.m); got != tc.want {
			t.Errorf("ClassOf(%s) = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestEveryClassIsAClientOrTraceClass(t *testing.T) {
	for _, c := range []string{ClassMeta, ClassPartial, ClassModel, ClassEvent, ClassNested, ClassServer, ClassTrace} {
		if !slices.Contains(ClientClasses, c) && !slices.Contains(TraceClasses, c) {
			t.Errorf("class %q is in neither ClientClasses nor TraceClasses", c)
		}
	}
	for _, c := range []string{ClassPartial, ClassNested, ClassServer} {
		if slices.Contains(TraceClasses, c) {
			t.Errorf("TraceClasses = %q, want no %q (protocol.md §2)", TraceClasses, c)
		}
	}
}

func TestSessionSubjectsRoundTrip(t *testing.T) {
	const sid = "session-2026-11-29-20-10-22-0123abcd"
	if got, want := SessionWildcard(sid), "floe.session."+sid+".*"; got != want {
		t.Errorf("SessionWildcard(%q) = %q, want %q", sid, got, want)
	}
	for _, c := range append(slices.Clone(ClientClasses), ClassMeta, ClassTrace) {
		subj := SessionSubject(sid, c)
		if strings.Count(subj, ".") != 3 {
			t.Errorf("SessionSubject(%q, %q) = %q, want four tokens matching %s", sid, c, subj, SessionSubjects)
		}
		gotSID, gotClass, ok := ParseSessionSubject(subj)
		if !ok || gotSID != sid || gotClass != c {
			t.Errorf("ParseSessionSubject(%q) = %q, %q, %v; want %q, %q, true", subj, gotSID, gotClass, ok, sid, c)
		}
	}
}

func TestParseSessionSubjectRejectsOtherSubjects(t *testing.T) {
	for _, subj := range []string{
		"", "floe.session.", "floe.session.s1", "floe.session.s1.", "floe.session..model", "floe.session.a.b.model",
		"floe.task.s1", "floe.sessions.s1.model", "xfloe.session.s1.model", "floe.session.s1.model.", "floe.session.s1..model",
	} {
		if sid, class, ok := ParseSessionSubject(subj); ok {
			t.Errorf("ParseSessionSubject(%q) = %q, %q, true; want false", subj, sid, class)
		}
	}
}

func TestValidSessionID(t *testing.T) {
	tests := []struct {
		id   string
		want bool
	}{
		{"session-2026-11-29-20-10-22-0123abcd", true},
		{"s", true},
		{"ünïcode", true},
		{strings.Repeat("a", 128), true},
		{strings.Repeat("a", 129), false},
		{"", false},
		{"a.b", false},
		{"a*", false},
		{"a>", false},
		{"a b", false},
		{"a\tb", false},
		{"a\nb", false},
		{"a\x00b", false},
		{"a\x7fb", false},
	}
	for _, tc := range tests {
		if got := ValidSessionID(tc.id); got != tc.want {
			t.Errorf("ValidSessionID(%q) = %v, want %v", tc.id, got, tc.want)
		}
	}
}

func TestInternalSubjects(t *testing.T) {
	tests := []struct{ got, want string }{
		{TaskSubject("s1"), "floe.task.s1"},
		{ToolSubject(DefaultPool, "s1"), "floe.tool.default.s1"},
		{HeartbeatSubject("s1"), "floe.hb.s1"},
		{CancelSubject("s1"), "floe.cancel.s1"},
		{ControlSubject("s1", CtlApprove), "floe.ctl.s1.approve"},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("subject = %q, want %q", tc.got, tc.want)
		}
	}
}

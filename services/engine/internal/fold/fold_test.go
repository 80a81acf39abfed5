package fold

import (
	"slices"
	"testing"

	"floe.dev/pkg/omni"
)

func summary(msgs []*omni.Message) []string {
	var out []string
	for _, m := range msgs {
		p := m.Payload
		s := p.Type + ":" + p.Role
		switch p.Type {
		case omni.TypeToolCall, omni.TypeToolCallOutput:
			s += ":" + p.ToolCallID
		}
		if c := p.Content(); c != "" && p.Type != omni.TypeToolCall {
			s += ":" + c
		}
		out = append(out, s)
	}
	return out
}

func request(status string, msgs ...omni.Message) []omni.Message {
	out := []omni.Message{omni.RequestBegin()}
	out = append(out, msgs...)
	out = append(out, omni.TokenUsage(omni.Usage{Total: 10}, omni.Usage{Total: 10}), omni.RequestEnd(status, "", 0, 0))
	return out
}

// callsRecords is a Session with two committed requests, a failed one
// between them, and outputs before and after their request_end.
func callsRecords() []omni.Message {
	var rec []omni.Message
	rec = append(rec, omni.SessionMeta(omni.Meta{SessionID: "s"}), omni.UserText("hi"))
	rec = append(rec, request(omni.StatusCompleted,
		omni.Text(omni.RoleAssistant, "two tools"),
		omni.ToolCall("exec_command", "{}", "a"),
		omni.ToolCall("exec_command", "{}", "b"),
		omni.ToolCallOutput("b", "B", ""), // arrived before request_end
	)...)
	rec = append(rec, omni.ToolCallOutput("a", "A", "")) // after request_end
	// A failed attempt: dropped, and its call's output is ignored.
	rec = append(rec, request(omni.StatusTimeout, omni.Text(omni.RoleAssistant, "lost"), omni.ToolCall("x", "{}", "c"))...)
	rec = append(rec, omni.ToolCallOutput("c", "C", ""))
	rec = append(rec, request(omni.StatusCompleted, omni.Text(omni.RoleAssistant, "done"))...)
	return rec
}

func TestFoldKeepsCompletedTurnsWithOutputsInCallOrder(t *testing.T) {
	c := Load(callsRecords())
	got := summary(c.Messages())
	want := []string{"text:user:hi", "text:assistant:two tools", "tool_call:assistant:a", "tool_call:assistant:b",
		"tool_call_output:user:a:A", "tool_call_output:user:b:B", "text:assistant:done"}
	if !slices.Equal(got, want) {
		t.Fatalf("Messages() =\n%v\nwant\n%v", got, want)
	}
	if c.Turns != 2 || c.OpenRequest() || len(c.Unpaired()) != 0 {
		t.Fatalf("turns=%d open=%v unpaired=%v", c.Turns, c.OpenRequest(), c.Unpaired())
	}
}

func TestFoldPlaceholderForInterruptedCallsAndOpenRequest(t *testing.T) {
	var rec []omni.Message
	rec = append(rec, omni.UserText("go"))
	rec = append(rec, request(omni.StatusCompleted, omni.ToolCall("exec_command", "{}", "a"), omni.ToolCall("exec_command", "{}", "b"))...)
	rec = append(rec, omni.ToolCallOutput("b", "B", ""), omni.RequestBegin(), omni.Text(omni.RoleAssistant, "cut"))
	c := Load(rec)
	if !c.OpenRequest() {
		t.Fatal("OpenRequest() = false, want true")
	}
	if u := c.Unpaired(); !slices.Equal(u, []string{"a"}) {
		t.Fatalf("Unpaired() = %v, want [a]", u)
	}
	got := summary(c.Messages())
	want := []string{"text:user:go", "tool_call:assistant:a", "tool_call:assistant:b",
		"tool_call_output:user:a:" + omni.InterruptedOutput, "tool_call_output:user:b:B"}
	if !slices.Equal(got, want) {
		t.Fatalf("Messages() =\n%v\nwant\n%v", got, want)
	}
}

func TestFoldCompactionReplacesContextWithSummary(t *testing.T) {
	var rec []omni.Message
	rec = append(rec, omni.UserText("old"))
	rec = append(rec, request(omni.StatusCompleted, omni.Text(omni.RoleAssistant, "old answer"))...)
	rec = append(rec, omni.CompactionBegin(omni.CompactManual, omni.ModeSummarize, 10, 1),
		omni.Text(omni.RoleAssistant, "[summary]we talked[/summary]"),
		omni.TokenUsage(omni.Usage{Total: 30}, omni.Usage{Total: 20}),
		omni.CompactionEnd(omni.CompactManual, omni.ModeSummarize, omni.StatusCompleted),
		omni.SessionMeta(omni.Meta{SessionID: "s"}))
	rec = append(rec, omni.UserText("new"))
	rec = append(rec, request(omni.StatusCompleted, omni.Text(omni.RoleAssistant, "new answer"))...)
	c := Load(rec)
	got := summary(c.Messages())
	want := []string{"text:user:" + omni.Block(omni.TagContextSummary, "we talked"), "text:user:new", "text:assistant:new answer"}
	if !slices.Equal(got, want) {
		t.Fatalf("Messages() =\n%v\nwant\n%v", got, want)
	}
	if c.Turns != 1 || c.TotalTurns != 2 || c.Compactions != 1 {
		t.Fatalf("turns=%d total=%d compactions=%d", c.Turns, c.TotalTurns, c.Compactions)
	}
}

func TestFoldFailedCompactionKeepsContext(t *testing.T) {
	rec := []omni.Message{omni.UserText("keep")}
	rec = append(rec, request(omni.StatusCompleted, omni.Text(omni.RoleAssistant, "a"))...)
	rec = append(rec, omni.CompactionBegin(omni.CompactContext, omni.ModeSummarize, 10, 1),
		omni.CompactionEnd(omni.CompactContext, omni.ModeSummarize, omni.StatusFailed))
	got := summary(Load(rec).Messages())
	if !slices.Equal(got, []string{"text:user:keep", "text:assistant:a"}) {
		t.Fatalf("Messages() = %v", got)
	}
}

func TestExtractSummaryLadder(t *testing.T) {
	tests := []struct{ in, want string }{
		{"[summary]  [/summary] x [summary]second[/summary]", "second"},
		{"pre [summary]one[/summary]", "one"},
		{"no tags here", "no tags here"},
		{"[summary]unclosed", "unclosed"},
		{"[summary][/summary]", "[summary][/summary]"},
	}
	for _, tt := range tests {
		if got := ExtractSummary(tt.in); got != tt.want {
			t.Errorf("ExtractSummary(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestFoldKeepsCopiesOfWhatItApplies: records decoded one after another
// into one Message, as trace.Replay hands them over, fold to the same
// context as the records themselves, whatever the Message holds later;
// Reset starts over.
func TestFoldKeepsCopiesOfWhatItApplies(t *testing.T) {
	rec := callsRecords()
	want := summary(Load(rec).Messages())
	c := New()
	var m omni.Message
	apply := func() {
		for i := range rec {
			if err := omni.Unmarshal(omni.MustMarshal(&rec[i]), &m); err != nil {
				t.Fatal(err)
			}
			c.Apply(&m)
		}
		m = omni.Text(omni.RoleAssistant, "clobbered")
	}
	apply()
	if got := summary(c.Messages()); !slices.Equal(got, want) {
		t.Fatalf("Messages() after applying from one reused Message =\n%v\nwant\n%v", got, want)
	}
	c.Reset()
	if !c.Empty() || c.Meta != nil || c.Records != 0 || c.Turns != 0 || len(c.Messages()) != 0 {
		t.Fatalf("after Reset: empty %v, meta %v, records %d, turns %d", c.Empty(), c.Meta, c.Records, c.Turns)
	}
	apply()
	if got := summary(c.Messages()); !slices.Equal(got, want) {
		t.Fatalf("Messages() after Reset and again =\n%v\nwant\n%v", got, want)
	}
}

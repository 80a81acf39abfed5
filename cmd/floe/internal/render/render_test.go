package render

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
)

func numbered(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	return b.String()
}

// Long tool output is folded to its first and last lines with a count,
// whether it streamed or came whole; short output is shown whole.
func TestFoldsLongOutput(t *testing.T) {
	for _, streamed := range []bool{false, true} {
		var buf bytes.Buffer
		r := New(&buf, false)
		out := numbered(100)
		if streamed {
			for i, chunk := range strings.SplitAfter(out, "\n") {
				if chunk == "" {
					continue
				}
				ev := omni.EventDelta
				if i == 0 {
					ev = omni.EventStart
				}
				m := omni.Partial(omni.TypePartialToolCallOutput, ev, chunk, "", "call_1")
				r.Message(&m)
			}
			stop := omni.Partial(omni.TypePartialToolCallOutput, omni.EventStop, "", "", "call_1")
			r.Message(&stop)
		}
		done := omni.ToolCallOutput("call_1", out, "")
		r.Message(&done)
		r.Flush()
		got := buf.String()
		for _, want := range []string{"line 1\n", "line 10\n", "line 96\n", "line 100\n", "… 85 more lines (100 in all) …"} {
			if !strings.Contains(got, want) {
				t.Errorf("streamed=%v: output lacks %q:\n%s", streamed, want, got)
			}
		}
		for _, not := range []string{"line 11\n", "line 50\n", "line 95\n"} {
			if strings.Contains(got, not) {
				t.Errorf("streamed=%v: folded output shows %q:\n%s", streamed, not, got)
			}
		}
	}
	var buf bytes.Buffer
	r := New(&buf, false)
	m := omni.ToolCallOutput("call_1", numbered(18), "")
	r.Message(&m)
	if got := buf.String(); !strings.Contains(got, "line 11\n") || strings.Contains(got, "more lines") {
		t.Errorf("18 lines were folded:\n%s", got)
	}
}

// edit_file and write_file calls show a short diff instead of their JSON.
func TestEditDiff(t *testing.T) {
	var buf bytes.Buffer
	r := New(&buf, false)
	edit := omni.ToolCall("edit_file", `{"file_path":"main.go","old_string":"package main\nfunc a() {}\nfunc b() {}\n","new_string":"package main\nfunc a() { return }\nfunc b() {}\n"}`, "call_1")
	r.Message(&edit)
	write := omni.ToolCall("write_file", `{"file_path":"notes.txt","content":"`+strings.ReplaceAll(numbered(12), "\n", `\n`)+`"}`, "call_2")
	r.Message(&write)
	got := buf.String()
	for _, want := range []string{"→ edit_file main.go\n", "  - func a() {}\n", "  + func a() { return }\n",
		"→ write_file notes.txt (12 lines)\n", "  + line 1\n", "  + line 8\n", "  … 4 more lines\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, not := range []string{"package main", "old_string", "+ line 9"} {
		if strings.Contains(got, not) {
			t.Errorf("output shows %q:\n%s", not, got)
		}
	}
}

// A failed attempt is one readable line with the retry countdown.
func TestRetryLine(t *testing.T) {
	var buf bytes.Buffer
	r := New(&buf, false)
	r.MaxAttempts = 6
	m := omni.RequestEnd(omni.StatusFailed, `Post "http://127.0.0.1:9/v1/chat/completions": dial tcp 127.0.0.1:9: connect: connection refused`, 1, 4000)
	r.Message(&m)
	if got, want := buf.String(), "model request failed: connection refused (127.0.0.1:9); retrying in 4 s (attempt 2 of 6)\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if r.LastError != "connection refused (127.0.0.1:9)" {
		t.Errorf("LastError = %q", r.LastError)
	}
}

// A subagent's messages are indented by their depth and name it.
func TestSubagentIndent(t *testing.T) {
	var buf bytes.Buffer
	r := New(&buf, false)
	m := omni.Text(omni.RoleAssistant, "child says hi")
	m.Origin = []string{"session-child"}
	r.Message(&m)
	g := omni.Text(omni.RoleAssistant, "grandchild says hi")
	g.Origin = []string{"session-child", "session-grandchild"}
	r.Message(&g)
	if got, want := buf.String(), "  [session-child] child says hi\n    [session-grandchild] grandchild says hi\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// A hook record says which hook decided what and why.
func TestHookLine(t *testing.T) {
	for _, tc := range []struct {
		r    omni.HookRecord
		want string
	}{
		{omni.HookRecord{Point: omni.HookPreToolUse, Name: "no-push-main", Decision: omni.DecisionDeny, Reason: "pushes to main are not allowed", ToolCallID: "call_1"},
			"  ⚑ pre_tool_use hook no-push-main: deny — pushes to main are not allowed call_1\n"},
		{omni.HookRecord{Point: omni.HookStop, Name: "ralph", Decision: omni.DecisionContinue, Reason: "go test fails"},
			"  ⚑ stop hook ralph: continue — go test fails\n"},
		{omni.HookRecord{Point: omni.HookStop, Name: "audit", Reason: "hook failed: exit status 1"},
			"  ⚑ stop hook audit — hook failed: exit status 1\n"},
	} {
		var buf bytes.Buffer
		m := omni.HookEvent(tc.r)
		New(&buf, false).Message(&m)
		if buf.String() != tc.want {
			t.Errorf("got %q, want %q", buf.String(), tc.want)
		}
	}
}

func TestTaskLine(t *testing.T) {
	tests := []struct {
		status   string
		took     time.Duration
		requests int
		u        omni.Usage
		want     string
	}{
		{"completed", 3200 * time.Millisecond, 2, omni.Usage{Total: 1234, Output: 56}, "── completed · 3.2 s · 2 requests · 1,234 tokens (56 out)"},
		{"aborted", 0, 1, omni.Usage{}, "── aborted · 0.0 s · 1 request"},
		{"failed", 95 * time.Second, 0, omni.Usage{Total: 1234567}, "── failed · 1m 35s · 1,234,567 tokens (0 out)"},
	}
	for _, tt := range tests {
		if got := TaskLine(tt.status, tt.took, tt.requests, tt.u); got != tt.want {
			t.Errorf("TaskLine(%s) = %q, want %q", tt.status, got, tt.want)
		}
	}
}

// History and a live stream render a Task alike: the complete messages
// of a Trace give the lines their partials gave.
func TestHistoryRendersLikeLive(t *testing.T) {
	at := func(ms int, m omni.Message) omni.Message {
		m.Timestamp = time.Date(2026, 12, 1, 10, 0, 0, ms*int(time.Millisecond), time.UTC).Format(omni.TimeLayout)
		return m
	}
	args := `{"description": "List",  "cmd": "ls"}`
	complete := []omni.Message{
		at(0, omni.UserText("go")),
		at(10, omni.RequestBegin()),
		at(20, omni.Thinking("Hmm.")),
		at(30, omni.ToolCall("exec_command", args, "call_1")),
		at(40, omni.ApprovalDecision(omni.DecisionAllow, "call_1")),
		at(50, omni.ToolCallOutput("call_1", "a\nb\n", "")),
		at(60, omni.Text(omni.RoleAssistant, "Two files.")),
		at(70, omni.TokenUsage(omni.Usage{Total: 100, Output: 10}, omni.Usage{Total: 100, Output: 10})),
		at(1500, omni.RequestEnd(omni.StatusCompleted, "", 0, 0)),
	}
	var live []omni.Message
	for _, m := range complete {
		switch m.Payload.Type {
		case omni.TypeThinking:
			live = append(live, omni.Partial(omni.TypeThinking, omni.EventStart, "", "", ""), omni.Partial(omni.TypeThinking, omni.EventDelta, "Hm", "", ""), omni.Partial(omni.TypeThinking, omni.EventDelta, "m.", "", ""), omni.Partial(omni.TypeThinking, omni.EventStop, "", "", ""))
		case omni.TypeToolCall:
			live = append(live, omni.Partial(omni.TypeToolCall, omni.EventStart, "", "exec_command", "call_1"), omni.Partial(omni.TypeToolCall, omni.EventDelta, args, "", "call_1"), omni.Partial(omni.TypeToolCall, omni.EventStop, "", "", "call_1"))
		case omni.TypeToolCallOutput:
			live = append(live, omni.Partial(omni.TypeToolCallOutput, omni.EventStart, "", "", "call_1"), omni.Partial(omni.TypeToolCallOutput, omni.EventDelta, "a\nb\n", "", "call_1"), omni.Partial(omni.TypeToolCallOutput, omni.EventStop, "", "", "call_1"))
		case omni.TypeText:
			if m.Payload.Role == omni.RoleAssistant {
				live = append(live, omni.Partial(omni.TypeText, omni.EventStart, "", "", ""), omni.Partial(omni.TypeText, omni.EventDelta, "Two ", "", ""), omni.Partial(omni.TypeText, omni.EventDelta, "files.", "", ""), omni.Partial(omni.TypeText, omni.EventStop, "", "", ""))
			}
		}
		live = append(live, m)
	}
	render := func(msgs []omni.Message, end string) string {
		var b strings.Builder
		r := New(&b, false)
		for i := range msgs {
			r.Message(&msgs[i])
		}
		r.TaskEnd(end)
		r.Flush()
		return b.String()
	}
	hist, lv := render(complete, ""), render(live, omni.StatusCompleted)
	if hist != lv {
		t.Fatalf("history renders\n%s\nlive\n%s", hist, lv)
	}
	for _, want := range []string{"> go\n", "thinking: Hmm.\n", `→ exec_command {"description":"List","cmd":"ls"}`, "  ┌ output call_1\n  │ a\n  │ b\n", "Two files.\n", "── completed · 1.5 s · 1 request · 100 tokens (10 out)\n"} {
		if !strings.Contains(hist, want) {
			t.Errorf("the rendering lacks %q:\n%s", want, hist)
		}
	}
}

// A harness text (a hook's) is shown as such and is not taken for the
// caller's own Prompt.
func TestHarnessTextIsNotThePrompt(t *testing.T) {
	var buf bytes.Buffer
	r := New(&buf, false)
	r.SkipUser = 1
	ctx := omni.UserText("Be brief.")
	ctx.Payload.Sender = omni.SenderHarness
	prompt := omni.UserText("hello")
	for _, m := range []*omni.Message{&ctx, &prompt} {
		r.Message(m)
	}
	if got, want := buf.String(), "> Be brief.  (harness)\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

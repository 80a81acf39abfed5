package render

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

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

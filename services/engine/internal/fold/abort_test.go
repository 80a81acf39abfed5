package fold

import (
	"slices"
	"testing"

	"floe.dev/pkg/omni"
)

// A call still running when the run was aborted gets no output (its
// runner was cancelled): after the abort it is no longer awaited, and the
// model sees the interrupted placeholder in call order. Before the abort it
// is awaited (an engine that died mid-Task).
func TestAbortMarksRunningCallsInterrupted(t *testing.T) {
	var rec []omni.Message
	rec = append(rec, omni.UserText("go"))
	rec = append(rec, request(omni.StatusCompleted,
		omni.ToolCall("exec_command", "{}", "slow"),
		omni.ToolCall("exec_command", "{}", "fast"),
	)...)
	rec = append(rec, omni.ToolCallOutput("fast", "F", ""))
	if got := Load(rec).Unpaired(); !slices.Equal(got, []string{"slow"}) {
		t.Fatalf("before abort: Unpaired() = %v, want [slow]", got)
	}
	rec = append(rec, omni.Abort(""))
	c := Load(rec)
	if got := c.Unpaired(); len(got) != 0 {
		t.Fatalf("after abort: Unpaired() = %v, want none", got)
	}
	got := summary(c.Messages())
	want := []string{"text:user:go", "tool_call:assistant:slow", "tool_call:assistant:fast",
		"tool_call_output:user:slow:" + omni.InterruptedOutput, "tool_call_output:user:fast:F"}
	if !slices.Equal(got, want) {
		t.Fatalf("Messages() =\n%v\nwant\n%v", got, want)
	}
	// A later Task's calls are awaited as usual.
	rec = append(rec, omni.UserText("again"))
	rec = append(rec, request(omni.StatusCompleted, omni.ToolCall("exec_command", "{}", "next"))...)
	if got := Load(rec).Unpaired(); !slices.Equal(got, []string{"next"}) {
		t.Fatalf("next Task: Unpaired() = %v, want [next]", got)
	}
}

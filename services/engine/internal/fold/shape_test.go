package fold

import (
	"slices"
	"testing"

	"floe.dev/pkg/omni"
)

// compactionSpan is a compaction as the original writes it: the prompt,
// one request bracket per attempt, compaction_end with attempt.
func compactionSpan(attempts ...[]omni.Message) []omni.Message {
	out := []omni.Message{omni.CompactionBegin(omni.CompactContext, omni.ModeSummarize, 100, 2), omni.UserText("Summarize the conversation.")}
	for _, a := range attempts {
		out = append(out, a...)
	}
	end := omni.CompactionEnd(omni.CompactContext, omni.ModeSummarize, omni.StatusCompleted)
	end.Payload.Attempt = int64(len(attempts))
	return append(out, end)
}

func TestFoldCompactionTakesTheLastCompletedAttempt(t *testing.T) {
	var rec []omni.Message
	rec = append(rec, omni.UserText("old"))
	rec = append(rec, request(omni.StatusCompleted, omni.Text(omni.RoleAssistant, "old answer"))...)
	rec = append(rec, compactionSpan(
		request(omni.StatusTimeout, omni.Text(omni.RoleAssistant, "[summary]half of it")),
		request(omni.StatusCompleted, omni.Text(omni.RoleAssistant, "[summary]\nall of it\n[/summary]")),
	)...)
	c := Load(rec)
	if c.Summary != "all of it" {
		t.Fatalf("Summary = %q, want the completed attempt's", c.Summary)
	}
	if c.Turns != 0 || c.TotalTurns != 1 {
		t.Fatalf("compaction attempts counted as turns: Turns %d TotalTurns %d", c.Turns, c.TotalTurns)
	}
	got := summary(c.Messages())
	want := []string{"text:user:" + omni.Block(omni.TagContextSummary, "all of it")}
	if !slices.Equal(got, want) {
		t.Fatalf("Messages() = %v, want %v", got, want)
	}
}

// After a completed compaction the next file starts session_meta,
// tool_list_ready, then the [context_summary] text. Read alone (the
// original reads only the latest file) or after the first file, the model
// gets the summary exactly once; both block forms are read.
func TestFoldContextSummaryRecordOnce(t *testing.T) {
	for _, text := range []string{omni.Block(omni.TagContextSummary, "we talked"), "[context_summary]we talked[/context_summary]"} {
		second := []omni.Message{omni.SessionMeta(omni.Meta{SessionID: "s"}), omni.ToolListReady(nil), omni.UserText(text), omni.UserText("next")}
		second = append(second, request(omni.StatusCompleted, omni.Text(omni.RoleAssistant, "ok"))...)
		var first []omni.Message
		first = append(first, omni.UserText("old"))
		first = append(first, request(omni.StatusCompleted, omni.Text(omni.RoleAssistant, "old answer"))...)
		first = append(first, compactionSpan(request(omni.StatusCompleted, omni.Text(omni.RoleAssistant, "[summary]we talked[/summary]")))...)
		want := []string{"text:user:" + omni.Block(omni.TagContextSummary, "we talked"), "text:user:next", "text:assistant:ok"}
		for name, rec := range map[string][]omni.Message{"second file alone": second, "both files": append(first, second...)} {
			if got := summary(Load(rec).Messages()); !slices.Equal(got, want) {
				t.Errorf("%s (%q): Messages() = %v, want %v", name, text, got, want)
			}
		}
	}
}

// The original counts a tool_call as committed only with stop_reason
// completed; records without a stop_reason are read as completed.
func TestFoldMissingStopReasonIsCompleted(t *testing.T) {
	call := omni.ToolCall("exec_command", "{}", "a")
	call.Payload.StopReason = ""
	out := omni.ToolCallOutput("a", "A", "")
	out.Payload.StopReason = ""
	cut := omni.ToolCall("exec_command", "{}", "b")
	cut.Payload.StopReason = omni.StatusAborted
	var rec []omni.Message
	rec = append(rec, omni.UserText("go"))
	rec = append(rec, request(omni.StatusCompleted, call, cut, out)...)
	got := summary(Load(rec).Messages())
	want := []string{"text:user:go", "tool_call:assistant:a", "tool_call:assistant:b", "tool_call_output:user:a:A"}
	if !slices.Equal(got, want) {
		t.Fatalf("Messages() = %v, want %v", got, want)
	}
}

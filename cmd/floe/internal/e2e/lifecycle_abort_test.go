package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/procfs"
)

// lcEndsWithAbort checks the seed's interrupt timeline on one Task's stream:
// abort is the last OmniMessage; only the task_state idle server event
// follows it.
func lcEndsWithAbort(t *testing.T, rs []rec) {
	t.Helper()
	last := -1
	for i, r := range rs {
		if r.class != omni.ClassServer {
			last = i
		}
	}
	if last < 0 || label(rs[last]) != "abort" {
		t.Fatalf("the last OmniMessage is not abort:\n%s", strings.Join(lcDescribe(rs), "\n"))
	}
	for _, r := range rs[last+1:] {
		if r.class != omni.ClassServer || r.ev.Type != omni.ServerTaskState || r.ev.State != omni.StateIdle {
			t.Fatalf("after abort: %s", label(r))
		}
	}
	if n := len(rs) - last - 1; n != 1 {
		t.Fatalf("%d server events after abort, want only task_state idle", n)
	}
}

// Interrupt while two tools run, one finished (case A): the running process
// is killed, its complete output (what it printed and the interrupted
// marker, stop_reason aborted) is on the stream and in the Trace before
// abort{reason: "aborted by user"}, the run's last message; the next Task's
// model input holds both outputs in call order.
func TestLifecycleAbortWithToolsRunningCarriesOutputsOver(t *testing.T) {
	e := lcStart(t, "", envOpts{})
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{
			map[string]any{"tool_call": map[string]any{"name": "exec_command", "id": "slow",
				"arguments": map[string]any{"description": "slow", "cmd": "echo started; exec sleep 30.5151"}}},
			map[string]any{"tool_call": map[string]any{"name": "exec_command", "id": "fast",
				"arguments": map[string]any{"description": "fast", "cmd": "echo fast-output"}}},
		}},
		map[string]any{"expect_last_user": "and now?", "expect_tool_outputs": []string{"slow", "fast"},
			"steps": []any{map[string]any{"text": "Picked up where we left off."}}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, nil)
	task1 := e.submit(sid, "run a slow and a fast tool")

	// Abort once the fast output is in and the slow one is running.
	var slowStarted, fastDone bool
	e.lcFollow(sid, nil, "both tools under way", func(r rec) bool {
		switch label(r) {
		case "partial_tool_call_output:start:slow", "partial_tool_call_output:delta:slow":
			slowStarted = slowStarted || strings.Contains(r.msg.Payload.Output, "started")
		case "tool_call_output:fast":
			fastDone = true
		}
		return slowStarted && fastDone
	})
	e.lcMustControl(sid, omni.CtlAbort, omni.Control{})
	rs1, status := e.wait(sid, task1)
	lcRequireStatus(t, rs1, status, omni.StatusAborted)
	lcEndsWithAbort(t, rs1)
	checkDiscipline(t, rs1)
	got := labels(rs1, noPartials)
	if i, j := indexOf(got, "request_end:completed"), indexOf(got, "abort"); i < 0 || j < i {
		t.Fatalf("want the request completed before the abort: %v", got)
	}
	if i, j := indexOf(got, "tool_call_output:slow"), indexOf(got, "abort"); i < 0 || j < i {
		t.Fatalf("want the stopped tool's output before the abort: %v", got)
	}
	slowOut := outputOf(t, rs1, "slow")
	if slowOut.StopReason != omni.StatusAborted || slowOut.Output != "started\n"+omni.InterruptedOutput {
		t.Fatalf("stopped tool's output = %q (%s), want its output and %q (aborted)", slowOut.Output, slowOut.StopReason, omni.InterruptedOutput)
	}
	if ab := lcPayload(t, rs1, "abort"); ab.Reason != omni.AbortedByUser {
		t.Fatalf("abort reason = %q, want %q", ab.Reason, omni.AbortedByUser)
	}

	// The slow process is gone (killed, and reaped by its runner). It ran
	// confined, in a PID namespace: find it by its command line.
	eventually(t, 20*time.Second, "the sleep process to end", func() bool {
		return len(procfs.WithArgs("sleep", "30.5151")) == 0
	})

	// Nothing of the aborted run lands after it ended.
	quiet := e.lcAll(sid, nil)
	if len(quiet) != len(rs1) {
		t.Fatalf("messages after the aborted run's idle: %v", labels(quiet[len(rs1):], nil))
	}

	// The next Task: the model gets fast's output and the interrupted
	// placeholder for slow, in call order (the script checks the order and
	// fails the request otherwise); neither the placeholder nor a lost-runner
	// output is published.
	task2 := e.submit(sid, "and now?")
	rs2, status := e.wait(sid, task2)
	rs2 = rs2[len(rs1):]
	lcRequireStatus(t, rs2, status, omni.StatusCompleted)
	lcNoFailedRequests(t, rs2)
	if got := labels(rs2, noPartials); !slices.Equal(got, []string{"text", "request_begin", "text", "token_usage", "request_end:completed"}) {
		t.Fatalf("second Task:\n%s", strings.Join(lcDescribe(rs2), "\n"))
	}

	// The Trace: the aborted run ends with abort, the next run follows; the
	// placeholder is nowhere in it. Folded, it gives the context the model got.
	files := e.lcTrace(sid)
	if len(files) != 1 {
		t.Fatalf("%d trace files, want 1", len(files))
	}
	lcSameGroups(t, "trace", lcMsgLabels(files[0].msgs), lcGroups(
		lcSeq("session_meta", "tool_list_ready", "text", "request_begin"),
		[][]string{{"tool_call:slow", "approval_decision:allow:slow", "tool_call:fast", "approval_decision:allow:fast",
			"tool_call_output:fast", "token_usage", "request_end:completed"}},
		lcSeq("tool_call_output:slow", "abort", "text", "request_begin", "text", "token_usage", "request_end:completed"),
	)...)
	lcSameLabels(t, "model context", lcCtxLabels(lcContextOf(files[0].msgs)), []string{
		"user:run a slow and a fast tool",
		"tool_call:slow", "tool_call:fast",
		"out:slow:started\n" + omni.InterruptedOutput,
		"out:fast:fast-output",
		"user:and now?",
		"assistant:Picked up where we left off.",
	})
}

// Interrupt in the middle of an answer: the partial answer is streamed up
// to the abort and closed as aborted; the next run's model input holds it in
// a [turn_aborted] user text, which is never streamed nor traced.
func TestLifecycleAbortMidAnswerCarriesPartialOutputOver(t *testing.T) {
	e := lcStart(t, "", envOpts{})
	const answer = "Counting slowly: one two three four five six seven eight nine ten eleven twelve."
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{
			map[string]any{"thinking": "Let me count."},
			map[string]any{"text": answer, "chunks": 40, "delay_ms": 150},
		}},
		// An image-only Task: the last user text the model sees is then the
		// carry-over, which the script checks.
		map[string]any{"expect_last_user": "[turn_aborted]", "steps": []any{map[string]any{"text": "Nice picture."}}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, nil)
	task1 := e.submit(sid, "count to twelve")
	deltas := 0
	e.lcFollow(sid, nil, "the answer to be under way", func(r rec) bool {
		if label(r) == "partial_text:delta" {
			deltas++
		}
		return deltas >= 3
	})
	e.lcMustControl(sid, omni.CtlAbort, omni.Control{})
	rs1, status := e.wait(sid, task1)
	lcRequireStatus(t, rs1, status, omni.StatusAborted)
	lcEndsWithAbort(t, rs1)
	checkDiscipline(t, rs1)
	lcSameLabels(t, "aborted Task", labels(rs1, noPartials), []string{
		"session_meta", "tool_list_ready", "text", "request_begin", "thinking", "text", "token_usage", "request_end:aborted", "abort",
	})
	var partial omni.Payload
	for _, r := range rs1 {
		if r.class == omni.ClassModel && r.msg.Payload.Type == omni.TypeText && r.msg.Payload.Role == omni.RoleAssistant {
			partial = r.msg.Payload
		}
	}
	if partial.StopReason != omni.StatusAborted || partial.Text == "" || partial.Text == answer || !strings.HasPrefix(answer, partial.Text) {
		t.Fatalf("the cut-short answer = %q (stop_reason %q), want a proper prefix of the answer, aborted", partial.Text, partial.StopReason)
	}

	// The carry-over waits in the Session record, placed after the prompt.
	r, _, err := e.st.Sessions.Get(t.Context(), sid)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.CarryOver) != 1 || r.CarryOver[0].At != 1 ||
		!strings.HasPrefix(r.CarryOver[0].Text, "[turn_aborted]") || !strings.HasSuffix(r.CarryOver[0].Text, "[/turn_aborted]") ||
		!strings.Contains(r.CarryOver[0].Text, partial.Text) || !strings.Contains(r.CarryOver[0].Text, "Let me count.") {
		t.Fatalf("carry-over = %+v, want one [turn_aborted] block after the prompt holding %q", r.CarryOver, partial.Text)
	}

	task2 := e.submitTask(sid, omni.TaskRun, omni.InputPart{Type: "image_url", ImageURL: "data:image/png;base64,iVBORw0KGgo="})
	rs2, status := e.wait(sid, task2)
	rs2 = rs2[len(rs1):]
	lcRequireStatus(t, rs2, status, omni.StatusCompleted)
	lcNoFailedRequests(t, rs2)
	lcSameLabels(t, "second Task", labels(rs2, noPartials), []string{
		"image_url", "request_begin", "text", "token_usage", "request_end:completed",
	})

	// Never on any subject, never in the Trace.
	for _, r := range e.lcAll(sid, nil) {
		if strings.Contains(string(r.raw), "turn_aborted") {
			t.Fatalf("carry-over on the stream at %d: %s", r.seq, r.raw)
		}
	}
	files := e.lcTrace(sid)
	if len(files) != 1 {
		t.Fatalf("%d trace files, want 1", len(files))
	}
	lcSameLabels(t, "trace", lcMsgLabels(files[0].msgs), []string{
		"session_meta", "tool_list_ready",
		"text", "request_begin", "thinking", "text", "token_usage", "request_end:aborted", "abort",
		"image_url", "request_begin", "text", "token_usage", "request_end:completed",
	})
	for _, l := range files[0].lines {
		if strings.Contains(string(l), "turn_aborted") {
			t.Fatalf("carry-over in the Trace: %s", l)
		}
	}
	// The aborted request is not part of the folded context.
	lcSameLabels(t, "model context", lcCtxLabels(lcContextOf(files[0].msgs)), []string{
		"user:count to twelve", "image_url", "assistant:Nice picture.",
	})
}

// A call the abort catches before it runs (its approval still pending)
// has no output on the stream or in the Trace; the next request gives the
// model the interrupted placeholder for it, in call order.
func TestAbortBeforeDispatchPlaceholderInTheNextRequestOnly(t *testing.T) {
	f := rcNewFake(t,
		toolCallsTurn([3]string{"call_p", "exec_command", rcExecArgs("touch", "touch ran.txt")}),
		rcAnswer("Fine."),
	)
	e := rcEnv(t, f, nil)
	sid := e.session("openai:gpt-test", omni.ApproveAlwaysAsk, nil)
	task := e.submit(sid, "touch a file")
	e.lcFollow(sid, nil, "the approval request", func(r rec) bool {
		return r.class == omni.ClassServer && r.ev.Type == omni.ServerApprovalRequest
	})
	e.lcMustControl(sid, omni.CtlAbort, omni.Control{})
	rs, status := e.wait(sid, task)
	lcRequireStatus(t, rs, status, omni.StatusAborted)
	lcEndsWithAbort(t, rs)
	if indexOf(labels(rs, noPartials), "tool_call_output:call_p") >= 0 {
		t.Fatalf("an output for the call that never ran: %v", labels(rs, noPartials))
	}
	rs2, status := e.wait(sid, e.submit(sid, "never mind"))
	lcRequireStatus(t, rs2[len(rs):], status, omni.StatusCompleted)
	got := sentContext(f.body(1))
	want := []string{
		"user:touch a file",
		`assistant:[call call_p exec_command ` + rcExecArgs("touch", "touch ran.txt") + `]`,
		"tool:call_p:" + omni.InterruptedOutput,
		"user:never mind",
	}
	if !slices.Equal(got[1:], want) {
		t.Fatalf("the next request got\n  %s\nwant\n  %s", strings.Join(got[1:], "\n  "), strings.Join(want, "\n  "))
	}
	if _, err := os.Stat(filepath.Join(e.ws, "ran.txt")); err == nil {
		t.Fatal("the call ran")
	}
	for _, tf := range e.lcTrace(sid) {
		for _, l := range tf.lines {
			if strings.Contains(string(l), omni.InterruptedOutput) {
				t.Fatalf("the placeholder is in the Trace: %s", l)
			}
		}
	}
}

package e2e

import (
	"strings"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine"
)

// lcCompactionPrompt is the start of the engine's compaction request text.
const lcCompactionPrompt = "Summarize the conversation so far"

// lcPayload returns the payload of the first record labelled l, not
// counting messages forwarded from child Sessions.
func lcPayload(t *testing.T, rs []rec, l string) omni.Payload {
	t.Helper()
	for _, r := range rs {
		if r.class != omni.ClassNested && label(r) == l {
			return r.msg.Payload
		}
	}
	t.Fatalf("no %s in %v", l, labels(rs, noPartials))
	return omni.Payload{}
}

// lcClientStream keeps the classes a client sees (SPEC §2), partials aside.
func lcClientStream(r rec) bool {
	return r.class != omni.ClassMeta && r.class != omni.ClassTrace && r.class != omni.ClassServer && !r.msg.IsPartial()
}

// A context-triggered compaction mid-Task waits for the turn's tools,
// feeds their outputs to the compaction request, streams only
// compaction_begin → token_usage → compaction_end to clients (the request's
// output goes to the trace subject and the Trace alone), rotates the Trace
// to _002 headed by session_meta then tool_list_ready, and the next request
// starts from the [context_summary] text.
func TestLifecycleCompactionByContextSummarizesMidTask(t *testing.T) {
	e := lcStart(t, "", envOpts{})
	const summary = "Probed the house; probe-out seen."
	const output = "Some preamble. [summary]" + summary + "[/summary] Some trailing words."
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"tool_call": map[string]any{"name": "exec_command", "id": "probe",
			"arguments": map[string]any{"description": "probe", "cmd": "sleep 0.5; echo probe-out"}}}},
			"usage": map[string]any{"total": 5000, "output": 10}},
		// The compaction request: the old context with the probe's output.
		map[string]any{"expect_last_user": lcCompactionPrompt, "expect_tool_outputs": []string{"probe"},
			"steps": []any{map[string]any{"text": output, "chunks": 5}},
			"usage": map[string]any{"total": 5100, "output": 20}},
		map[string]any{"expect_last_user": omni.Block(omni.TagContextSummary, summary), "expect_tool_outputs": []string{},
			"steps": []any{map[string]any{"text": "Done after compaction."}}, "usage": map[string]any{"total": 300, "output": 5}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, func(r *omni.SessionRecord) {
		r.Compaction = omni.CompactionConfig{MaxContextLength: 1000}
	})
	rs, status := e.wait(sid, e.submit(sid, "probe the house"))
	lcRequireStatus(t, rs, status, omni.StatusCompleted)
	lcNoFailedRequests(t, rs)
	checkDiscipline(t, lcWithout(rs, omni.ClassTrace))
	lcSameGroups(t, "client stream", labels(rs, lcClientStream), lcGroups(
		lcSeq("tool_list_ready", "text", "request_begin", "tool_call:probe"),
		// the probe's output is awaited before compacting
		[][]string{{"approval_decision:allow:probe", "token_usage", "request_end:completed", "tool_call_output:probe"}},
		lcSeq("compaction_begin", "token_usage", "compaction_end:completed",
			"tool_list_ready", "request_begin", "text", "token_usage", "request_end:completed"),
	)...)
	begin := lcPayload(t, rs, "compaction_begin")
	if begin.Reason != omni.CompactContext || begin.Mode != omni.ModeSummarize || begin.Context != 5000 || begin.Turns != 1 {
		t.Fatalf("compaction_begin = reason %q mode %q context %d turns %d", begin.Reason, begin.Mode, begin.Context, begin.Turns)
	}
	end := lcPayload(t, rs, "compaction_end:completed")
	if end.Reason != omni.CompactContext || end.Mode != omni.ModeSummarize {
		t.Fatalf("compaction_end = %+v", end)
	}
	// Nothing of the compaction request's output reaches a client subject,
	// not even as partials; the trace subject carries it whole.
	inCompaction := false
	var traced []rec
	for _, r := range rs {
		switch label(r) {
		case "compaction_begin":
			inCompaction = true
		case "compaction_end:completed":
			inCompaction = false
		}
		if r.class == omni.ClassTrace {
			traced = append(traced, r)
			continue
		}
		if strings.Contains(string(r.raw), "Some preamble") {
			t.Fatalf("compaction output on %s at %d", r.class, r.seq)
		}
		if inCompaction && r.class == omni.ClassPartial {
			t.Fatalf("a partial during the compaction at %d", r.seq)
		}
	}
	if len(traced) != 1 || traced[0].msg.Payload.Text != output || traced[0].msg.Payload.Role != omni.RoleAssistant {
		t.Fatalf("trace subject = %v, want the one compaction output", lcDescribe(traced))
	}
	if lcPayload(t, rs, "session_meta").SessionID != sid || len(labels(rs, lcOnlyClass(omni.ClassMeta))) != 2 {
		t.Fatalf("want two session_meta (one per context): %v", labels(rs, lcOnlyClass(omni.ClassMeta)))
	}

	files := e.lcTrace(sid)
	if len(files) != 2 || !strings.HasSuffix(files[0].path, "_001.jsonl") || !strings.HasSuffix(files[1].path, "_002.jsonl") {
		t.Fatalf("trace files = %v, want _001 and _002", files)
	}
	lcSameGroups(t, "trace _001", lcMsgLabels(files[0].msgs), lcGroups(
		lcSeq("session_meta", "tool_list_ready", "text", "request_begin", "tool_call:probe"),
		[][]string{{"approval_decision:allow:probe", "token_usage", "request_end:completed", "tool_call_output:probe"}},
		lcSeq("compaction_begin", "text", "token_usage", "compaction_end:completed"),
	)...)
	lcSameLabels(t, "trace _002", lcMsgLabels(files[1].msgs), []string{
		"session_meta", "tool_list_ready", "request_begin", "text", "token_usage", "request_end:completed",
	})
	lcSameLabels(t, "resumed context", lcCtxLabels(engine.ModelContext(lcTraceMsgs(files))), []string{
		"user:" + omni.Block(omni.TagContextSummary, summary), "assistant:Done after compaction.",
	})
}

// A Session over maxSessionTurns compacts when the next Task starts; in
// discard mode there is no request (so no token_usage), and the new
// Task's own input is not thrown away with the old context: it opens the
// new one.
func TestLifecycleCompactionByTurnsDiscardsAtTaskStart(t *testing.T) {
	e := lcStart(t, "", envOpts{})
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{call("a", "echo a")}},
		map[string]any{"expect_tool_outputs": []string{"a"}, "steps": []any{map[string]any{"text": "first answer"}}},
		map[string]any{"expect_last_user": "second task", "steps": []any{map[string]any{"text": "second answer"}}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, func(r *omni.SessionRecord) {
		r.Compaction = omni.CompactionConfig{MaxSessionTurns: 2, Mode: omni.ModeDiscard}
	})
	rs1, status := e.wait(sid, e.submit(sid, "first task"))
	lcRequireStatus(t, rs1, status, omni.StatusCompleted)
	if indexOf(labels(rs1, nil), "compaction_begin") >= 0 {
		t.Fatalf("compacted during the first Task: %v", labels(rs1, noPartials))
	}
	rs2, status := e.wait(sid, e.submit(sid, "second task"))
	rs2 = rs2[len(rs1):]
	lcRequireStatus(t, rs2, status, omni.StatusCompleted)
	lcNoFailedRequests(t, rs2)
	lcSameLabels(t, "second Task's client stream", labels(rs2, lcClientStream), []string{
		"compaction_begin", "compaction_end:completed", "tool_list_ready",
		"text", "request_begin", "text", "token_usage", "request_end:completed",
	})
	begin := lcPayload(t, rs2, "compaction_begin")
	if begin.Reason != omni.CompactTurns || begin.Mode != omni.ModeDiscard || begin.Turns != 2 {
		t.Fatalf("compaction_begin = reason %q mode %q turns %d", begin.Reason, begin.Mode, begin.Turns)
	}
	files := e.lcTrace(sid)
	if len(files) != 2 {
		t.Fatalf("%d trace files, want 2", len(files))
	}
	lcSameLabels(t, "trace _002", lcMsgLabels(files[1].msgs), []string{
		"session_meta", "tool_list_ready", "text", "request_begin", "text", "token_usage", "request_end:completed",
	})
	lcSameLabels(t, "context", lcCtxLabels(engine.ModelContext(lcTraceMsgs(files))), []string{
		"user:second task", "assistant:second answer",
	})
}

// A manual compaction is a Task of kind compact on a Session moved to
// compacting: task_state compacting, the compaction events, task_state
// idle; the next Task starts from the summary.
func TestLifecycleCompactionManual(t *testing.T) {
	e := lcStart(t, "", envOpts{})
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"text": "Hello back."}}},
		map[string]any{"expect_last_user": lcCompactionPrompt, "steps": []any{map[string]any{"text": "[summary]We said hello.[/summary]"}}},
		map[string]any{"expect_last_user": "after the compaction", "steps": []any{map[string]any{"text": "Still here."}}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, nil)
	rs1, status := e.wait(sid, e.submit(sid, "hello"))
	lcRequireStatus(t, rs1, status, omni.StatusCompleted)

	ctask := e.lcSubmitTask(sid, omni.TaskCompact)
	rs2, status := e.wait(sid, ctask)
	rs2 = rs2[len(rs1):]
	lcRequireStatus(t, rs2, status, omni.StatusCompleted)
	lcSameLabels(t, "manual compaction", labels(rs2, noPartials), []string{
		"compaction_begin", "text", "token_usage", "compaction_end:completed",
		"session_meta", "tool_list_ready",
	})
	if rs2[0].ev.State != omni.StateCompacting || rs2[0].ev.TaskID != ctask {
		t.Fatalf("first server event = %+v, want task_state compacting", rs2[0].ev)
	}
	if p := lcPayload(t, rs2, "compaction_begin"); p.Reason != omni.CompactManual || p.Mode != omni.ModeSummarize || p.Turns != 1 {
		t.Fatalf("compaction_begin = %+v", p)
	}
	if r := rs2[2]; r.class != omni.ClassTrace {
		t.Fatalf("the summary went to %s", r.class)
	}

	rs3, status := e.wait(sid, e.submit(sid, "after the compaction"))
	lcRequireStatus(t, rs3[len(rs1)+len(rs2):], status, omni.StatusCompleted)
	lcNoFailedRequests(t, rs3)
	files := e.lcTrace(sid)
	if len(files) != 2 {
		t.Fatalf("%d trace files, want 2", len(files))
	}
	lcSameLabels(t, "trace _002", lcMsgLabels(files[1].msgs), []string{
		"session_meta", "tool_list_ready", "text", "request_begin", "text", "token_usage", "request_end:completed",
	})
	lcSameLabels(t, "context", lcCtxLabels(engine.ModelContext(lcTraceMsgs(files))), []string{
		"user:" + omni.Block(omni.TagContextSummary, "We said hello."), "user:after the compaction", "assistant:Still here.",
	})
}

// A compaction that fails keeps the old context and the Trace file: the
// request failing after the reconnect ladder is exhausted, an empty
// summary, a tool call instead of a summary.
func TestLifecycleCompactionFailureKeepsContext(t *testing.T) {
	e := lcStart(t, "", envOpts{engine: func(c *engine.Config) { c.RetryMax = 1 }})
	fail := map[string]any{"steps": []any{map[string]any{"error": map[string]any{"status": "timeout", "message": "upstream gone"}}}}
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"text": "Hello back."}}},
		fail, fail, // the first compaction: one attempt and one retry
		map[string]any{"steps": []any{map[string]any{"text": "[summary]  [/summary]"}}},
		map[string]any{"steps": []any{call("oops", "echo should not run")}},
		map[string]any{"expect_last_user": "still there?", "steps": []any{map[string]any{"text": "Yes."}}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, nil)
	rs, status := e.wait(sid, e.submit(sid, "hello"))
	lcRequireStatus(t, rs, status, omni.StatusCompleted)
	n := len(rs)
	for i, want := range []struct{ usages int }{{2}, {1}, {1}} {
		ctask := e.lcSubmitTask(sid, omni.TaskCompact)
		all, status := e.wait(sid, ctask)
		got := all[n:]
		n = len(all)
		lcRequireStatus(t, got, status, omni.StatusFailed)
		ls := []string{"compaction_begin"}
		for range want.usages {
			ls = append(ls, "token_usage")
		}
		ls = append(ls, "compaction_end:"+[]string{omni.StatusTimeout, omni.StatusFailed, omni.StatusFailed}[i])
		lcSameLabels(t, "failed compaction", labels(got, noPartials), ls)
	}
	rs, status = e.wait(sid, e.submit(sid, "still there?"))
	lcRequireStatus(t, rs[n:], status, omni.StatusCompleted)
	lcNoFailedRequests(t, rs[n:])
	for _, r := range rs {
		if r.class == omni.ClassModel && r.msg.Payload.Type == omni.TypeToolCall || r.class == omni.ClassTrace {
			t.Fatalf("a failed compaction's output was published: %s", r.raw)
		}
	}
	files := e.lcTrace(sid)
	if len(files) != 1 {
		t.Fatalf("%d trace files, want 1", len(files))
	}
	lcSameLabels(t, "context", lcCtxLabels(engine.ModelContext(files[0].msgs)), []string{
		"user:hello", "assistant:Hello back.", "user:still there?", "assistant:Yes.",
	})
}

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

// lcClientStream keeps the classes a client sees (protocol.md §2), partials aside.
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
	// The trace subject: the prompt, the attempt's bracket around its
	// output, and after the rotation the [context_summary] text.
	lcSameLabels(t, "trace subject", labels(traced, nil), []string{"text", "request_begin", "text", "request_end:completed", "text"})
	if p := traced[0].msg.Payload; p.Role != omni.RoleUser || !strings.HasPrefix(p.Text, lcCompactionPrompt) {
		t.Fatalf("first trace record = %+v, want the compaction prompt", p)
	}
	if p := traced[2].msg.Payload; p.Text != output || p.Role != omni.RoleAssistant {
		t.Fatalf("compaction output = %+v", p)
	}
	if p := traced[4].msg.Payload; p.Role != omni.RoleUser || p.Text != omni.Block(omni.TagContextSummary, summary) {
		t.Fatalf("after the rotation = %+v, want the [context_summary] text", p)
	}
	if end.Attempt != 1 || end.ErrorMessage != "" {
		t.Fatalf("compaction_end attempt %d error %q, want attempt 1", end.Attempt, end.ErrorMessage)
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
		lcSeq("compaction_begin", "text", "request_begin", "text", "token_usage", "request_end:completed", "compaction_end:completed"),
	)...)
	lcSameLabels(t, "trace _002", lcMsgLabels(files[1].msgs), []string{
		"session_meta", "tool_list_ready", "text", "request_begin", "text", "token_usage", "request_end:completed",
	})
	lcSameLabels(t, "resumed context", lcCtxLabels(engine.ModelContext(lcTraceMsgs(files))), []string{
		"user:" + omni.Block(omni.TagContextSummary, summary), "assistant:Done after compaction.",
	})
}

// A Session at maxSessionTurns compacts at the Task boundary, after the
// Task's last request_end and before it goes idle; discard waits for the
// boundary (it would drop the Task's own work mid-Task) and makes no
// request, so no token_usage. The next Task starts from an empty context.
func TestLifecycleCompactionByTurnsDiscardsAtTheTaskBoundary(t *testing.T) {
	e := lcStart(t, "", envOpts{})
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{call("a", "echo a")}},
		map[string]any{"expect_tool_outputs": []string{"a"}, "steps": []any{map[string]any{"text": "first answer"}}},
		map[string]any{"expect_last_user": "second task", "steps": []any{map[string]any{"text": "second answer"}}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, func(r *omni.SessionRecord) {
		r.Compaction = omni.CompactionConfig{MaxSessionTurns: 1, Mode: omni.ModeDiscard}
	})
	rs1, status := e.wait(sid, e.submit(sid, "first task"))
	lcRequireStatus(t, rs1, status, omni.StatusCompleted)
	lcNoFailedRequests(t, rs1)
	lcSameGroups(t, "first Task's client stream", labels(rs1, lcClientStream), lcGroups(
		lcSeq("tool_list_ready", "text", "request_begin", "tool_call:a"),
		[][]string{{"approval_decision:allow:a", "token_usage", "request_end:completed", "tool_call_output:a"}},
		// not mid-Task (turns reached 1 after the first request): at the end
		lcSeq("request_begin", "text", "token_usage", "request_end:completed",
			"compaction_begin", "compaction_end:completed", "tool_list_ready"),
	)...)
	begin := lcPayload(t, rs1, "compaction_begin")
	if begin.Reason != omni.CompactTurns || begin.Mode != omni.ModeDiscard || begin.Turns != 2 {
		t.Fatalf("compaction_begin = reason %q mode %q turns %d", begin.Reason, begin.Mode, begin.Turns)
	}
	rs2, status := e.wait(sid, e.submit(sid, "second task"))
	rs2 = rs2[len(rs1):]
	lcRequireStatus(t, rs2, status, omni.StatusCompleted)
	// Its one turn reaches the limit again: it compacts at its end too.
	lcSameLabels(t, "second Task's client stream", labels(rs2, lcClientStream), []string{
		"text", "request_begin", "text", "token_usage", "request_end:completed",
		"compaction_begin", "compaction_end:completed", "tool_list_ready",
	})
	files := e.lcTrace(sid)
	if len(files) != 3 {
		t.Fatalf("%d trace files, want 3", len(files))
	}
	lcSameLabels(t, "trace _002", lcMsgLabels(files[1].msgs), []string{
		"session_meta", "tool_list_ready", "text", "request_begin", "text", "token_usage", "request_end:completed",
		"compaction_begin", "compaction_end:completed",
	})
	lcSameLabels(t, "context of _002", lcCtxLabels(engine.ModelContext(files[1].msgs[:7])), []string{
		"user:second task", "assistant:second answer",
	})
	if ctx := engine.ModelContext(lcTraceMsgs(files)); len(ctx) != 0 {
		t.Fatalf("context after the second discard = %v, want empty", lcCtxLabels(ctx))
	}
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

	ctask := e.submitTask(sid, omni.TaskCompact)
	rs2, status := e.wait(sid, ctask)
	rs2 = rs2[len(rs1):]
	lcRequireStatus(t, rs2, status, omni.StatusCompleted)
	lcSameLabels(t, "manual compaction", labels(rs2, noPartials), []string{
		"compaction_begin", "text", "request_begin", "text", "token_usage", "request_end:completed", "compaction_end:completed",
		"session_meta", "tool_list_ready", "text",
	})
	if rs2[0].ev.State != omni.StateCompacting || rs2[0].ev.TaskID != ctask {
		t.Fatalf("first server event = %+v, want task_state compacting", rs2[0].ev)
	}
	if p := lcPayload(t, rs2, "compaction_begin"); p.Reason != omni.CompactManual || p.Mode != omni.ModeSummarize || p.Turns != 1 {
		t.Fatalf("compaction_begin = %+v", p)
	}
	for _, i := range []int{2, 3, 4, 6, 10} { // prompt, bracket, output, context summary
		if r := rs2[i]; r.class != omni.ClassTrace {
			t.Fatalf("%s went to %s", label(r), r.class)
		}
	}

	rs3, status := e.wait(sid, e.submit(sid, "after the compaction"))
	lcRequireStatus(t, rs3[len(rs1)+len(rs2):], status, omni.StatusCompleted)
	lcNoFailedRequests(t, rs3)
	files := e.lcTrace(sid)
	if len(files) != 2 {
		t.Fatalf("%d trace files, want 2", len(files))
	}
	lcSameLabels(t, "trace _002", lcMsgLabels(files[1].msgs), []string{
		"session_meta", "tool_list_ready", "text", "text", "request_begin", "text", "token_usage", "request_end:completed",
	})
	if p := files[1].msgs[2].Payload; p.Text != omni.Block(omni.TagContextSummary, "We said hello.") {
		t.Fatalf("_002's third record = %q, want the [context_summary] text", p.Text)
	}
	for name, msgs := range map[string][]omni.Message{"both files": lcTraceMsgs(files), "_002 alone": files[1].msgs} {
		lcSameLabels(t, "context from "+name, lcCtxLabels(engine.ModelContext(msgs)), []string{
			"user:" + omni.Block(omni.TagContextSummary, "We said hello."), "user:after the compaction", "assistant:Still here.",
		})
	}
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
	for i, want := range []struct {
		trace []string // the trace subject after the prompt
		msg   string   // compaction_end's error_message
	}{
		{[]string{"request_begin", "request_end:timeout", "request_begin", "request_end:timeout"}, "upstream gone"},
		{[]string{"request_begin", "text", "request_end:completed"}, "empty summary"},
		{[]string{"request_begin", "request_end:completed"}, "tool call"},
	} {
		ctask := e.submitTask(sid, omni.TaskCompact)
		all, status := e.wait(sid, ctask)
		got := all[n:]
		n = len(all)
		lcRequireStatus(t, got, status, omni.StatusFailed)
		attempts := int64(0)
		ls := []string{"compaction_begin"}
		for _, l := range want.trace {
			if l == "request_begin" {
				attempts++
				ls = append(ls, "token_usage")
			}
		}
		// failed whatever the last attempt's own status (timeout, or a
		// request that completed with an unusable answer)
		ls = append(ls, "compaction_end:failed")
		lcSameLabels(t, "failed compaction (client stream)", labels(got, lcClientStream), ls)
		lcSameLabels(t, "failed compaction (trace subject)", labels(got, lcOnlyClass(omni.ClassTrace)), append([]string{"text"}, want.trace...))
		end := lcPayload(t, got, "compaction_end:failed")
		if wantAttempt := attempts; end.Attempt != wantAttempt || !strings.Contains(end.ErrorMessage, want.msg) {
			t.Fatalf("compaction %d: compaction_end attempt %d error %q, want attempt %d mentioning %q", i+1, end.Attempt, end.ErrorMessage, wantAttempt, want.msg)
		}
	}
	rs, status = e.wait(sid, e.submit(sid, "still there?"))
	lcRequireStatus(t, rs[n:], status, omni.StatusCompleted)
	lcNoFailedRequests(t, rs[n:])
	metas := 0
	for _, r := range rs {
		if r.class == omni.ClassModel && r.msg.Payload.Type == omni.TypeToolCall {
			t.Fatalf("a failed compaction's output reached the stream: %s", r.raw)
		}
		if r.class == omni.ClassMeta {
			metas++
		}
	}
	if metas != 1 {
		t.Fatalf("%d session_meta, want 1: a failed compaction never rotates", metas)
	}
	files := e.lcTrace(sid)
	if len(files) != 1 {
		t.Fatalf("%d trace files, want 1", len(files))
	}
	lcSameLabels(t, "context", lcCtxLabels(engine.ModelContext(files[0].msgs)), []string{
		"user:hello", "assistant:Hello back.", "user:still there?", "assistant:Yes.",
	})
}

package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine"
)

// Failures in the middle of a stream, and a full tool-calling turn, through
// the whole system: the fake OpenAI endpoint, the engine, the tool runner,
// JetStream and the tracer.

// A connection dropped after some text: the failed attempt's text segment
// is closed (stop, then the complete text stamped timeout) before its
// request_end; the retry carries the partial text in a [turn_retried]
// block that is sent to the model only; the Trace is the stream, nothing
// twice.
func TestReconnectAfterMidStreamDisconnect(t *testing.T) {
	f := rcNewFake(t,
		rcDropAfter(rcRoleChunk(), rcTextChunk("The answer "), rcTextChunk("is for")),
		rcAnswer("The answer is 42."),
	)
	e := rcEnv(t, f, nil)
	sid := e.session(rcModel, omni.ApproveAllowAll, nil)
	rs, status := e.wait(sid, e.submit(sid, "what is the answer?"))
	if status != omni.StatusCompleted {
		t.Fatalf("task status = %q, want completed; stream:\n%v", status, labels(rs, nil))
	}
	checkDiscipline(t, rs)
	got := rcFromFirstBegin(labels(rs, nil))
	want := []string{
		"request_begin",
		"partial_text:start", "partial_text:delta", "partial_text:stop", "text",
		"token_usage", "request_end:timeout",
		"request_begin",
		"partial_text:start", "partial_text:delta", "partial_text:stop", "text",
		"token_usage", "request_end:completed",
	}
	if len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
		t.Fatalf("stream =\n%v\nwant it to start with\n%v", got, want)
	}
	texts := rcPayloads(rs, omni.TypeText)[1:] // [0] is the prompt
	if len(texts) != 2 || texts[0].Text != "The answer is for" || texts[0].StopReason != omni.StatusTimeout ||
		texts[1].Text != "The answer is 42." || texts[1].StopReason != omni.StatusCompleted {
		t.Fatalf("assistant texts = %+v, want the cut one stamped timeout, then the answer", texts)
	}
	ends := rcPayloads(rs, omni.TypeRequestEnd)
	if ends[0].Attempt != 1 || ends[0].RetryInMs != 30 || ends[1].Attempt != 2 {
		t.Fatalf("request_ends:%s", rcDescribeEnds(ends))
	}

	// The retry tells the model what the cut attempt said, once.
	blocks := f.body(1).retriedBlocks()
	if len(blocks) != 1 || !strings.Contains(blocks[0], "The answer is for") {
		t.Fatalf("retry's [turn_retried] blocks = %q, want one with the partial text", blocks)
	}
	if !strings.HasSuffix(blocks[0], "[/"+omni.TagTurnRetried+"]") {
		t.Errorf("[turn_retried] block not closed: %q", blocks[0])
	}
	// …and the cut text is not replayed as an assistant turn.
	for _, m := range f.body(1).Messages {
		if m.Role == "assistant" {
			t.Errorf("retry replays an assistant message %q", m.text())
		}
	}

	// Model-context-only text is never streamed nor traced.
	for _, r := range rs {
		if bytes.Contains(r.raw, []byte(omni.TagTurnRetried)) {
			t.Fatalf("seq %d streams the [turn_retried] block: %s", r.seq, r.raw)
		}
	}
	lines, stream := rcTrace(e, sid)
	if len(lines) != len(stream) {
		t.Fatalf("trace has %d records, stream %d", len(lines), len(stream))
	}
	seen := map[string]bool{}
	cut := 0
	for i := range lines {
		if !bytes.Equal(lines[i], stream[i]) {
			t.Fatalf("record %d:\ntrace  %s\nstream %s", i, lines[i], stream[i])
		}
		if seen[string(lines[i])] {
			t.Fatalf("record %d is in the trace twice: %s", i, lines[i])
		}
		seen[string(lines[i])] = true
		if bytes.Contains(lines[i], []byte(omni.TagTurnRetried)) {
			t.Fatalf("record %d traces the [turn_retried] block: %s", i, lines[i])
		}
		if bytes.Contains(lines[i], []byte("The answer is for")) {
			cut++
		}
	}
	if cut != 1 {
		t.Fatalf("the cut text is in the trace %d times, want once", cut)
	}
}

// A tool call completed in an attempt that then fails mid-stream is run
// once: the engine waits for its output, tells the model about it in the
// [turn_retried] block, and the retry (which asks for nothing new) does not
// run it again.
func TestReconnectToolCallOfFailedAttemptRunsOnce(t *testing.T) {
	args := rcExecArgs("count", "echo ran >> count.txt; echo appended")
	f := rcNewFake(t,
		rcDropAfter(
			rcRoleChunk(),
			rcToolStartChunk(0, "call_once", "exec_command", args[:12]),
			rcToolArgsChunk(0, args[12:]),
			rcFinishChunk("tool_calls"),
		),
		rcAnswer("It ran once."),
	)
	e := rcEnv(t, f, nil)
	sid := e.session(rcModel, omni.ApproveAllowAll, nil)
	rs, status := e.wait(sid, e.submit(sid, "append a line"))
	if status != omni.StatusCompleted {
		t.Fatalf("task status = %q, want completed; stream:\n%v", status, labels(rs, nil))
	}
	checkDiscipline(t, rs)
	data, err := os.ReadFile(filepath.Join(e.ws, "count.txt"))
	if err != nil {
		t.Fatalf("the tool never ran: %v; stream:\n%v", err, labels(rs, noPartials))
	}
	if n := strings.Count(string(data), "ran\n"); n != 1 {
		t.Fatalf("the tool ran %d times, want once", n)
	}
	// The model stream, then where the approval and the output may land:
	// approvals run beside the stream and the output whenever the tool
	// finishes, but both before the retry begins.
	got := rcFromFirstBegin(labels(rs, noPartials))
	const approval, output = "approval_decision:allow:call_once", "tool_call_output:call_once"
	model := slices.DeleteFunc(slices.Clone(got), func(l string) bool { return l == approval || l == output })
	wantModel := []string{
		"request_begin", "tool_call:call_once", "token_usage", "request_end:timeout",
		"request_begin", "text", "token_usage", "request_end:completed",
	}
	if !slices.Equal(model, wantModel) {
		t.Fatalf("model stream =\n%v\nwant\n%v", model, wantModel)
	}
	retry := indexOf(got[1:], "request_begin") + 1
	if strings.Count(strings.Join(got, " "), approval) != 1 || strings.Count(strings.Join(got, " "), output) != 1 ||
		!(indexOf(got, "tool_call:call_once") < indexOf(got, approval) && indexOf(got, approval) < indexOf(got, output) && indexOf(got, output) < retry) {
		t.Fatalf("stream =\n%v\nwant one approval after the call, then one output, both before the retry's request_begin", got)
	}
	call := rcPayloads(rs, omni.TypeToolCall)[0]
	if call.Arguments != args || call.StopReason != omni.StatusCompleted {
		t.Fatalf("tool_call = %+v, want arguments %s and no stop_reason", call, args)
	}
	blocks := f.body(1).retriedBlocks()
	if len(blocks) != 1 || !strings.Contains(blocks[0], "call_once") || !strings.Contains(blocks[0], "appended") {
		t.Fatalf("retry's [turn_retried] blocks = %q, want one naming call_once and its output", blocks)
	}
}

// A tool call cut short by a failure (its arguments were still streaming)
// is never committed nor run; the [turn_retried] block must then not tell
// the model that the calls it lists "were already executed and must not be
// repeated".
func TestReconnectCutShortToolCallIsNotClaimedExecuted(t *testing.T) {
	args := rcExecArgs("count", "echo ran >> count.txt")
	f := rcNewFake(t,
		rcDropAfter(rcRoleChunk(), rcToolStartChunk(0, "call_cut", "exec_command", args[:20])),
		rcAnswer("Done."),
	)
	e := rcEnv(t, f, nil)
	sid := e.session(rcModel, omni.ApproveAllowAll, nil)
	rs, status := e.wait(sid, e.submit(sid, "append a line"))
	if status != omni.StatusCompleted {
		t.Fatalf("task status = %q, want completed", status)
	}
	if _, err := os.Stat(filepath.Join(e.ws, "count.txt")); err == nil {
		t.Fatalf("a cut-short tool call ran")
	}
	if calls := rcPayloads(rs, omni.TypeToolCall); len(calls) != 1 || calls[0].StopReason != omni.StatusTimeout {
		t.Fatalf("tool_calls = %+v, want one stamped timeout", calls)
	}
	if n := len(rcPayloads(rs, omni.TypeApprovalDecision)); n != 0 {
		t.Fatalf("%d approval decisions for a cut-short call", n)
	}
	blocks := f.body(1).retriedBlocks()
	if len(blocks) != 1 {
		t.Fatalf("retry's [turn_retried] blocks = %q", blocks)
	}
	if strings.Contains(blocks[0], "call_cut") && strings.Contains(blocks[0], "already executed") &&
		!strings.Contains(blocks[0], "(tool output call_cut)") {
		t.Fatalf("the [turn_retried] block tells the model the cut-short call call_cut was already executed, "+
			"but it never ran:\n%s", blocks[0])
	}
}

// Reasoning, text and two parallel tool calls whose argument fragments
// interleave, through the whole system: segments never overlap on the
// stream, the arguments arrive exact, both tools run, and the next request
// replays the assistant turn (reasoning, text, both tool_calls) followed by
// the two tool messages in call order, whatever order the tools finished in.
func TestReconnectReasoningAndParallelToolCalls(t *testing.T) {
	argsA := rcExecArgs("slow A", "sleep 0.3; echo out-A")
	argsB := rcExecArgs("fast B", "echo out-B")
	f := rcNewFake(t,
		rcStreamed(
			rcRoleChunk(),
			rcThinkChunk("Two independent "), rcThinkChunk("commands; run both."),
			rcTextChunk("Running "), rcTextChunk("A and B."),
			rcToolStartChunk(0, "call_A", "exec_command", ""),
			rcToolArgsChunk(0, argsA[:9]),
			rcToolStartChunk(1, "call_B", "exec_command", argsB[:5]),
			rcToolArgsChunk(0, argsA[9:21]),
			rcToolArgsChunk(1, argsB[5:17]),
			rcToolArgsChunk(1, argsB[17:]),
			rcToolArgsChunk(0, argsA[21:]),
			rcFinishChunk("tool_calls"),
			rcUsageChunk(300, 60),
		),
		rcAnswer("A and B both ran."),
	)
	e := rcEnv(t, f, nil)
	sid := e.session(rcModel, omni.ApproveAllowAll, nil)
	rs, status := e.wait(sid, e.submit(sid, "run A and B"))
	if status != omni.StatusCompleted {
		t.Fatalf("task status = %q, want completed; stream:\n%v", status, labels(rs, nil))
	}
	checkDiscipline(t, rs)
	// One model segment open at a time, in the order the blocks began.
	var order []string
	for _, r := range rs {
		if r.class != omni.ClassServer && r.msg.IsPartial() && r.msg.Payload.EventType == omni.EventStart &&
			r.msg.Payload.Type != omni.TypePartialToolCallOutput {
			order = append(order, r.msg.Payload.Type+":"+r.msg.Payload.ToolCallID)
		}
	}
	wantOrder := []string{"partial_thinking:", "partial_text:", "partial_tool_call:call_A", "partial_tool_call:call_B", "partial_text:"}
	if !slices.Equal(order, wantOrder) {
		t.Fatalf("model segments began %v, want %v", order, wantOrder)
	}
	calls := rcPayloads(rs, omni.TypeToolCall)
	if len(calls) != 2 || calls[0].ToolCallID != "call_A" || calls[0].Arguments != argsA ||
		calls[1].ToolCallID != "call_B" || calls[1].Arguments != argsB {
		t.Fatalf("tool_calls = %+v\nwant call_A %s, call_B %s", calls, argsA, argsB)
	}
	outs := map[string]string{}
	for _, o := range rcPayloads(rs, omni.TypeToolCallOutput) {
		outs[o.ToolCallID] += o.Output
	}
	if len(outs) != 2 || !strings.Contains(outs["call_A"], "out-A") || !strings.Contains(outs["call_B"], "out-B") {
		t.Fatalf("tool outputs = %q", outs)
	}
	if th := rcPayloads(rs, omni.TypeThinking); len(th) != 1 || th[0].Thinking != "Two independent commands; run both." {
		t.Fatalf("thinking = %+v", th)
	}

	// The second request: …, assistant{reasoning, text, tool_calls A, B}, tool A, tool B.
	msgs := f.body(1).Messages
	i := slices.IndexFunc(msgs, func(m rcSentMessage) bool { return m.Role == "assistant" })
	if i < 0 || len(msgs) != i+3 {
		t.Fatalf("second request messages = %+v, want the assistant turn then two tool messages last", msgs)
	}
	a := msgs[i]
	if a.text() != "Running A and B." || a.ReasoningContent == nil || *a.ReasoningContent != "Two independent commands; run both." {
		t.Errorf("assistant message content %q reasoning %v", a.text(), a.ReasoningContent)
	}
	if len(a.ToolCalls) != 2 || a.ToolCalls[0].ID != "call_A" || a.ToolCalls[0].Function.Arguments != argsA ||
		a.ToolCalls[1].ID != "call_B" || a.ToolCalls[1].Function.Arguments != argsB ||
		a.ToolCalls[0].Type != "function" || a.ToolCalls[0].Function.Name != "exec_command" {
		t.Errorf("assistant tool_calls = %+v", a.ToolCalls)
	}
	for j, id := range []string{"call_A", "call_B"} {
		m := msgs[i+1+j]
		if m.Role != "tool" || m.ToolCallID != id || m.text() != outs[id] {
			t.Errorf("message %d = role %s tool_call_id %s content %q, want the tool output of %s (%q)", i+1+j, m.Role, m.ToolCallID, m.text(), id, outs[id])
		}
	}
	if len(f.body(1).retriedBlocks()) != 0 {
		t.Errorf("a completed turn carried a [turn_retried] block")
	}
}

// A stream the provider stopped for its content filter is not a normal
// completion: the openai provider reports Result.StopReason "failed"
// (anthropic does the same for stop_reason "refusal"), so the stream must
// say so — on the request_end or on the cut text — instead of looking like
// a clean answer.
func TestReconnectContentFilterStopIsNotSilent(t *testing.T) {
	f := rcNewFake(t, rcStreamed(rcRoleChunk(), rcTextChunk("I can"), rcFinishChunk("content_filter"), rcUsageChunk(50, 2)))
	e := rcEnv(t, f, func(c *engine.Config) { c.RetryMax = 0 })
	sid := e.session(rcModel, omni.ApproveAllowAll, nil)
	rs, status := e.wait(sid, e.submit(sid, "something filtered"))
	if status != omni.StatusFailed {
		t.Errorf("task status = %q, want failed", status)
	}
	texts := rcPayloads(rs, omni.TypeText)
	last := texts[len(texts)-1]
	ends := rcPayloads(rs, omni.TypeRequestEnd)
	if last.Text == "I can" && last.StopReason == omni.StatusCompleted && ends[0].Status == omni.StatusCompleted {
		t.Fatalf("a content_filter stop looks like a clean answer: text %q with no stop_reason, request_end %s", last.Text, ends[0].Status)
	}
	if len(ends) != 1 || ends[0].Status != omni.StatusFailed {
		t.Fatalf("request_ends = %+v, want one failed", ends)
	}
}

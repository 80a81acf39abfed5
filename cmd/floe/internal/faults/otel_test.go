package faults

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/telemetry/otlptest"
	"floe.dev/services/gateway/client"
)

// otelEnv points a process's OpenTelemetry at the receiver.
func otelEnv(r *otlptest.Receiver, extra ...string) []string {
	return append([]string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + r.URL, "OTEL_METRIC_EXPORT_INTERVAL=500"}, extra...)
}

// submitThrough creates a Session of model ref in the test's Workspace
// and submits prompt through the gateway on port (so the Task has the
// request's trace context); it returns the Session and Task ids.
func (c *cluster) submitThrough(port int, ref, prompt string) (sid, taskID string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	gw := client.New(fmt.Sprintf("http://127.0.0.1:%d", port))
	sess, err := gw.CreateSession(ctx, client.CreateSession{Model: ref, Workspace: c.ws})
	if err != nil {
		c.t.Fatal(err)
	}
	taskID, err = gw.SubmitTask(ctx, sess.ID, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: prompt}}})
	if err != nil {
		c.t.Fatal(err)
	}
	return sess.ID, taskID
}

// spanIndex finds spans of one trace.
type spanIndex []otlptest.Span

func (s spanIndex) named(name string) []otlptest.Span {
	var out []otlptest.Span
	for _, sp := range s {
		if sp.Name == name {
			out = append(out, sp)
		}
	}
	return out
}

func (s spanIndex) childrenOf(parent otlptest.Span, name string) []otlptest.Span {
	var out []otlptest.Span
	for _, sp := range s.named(name) {
		if sp.ParentSpanID == parent.SpanID && sp.TraceID == parent.TraceID {
			out = append(out, sp)
		}
	}
	return out
}

func (s spanIndex) agentOf(sid string) (otlptest.Span, bool) {
	for _, sp := range s.named("invoke_agent") {
		if sp.Attr("gen_ai.conversation.id") == sid {
			return sp, true
		}
	}
	return otlptest.Span{}, false
}

// agentWithParent returns the invoke_agent span of Session sid and the
// span it hangs under (the gateway's request span); ok is false until
// both were exported.
func (s spanIndex) agentWithParent(sid string) (agent, parent otlptest.Span, ok bool) {
	agent, ok = s.agentOf(sid)
	if !ok {
		return agent, parent, false
	}
	for _, sp := range s {
		if sp.SpanID == agent.ParentSpanID && sp.TraceID == agent.TraceID {
			return agent, sp, true
		}
	}
	return agent, parent, false
}

func (s spanIndex) names() []string {
	var out []string
	for _, sp := range s {
		out = append(out, sp.Service+"/"+sp.Name)
	}
	return out
}

// A Task with two tool calls and a subagent, submitted through the gateway
// and run by an engine and a toolrunner in processes of their own, is one
// trace: the gateway's request span, the Task's invoke_agent, a chat span
// per model request, an execute_tool span per call (the toolrunner's for
// the calls it runs, the engine's for run_subagent), and the child's
// invoke_agent under the run_subagent call; with the GenAI attributes and
// no message content (capture is off).
func TestOneTaskIsOneTraceAcrossProcesses(t *testing.T) {
	rcv := otlptest.New(t)
	c := newCluster(t, 1, 1)
	c.service("tracer", "tracer")
	c.service("toolrunner", "toolrunner", otelEnv(rcv)...)
	c.service("engine", "engine", otelEnv(rcv)...)
	port := freePort(t)
	c.service("gateway", "gateway", otelEnv(rcv, fmt.Sprintf("FLOE_HTTP_ADDR=127.0.0.1:%d", port))...)

	// The scripted model counts requests per Session: the parent and the
	// child both play entry 0 (two commands and a subagent; the child's own
	// subagent hits the depth limit), then entry 1.
	ref := c.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{
			map[string]any{"thinking": "Two commands and a helper."},
			execCall("call_a", "echo a"),
			execCall("call_b", "echo b"),
			map[string]any{"tool_call": map[string]any{"name": "run_subagent", "id": "call_sub",
				"arguments": map[string]any{"description": "helper", "prompt": "help"}}},
		}, "usage": map[string]any{"total": 120, "output": 20}},
		map[string]any{"steps": []any{text("Done.", 2, 0)}},
	}})
	sid, taskID := c.submitThrough(port, ref, "go")
	rs, status := c.wait(sid, taskID, 90*time.Second, nil)
	if status != omni.StatusCompleted {
		t.Fatalf("task ended %q; last: %v", status, lastLabels(rs, 12))
	}
	child := ""
	for _, r := range rs {
		if r.isEvent(omni.TypeSubagent) {
			child = r.msg.Payload.SessionID
		}
	}
	if child == "" {
		t.Fatal("no subagent event")
	}

	// Spans are exported in batches (1 s): wait for the whole trace.
	all := rcv.WaitFor(t, 30*time.Second, "the Task's trace", func(spans []otlptest.Span) bool {
		idx := spanIndex(spans)
		parent, _, ok := idx.agentWithParent(sid)
		if !ok {
			return false
		}
		_, childOK := idx.agentOf(child)
		var tools int
		for _, sp := range idx.named("execute_tool exec_command") {
			if sp.TraceID == parent.TraceID {
				tools++
			}
		}
		return childOK && tools >= 4 && len(idx.childrenOf(parent, "execute_tool run_subagent")) == 1
	})
	idx := spanIndex(all)
	agent, root, _ := idx.agentWithParent(sid)
	if root.Service != "floe-gateway" || !strings.HasPrefix(root.Name, "POST /api/sessions/") || root.Kind != "SPAN_KIND_SERVER" {
		t.Fatalf("invoke_agent's parent is %q %q (%s), want the gateway's POST …/tasks server span; spans: %v", root.Service, root.Name, root.Kind, idx.names())
	}
	var trace spanIndex
	for _, sp := range all {
		if sp.TraceID == root.TraceID {
			trace = append(trace, sp)
		}
	}
	if agent.Service != "floe-engine" || agent.Attr("gen_ai.operation.name") != "invoke_agent" ||
		agent.Attr("gen_ai.provider.name") != "scripted" || agent.Attr("floe.task.status") != omni.StatusCompleted {
		t.Errorf("invoke_agent attributes %v (service %s)", agent.Attrs, agent.Service)
	}

	// One chat span per model request of the parent, children of its
	// invoke_agent, with the request's usage and finish reason.
	var chats []otlptest.Span
	for _, sp := range trace {
		if strings.HasPrefix(sp.Name, "chat ") && sp.ParentSpanID == agent.SpanID {
			chats = append(chats, sp)
		}
	}
	if len(chats) != 2 {
		t.Fatalf("%d chat spans under the parent's invoke_agent, want 2; trace: %v", len(chats), trace.names())
	}
	first := chats[0]
	for _, k := range []string{"gen_ai.provider.name", "gen_ai.request.model", "gen_ai.response.finish_reasons",
		"gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.response.time_to_first_chunk", "floe.request.attempt"} {
		if _, ok := first.Attrs[k]; !ok {
			t.Errorf("chat span lacks %s: %v", k, first.Attrs)
		}
	}
	if first.Name != "chat "+first.Attr("gen_ai.request.model") || first.Attr("gen_ai.usage.input_tokens") != "100" ||
		first.Attr("gen_ai.usage.output_tokens") != "20" || first.Attr("gen_ai.operation.name") != "chat" || first.Kind != "SPAN_KIND_CLIENT" {
		t.Errorf("first chat span %q: %v", first.Name, first.Attrs)
	}

	// The two commands: the toolrunner's spans, children of the Task.
	tools := trace.childrenOf(agent, "execute_tool exec_command")
	ids := map[string]bool{}
	for _, sp := range tools {
		if sp.Service != "floe-toolrunner" || sp.Attr("gen_ai.tool.name") != "exec_command" ||
			sp.Attr("floe.approval.decision") != "allow" || sp.Attr("floe.tool.status") != omni.StatusCompleted ||
			sp.Attr("floe.sandbox.backend") == "" {
			t.Errorf("tool span %s: %v", sp.Service, sp.Attrs)
		}
		ids[sp.Attr("gen_ai.tool.call.id")] = true
	}
	if len(tools) != 2 || !ids["call_a"] || !ids["call_b"] {
		t.Fatalf("exec_command spans under the parent: %d with ids %v; trace: %v", len(tools), ids, trace.names())
	}

	// The subagent: the engine's run_subagent span, parent of the child's
	// invoke_agent, whose own calls are its children.
	sub := trace.childrenOf(agent, "execute_tool run_subagent")[0]
	childAgent, _ := trace.agentOf(child)
	if childAgent.ParentSpanID != sub.SpanID || childAgent.TraceID != root.TraceID {
		t.Errorf("child invoke_agent parent %s trace %s; want the run_subagent span %s in trace %s", childAgent.ParentSpanID, childAgent.TraceID, sub.SpanID, root.TraceID)
	}
	if sub.Attr("gen_ai.tool.call.id") != "call_sub" || sub.Attr("floe.tool.status") != omni.StatusCompleted || childAgent.Attr("floe.parent_session.id") != sid {
		t.Errorf("run_subagent span %v; child invoke_agent %v", sub.Attrs, childAgent.Attrs)
	}
	if n := len(trace.childrenOf(childAgent, "execute_tool exec_command")); n != 2 {
		t.Errorf("the child's exec_command spans: %d, want 2", n)
	}

	// Content is off: no message, argument or result on any span.
	for _, sp := range all {
		for _, k := range []string{"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result", "gen_ai.system_instructions"} {
			if _, ok := sp.Attrs[k]; ok {
				t.Errorf("span %s carries %s without OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", sp.Name, k)
			}
		}
	}
	// The GenAI metrics beside the spans.
	eventually(t, 30*time.Second, "the GenAI client metrics", func() bool {
		m := rcv.Metrics()
		return m["gen_ai.client.token.usage"] > 0 && m["gen_ai.client.operation.duration"] > 0
	})
	if bad := rcv.Bad(); len(bad) > 0 {
		t.Errorf("undecodable export requests: %v", bad)
	}
}

// The engine running a Task is killed (SIGKILL) mid-request; the engine
// that takes the Task over continues the same trace: its invoke_agent is
// the child of the gateway's request span, like the dead engine's was,
// and its retry is a chat span with attempt 2. Content capture is on here,
// so the spans carry the messages and the tool's arguments and result.
func TestTakeoverAfterKillKeepsTheTrace(t *testing.T) {
	rcv := otlptest.New(t)
	capture := "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true"
	c := newCluster(t, 1, 1, "FLOE_ENGINE_ACK_WAIT_MS=3000")
	c.service("tracer", "tracer")
	c.service("toolrunner", "toolrunner", otelEnv(rcv, capture)...)
	knobs := otelEnv(rcv, capture, "FLOE_ENGINE_ACK_WAIT_MS=3000", "FLOE_RETRY_BASE_MS=50", "FLOE_RETRY_CAP_MS=200")
	first := c.service("engine", "engine-1", knobs...)
	port := freePort(t)
	c.service("gateway", "gateway", otelEnv(rcv, fmt.Sprintf("FLOE_HTTP_ADDR=127.0.0.1:%d", port))...)

	ref := c.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{
			text(strings.Repeat("Thinking it through carefully. ", 10), 30, 150),
			execCall("call_a", "echo ran"),
		}},
		map[string]any{"steps": []any{text("Done.", 1, 0)}},
	}})
	sid, taskID := c.submitThrough(port, ref, "take your time")
	c.waitFor(sid, 60*time.Second, func(r rec) bool {
		return r.isModel(omni.TypePartialText) && r.msg.Payload.EventType == omni.EventDelta
	})
	c.service("engine", "engine-2", knobs...)
	first.kill(t)
	_, status := c.wait(sid, taskID, 120*time.Second, nil)
	if status != omni.StatusCompleted {
		t.Fatalf("task ended %q", status)
	}

	spans := rcv.WaitFor(t, 30*time.Second, "the taken-over Task's spans", func(spans []otlptest.Span) bool {
		a, _, ok := spanIndex(spans).agentWithParent(sid)
		return ok && len(spanIndex(spans).childrenOf(a, "execute_tool exec_command")) == 1
	})
	idx := spanIndex(spans)
	agent, _, _ := idx.agentWithParent(sid)
	var post otlptest.Span
	for _, sp := range spans {
		if sp.Service == "floe-gateway" && strings.HasSuffix(sp.Name, "/tasks") {
			post = sp
		}
	}
	if post.SpanID == "" || agent.TraceID != post.TraceID || agent.ParentSpanID != post.SpanID {
		t.Fatalf("the taking-over engine's invoke_agent (trace %s, parent %s) is not the gateway request's child (trace %s, span %s)",
			agent.TraceID, agent.ParentSpanID, post.TraceID, post.SpanID)
	}
	var retried bool
	for _, sp := range idx {
		if strings.HasPrefix(sp.Name, "chat ") && sp.ParentSpanID == agent.SpanID {
			if sp.Attr("floe.request.attempt") == "2" && sp.Attr("floe.request.retry_reason") != "" {
				retried = true
			}
			if sp.Attr("gen_ai.input.messages") == "" || !strings.Contains(sp.Attr("gen_ai.input.messages"), "take your time") {
				t.Errorf("chat span without the captured input messages: %v", sp.Attrs)
			}
		}
	}
	if !retried {
		t.Errorf("no chat span with attempt 2 and a retry reason under the new invoke_agent: %v", idx.names())
	}
	tool := idx.childrenOf(agent, "execute_tool exec_command")[0]
	if !strings.Contains(tool.Attr("gen_ai.tool.call.arguments"), "echo ran") || !strings.Contains(tool.Attr("gen_ai.tool.call.result"), "ran") {
		t.Errorf("tool span without captured arguments and result: %v", tool.Attrs)
	}
}

package toolrunner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/telemetry"
	"floe.dev/pkg/telemetry/otlptest"
	"floe.dev/services/toolrunner"
)

// A tool job carries its Task's trace context in its headers: the runner's
// execute_tool span is that context's child, and the MCP request of the
// call carries the span on as params._meta.traceparent, so the server can
// join the trace.
func TestToolJobsAndMCPRequestsCarryTheTrace(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	rcv := otlptest.New(t)
	tel, err := telemetry.FromEnv(context.Background(), "floe-toolrunner",
		func(k string) string { return map[string]string{telemetry.EnvEndpoint: rcv.URL}[k] })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	var mu sync.Mutex
	var seen []string // the traceparent of each request the server got
	srv := sdk.NewServer(&sdk.Implementation{Name: "trace-test", Version: "1"}, nil)
	srv.AddTool(&sdk.Tool{Name: "look", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			tp, _ := req.Params.Meta["traceparent"].(string)
			mu.Lock()
			seen = append(seen, tp)
			mu.Unlock()
			return text("looked"), nil
		})
	h.start(toolrunner.Config{MCPConfig: mcpConfig(t, map[string]any{"t": map[string]any{"url": httpServer(t, srv)}}), Telemetry: tel})

	const sid = "s-trace"
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for i, name := range []string{"mcp__t__look", "exec_command"} {
		args := `{}`
		if name == "exec_command" {
			args = `{"description":"d","cmd":"echo hi"}`
		}
		id := fmt.Sprintf("call_%d", i)
		m, err := bus.PackMsg(omni.ToolSubject(omni.DefaultPool, sid), omni.ToolJob{SessionID: sid, ToolCallID: id, Name: name,
			Arguments: args, Workspace: h.ws, EnqueuedUnixMs: time.Now().UnixMilli()})
		if err != nil {
			t.Fatal(err)
		}
		m.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
		h.publish(m)
		if p := h.checkSegment(sid, h.waitOutput(sid, id)); p.StopReason != "" && p.StopReason != omni.StatusCompleted {
			t.Fatalf("%s ended %s: %s", name, p.StopReason, p.Output)
		}
	}
	if err := tel.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rcv.WaitFor(t, 10*time.Second, "two execute_tool spans", func(s []otlptest.Span) bool { return len(s) >= 2 })
	byName := map[string]otlptest.Span{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	mcp, exec := byName["execute_tool mcp__t__look"], byName["execute_tool exec_command"]
	for _, s := range []otlptest.Span{mcp, exec} {
		if s.TraceID != traceID || s.ParentSpanID != parentID {
			t.Errorf("span %q: trace %s parent %s, want the job's %s %s", s.Name, s.TraceID, s.ParentSpanID, traceID, parentID)
		}
		if s.Attr("gen_ai.conversation.id") != sid || s.Attr("floe.tool.status") != omni.StatusCompleted || s.Service != "floe-toolrunner" {
			t.Errorf("span %q attributes %v", s.Name, s.Attrs)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || !strings.HasPrefix(seen[0], "00-"+traceID+"-"+mcp.SpanID+"-") {
		t.Errorf("the MCP server saw traceparent %q, want the trace %s with the execute_tool span %s as parent", seen, traceID, mcp.SpanID)
	}
}

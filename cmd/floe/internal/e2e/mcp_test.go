package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"floe.dev/cmd/floe/internal/mcptest"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/procfs"
	"floe.dev/services/engine"
)

func writeMCPConfig(t *testing.T, servers map[string]any) string {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"servers": servers})
	p := filepath.Join(t.TempDir(), "mcp.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// payloadsOf returns the payloads of type typ.
func payloadsOf(rs []rec, typ string) []omni.Payload {
	var out []omni.Payload
	for _, r := range rs {
		if r.class != omni.ClassServer && r.msg.Payload.Type == typ {
			out = append(out, r.msg.Payload)
		}
	}
	return out
}

// outputsOf returns the complete outputs of call id.
func outputsOf(rs []rec, id string) []omni.Payload {
	var out []omni.Payload
	for _, p := range payloadsOf(rs, omni.TypeToolCallOutput) {
		if p.ToolCallID == id {
			out = append(out, p)
		}
	}
	return out
}

// streamedBefore returns call id's partial output content streamed before
// its complete output.
func streamedBefore(rs []rec, id string) string {
	var b strings.Builder
	for _, r := range rs {
		p := r.msg.Payload
		if p.ToolCallID != id {
			continue
		}
		if p.Type == omni.TypeToolCallOutput {
			break
		}
		if p.Type == omni.TypePartialToolCallOutput {
			b.WriteString(p.Output)
		}
	}
	return b.String()
}

// mcpResults returns the results of each mcp_connect_end.
func mcpResults(t *testing.T, rs []rec) (statuses []string, results [][]omni.MCPConnectResult) {
	t.Helper()
	for _, p := range payloadsOf(rs, omni.TypeMCPConnectEnd) {
		var res []omni.MCPConnectResult
		if err := json.Unmarshal(p.Field("results"), &res); err != nil {
			t.Fatalf("mcp_connect_end results: %v", err)
		}
		statuses = append(statuses, p.Status)
		results = append(results, res)
	}
	return statuses, results
}

// checkConnectBeforeToolList checks, per Task start, mcp_connect_begin →
// mcp_connect_end → tool_list_ready, in that order and n times.
func checkConnectBeforeToolList(t *testing.T, rs []rec, n int) {
	t.Helper()
	var seq []string
	for _, r := range rs {
		switch typ := r.msg.Payload.Type; typ {
		case omni.TypeMCPConnectBegin, omni.TypeMCPConnectEnd, omni.TypeToolListReady:
			if r.class != omni.ClassServer {
				seq = append(seq, typ)
			}
		}
	}
	var want []string
	for range n {
		want = append(want, omni.TypeMCPConnectBegin, omni.TypeMCPConnectEnd, omni.TypeToolListReady)
	}
	if strings.Join(seq, " ") != strings.Join(want, " ") {
		t.Errorf("connect events %v, want %v", seq, want)
	}
}

func toolNames(specs []omni.ToolSpec) map[string]bool {
	m := map[string]bool{}
	for _, s := range specs {
		m[s.Name] = true
	}
	return m
}

// everythingChild returns the pid of the reference server this process
// started over stdio.
func everythingChild(t *testing.T, entry string) int {
	t.Helper()
	// The server runs confined, under the sandbox's helper: it is a
	// descendant of this process, not a child.
	pids := procfs.Find(func(pid int, args []string) bool {
		return procfs.HasArgs(args, entry, "stdio") && procfs.DescendsFrom(pid, os.Getpid())
	})
	if len(pids) == 0 {
		return 0
	}
	return pids[0]
}

func toolCallsTurn(calls ...[3]string) rcReply {
	chunks := []string{rcRoleChunk()}
	for i, c := range calls {
		chunks = append(chunks, rcToolStartChunk(i, c[0], c[1], c[2]))
	}
	return rcStreamed(append(chunks, rcFinishChunk("tool_calls"), rcUsageChunk(100, 10))...)
}

// The reference server over stdio: its tools are offered to the model as
// mcp__everything__*, echo answers, the long-running tool's progress
// streams before its one complete output; an abort mid-call ends it;
// killing the server mid-call fails that call once and the next call works
// after the restart.
func TestMCPEverythingOverStdio(t *testing.T) {
	entry := mcptest.Everything(t)
	const echo, long = "mcp__everything__echo", "mcp__everything__trigger-long-running-operation"
	f := rcNewFake(t,
		toolCallsTurn([3]string{"call_echo", echo, `{"message":"hello mcp"}`}, [3]string{"call_long", long, `{"duration":1,"steps":3}`}),
		rcAnswer("done one"),
		toolCallsTurn([3]string{"call_abort", long, `{"duration":60,"steps":60}`}),
		toolCallsTurn([3]string{"call_kill", long, `{"duration":60,"steps":60}`}),
		toolCallsTurn([3]string{"call_echo2", echo, `{"message":"after restart"}`}),
		rcAnswer("done three"),
	)
	e := start(t, envOpts{mcpConfig: writeMCPConfig(t, map[string]any{
		"everything": map[string]any{"command": "node", "args": []string{entry, "stdio"}}}),
		engine: func(c *engine.Config) { c.Providers.OpenAIBaseURL, c.Providers.OpenAIAPIKey = f.baseURL(), rcAPIKey }})
	sid := e.session("openai:gpt-test", omni.ApproveAllowAll, nil)

	// Task 1: echo and the long-running tool.
	rs, status := e.wait(sid, e.submit(sid, "use the tools"))
	if status != omni.StatusCompleted {
		t.Fatalf("task 1 status %q: %v", status, labels(rs, noPartials))
	}
	checkDiscipline(t, rs)
	var req struct {
		Tools []struct {
			Function struct {
				Name       string          `json:"name"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"function"`
		} `json:"tools"`
	}
	f.mu.Lock()
	_ = json.Unmarshal(f.bodies[0], &req)
	f.mu.Unlock()
	sent := map[string]json.RawMessage{}
	for _, tl := range req.Tools {
		sent[tl.Function.Name] = tl.Function.Parameters
	}
	for _, want := range []string{"exec_command", echo, long, "mcp__everything__get-sum"} {
		if _, ok := sent[want]; !ok {
			t.Errorf("model request lacks tool %s (has %d tools)", want, len(sent))
		}
	}
	if !strings.Contains(string(sent[echo]), `"message"`) {
		t.Errorf("echo's schema in the request = %s, want the server's", sent[echo])
	}
	statuses, results := mcpResults(t, rs)
	if len(results) != 1 || statuses[0] != omni.StatusCompleted || results[0][0].Server != "everything" || results[0][0].Tools < 5 {
		t.Errorf("mcp_connect_end %v %+v, want everything completed with its tools", statuses, results)
	}
	if out := outputsOf(rs, "call_echo"); len(out) != 1 || !strings.Contains(out[0].Output, "Echo: hello mcp") || out[0].StopReason == omni.StatusFailed {
		t.Errorf("echo outputs %+v, want one Echo: hello mcp", out)
	}
	out := outputsOf(rs, "call_long")
	if len(out) != 1 || !strings.Contains(out[0].Output, "Long running operation completed") {
		t.Fatalf("long-running outputs %+v, want one completed", out)
	}
	// The last notification may race the result (then it is dropped, as
	// late output of any tool); the earlier ones stream before it.
	if pre := streamedBefore(rs, "call_long"); !strings.HasPrefix(pre, "[progress 1/3]\n[progress 2/3]\n") || pre != out[0].Output {
		t.Errorf("long-running partials before the complete output = %q, want the progress lines, then the output %q", pre, out[0].Output)
	}

	// Task 2: abort while the long-running tool runs.
	task2 := e.submit(sid, "abort me")
	rcWaitFor(e, sid, "progress of call_abort", func(r rec) bool {
		return r.msg.Payload.ToolCallID == "call_abort" && strings.Contains(r.msg.Payload.Output, "[progress 1/")
	})
	rcControl(e, sid, omni.CtlAbort, omni.Control{})
	rs, status = e.wait(sid, task2)
	if status != omni.StatusAborted {
		t.Errorf("task 2 status %q, want aborted", status)
	}
	// Abort case A (protocol.md §6): the stopped MCP call's one complete output,
	// aborted and marked interrupted, is on the stream before the abort;
	// the next request pairs it too (checked below).
	if out := outputsOf(rs, "call_abort"); len(out) != 1 || out[0].StopReason != omni.StatusAborted ||
		!strings.Contains(out[0].Output, "[interrupted: tool aborted by user]") {
		t.Errorf("aborted call outputs %+v, want exactly one, aborted, interrupted; stream %v", out, labels(rs, noPartials))
	} else {
		outAt, abortAt := -1, -1
		for i, r := range rs {
			switch {
			case r.class != omni.ClassServer && r.msg.Payload.Type == omni.TypeToolCallOutput && r.msg.Payload.ToolCallID == "call_abort":
				outAt = i
			case r.class != omni.ClassServer && r.msg.Payload.Type == omni.TypeAbort:
				abortAt = i
			}
		}
		if outAt < 0 || abortAt < 0 || outAt > abortAt {
			t.Errorf("aborted output at %d, abort at %d: the output must come before the abort; stream %v", outAt, abortAt, labels(rs, noPartials))
		}
	}

	// Task 3: the server is killed mid-call; the call fails once, the next
	// call works on the restarted server.
	task3 := e.submit(sid, "kill it")
	rcWaitFor(e, sid, "progress of call_kill", func(r rec) bool {
		return r.msg.Payload.ToolCallID == "call_kill" && strings.Contains(r.msg.Payload.Output, "[progress 1/")
	})
	pid := everythingChild(t, entry)
	if pid == 0 {
		t.Fatal("no reference server process found")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	rs, status = e.wait(sid, task3)
	if status != omni.StatusCompleted {
		t.Fatalf("task 3 status %q: %v", status, labels(rs, noPartials))
	}
	if out := outputsOf(rs, "call_kill"); len(out) != 1 || out[0].StopReason != omni.StatusFailed {
		t.Errorf("killed call outputs %+v, want one failed", out)
	}
	if out := outputsOf(rs, "call_echo2"); len(out) != 1 || !strings.Contains(out[0].Output, "Echo: after restart") {
		t.Errorf("call after the restart: %+v, want Echo: after restart", out)
	}
	if p2 := everythingChild(t, entry); p2 == 0 || p2 == pid {
		t.Errorf("server pid after the restart %d (killed %d)", p2, pid)
	}
	checkConnectBeforeToolList(t, rs, 3)
	f.mu.Lock()
	next := string(f.bodies[3])
	f.mu.Unlock()
	if !strings.Contains(next, `"tool_call_id":"call_abort"`) || !strings.Contains(next, "tool aborted by user") {
		t.Errorf("the request after the abort does not pair call_abort with the interrupted output: %.2000s", next)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// The reference server over Streamable HTTP (node dist/index.js
// streamableHttp, listening on $PORT at /mcp).
func TestMCPEverythingOverStreamableHTTP(t *testing.T) {
	entry := mcptest.Everything(t)
	port := freePort(t)
	srv := exec.Command("node", entry, "streamableHttp")
	srv.Env = append(os.Environ(), "PORT="+strconv.Itoa(port))
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	eventually(t, 30*time.Second, "the HTTP server to listen", func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	e := start(t, envOpts{mcpConfig: writeMCPConfig(t, map[string]any{
		"everything": map[string]any{"url": fmt.Sprintf("http://127.0.0.1:%d/mcp", port), "headers": map[string]string{"X-Floe-Test": "${HOME}"}}})})
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"parallel_tool_calls": []any{
			map[string]any{"name": "mcp__everything__echo", "id": "h_echo", "arguments": map[string]any{"message": "over http"}},
			map[string]any{"name": "mcp__everything__trigger-long-running-operation", "id": "h_long", "arguments": map[string]any{"duration": 1, "steps": 2}},
		}}}},
		map[string]any{"steps": []any{map[string]any{"text": "done"}}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, nil)
	rs, status := e.wait(sid, e.submit(sid, "http tools"))
	if status != omni.StatusCompleted {
		t.Fatalf("status %q: %v", status, labels(rs, noPartials))
	}
	checkDiscipline(t, rs)
	checkConnectBeforeToolList(t, rs, 1)
	statuses, results := mcpResults(t, rs)
	if statuses[0] != omni.StatusCompleted || results[0][0].Transport != "http" {
		t.Errorf("mcp_connect_end %v %+v, want completed over http", statuses, results)
	}
	if out := outputsOf(rs, "h_echo"); len(out) != 1 || !strings.Contains(out[0].Output, "Echo: over http") {
		t.Errorf("echo outputs %+v", out)
	}
	if out := outputsOf(rs, "h_long"); len(out) != 1 || !strings.Contains(out[0].Output, "completed") {
		t.Errorf("long-running outputs %+v", out)
	}
	if pre := streamedBefore(rs, "h_long"); !strings.Contains(pre, "[progress 1/2]") {
		t.Errorf("partials before the complete output = %q, want progress", pre)
	}
}

// With three runners, MCP calls spread over them (each runner has its own
// MCP session) and each call has exactly one output.
func TestMCPCallsSpreadOverThreeRunners(t *testing.T) {
	e := start(t, envOpts{runners: 3, mcpConfig: writeMCPConfig(t, map[string]any{"go": map[string]any{"url": mcptest.Server(t)}})})
	const n = 12
	var calls []any
	for i := range n {
		calls = append(calls, map[string]any{"name": "mcp__go__echo", "id": fmt.Sprintf("m%02d", i), "arguments": map[string]any{"text": strconv.Itoa(i)}})
	}
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"parallel_tool_calls": calls}}},
		map[string]any{"steps": []any{map[string]any{"text": "done"}}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, nil)
	// Every runner pulling before the calls go out: one that is still
	// starting (slow under load) would leave all twelve to the others.
	eventually(t, 60*time.Second, "three runners pulling jobs", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cons, err := e.st.JS.Consumer(ctx, omni.ToolsStream, "floe-toolrunner-"+omni.DefaultPool)
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		return err == nil && info.NumWaiting >= 3
	})
	rs, status := e.wait(sid, e.submit(sid, "spread"))
	if status != omni.StatusCompleted {
		t.Fatalf("status %q: %v", status, labels(rs, noPartials))
	}
	sessions := map[string]int{}
	for i := range n {
		id := fmt.Sprintf("m%02d", i)
		out := outputsOf(rs, id)
		if len(out) != 1 || !strings.HasSuffix(out[0].Output, " text="+strconv.Itoa(i)) {
			t.Errorf("%s: outputs %+v, want exactly one echo", id, out)
			continue
		}
		sess, _, _ := strings.Cut(strings.TrimPrefix(out[0].Output, "session="), " ")
		sessions[sess]++
	}
	if len(sessions) < 2 {
		t.Errorf("calls per MCP session %v: all on one runner, want them spread", sessions)
	}
}

// A server whose command is missing is reported in mcp_connect_end and the
// Task still runs; under read-only, a server declared "r" is auto-allowed
// and one without it asks.
func TestMCPMissingServerAndReadOnlyApproval(t *testing.T) {
	url := mcptest.Server(t)
	e := start(t, envOpts{mcpConfig: writeMCPConfig(t, map[string]any{
		"missing": map[string]any{"command": "/nonexistent/floe-mcp"},
		"ro":      map[string]any{"url": url, "permission": "r"},
		"rw":      map[string]any{"url": url},
	})})
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"tool_call": map[string]any{"name": "mcp__ro__write", "id": "r1", "arguments": map[string]any{}}}}},
		map[string]any{"steps": []any{map[string]any{"tool_call": map[string]any{"name": "mcp__rw__write", "id": "w1", "arguments": map[string]any{}}}}},
		map[string]any{"steps": []any{map[string]any{"text": "done"}}},
	}})
	sid := e.session(ref, omni.ApproveReadOnly, nil)
	task := e.submit(sid, "read only")
	// rw's write needs a person: answer its approval request.
	var asked []string
	req := rcWaitFor(e, sid, "an approval request", func(r rec) bool {
		return r.class == omni.ClassServer && r.ev.Type == omni.ServerApprovalRequest
	})
	var tc omni.Message
	if err := omni.Unmarshal(req.ev.ToolCall, &tc); err != nil {
		t.Fatal(err)
	}
	asked = append(asked, tc.Payload.ToolCallID)
	rcControl(e, sid, omni.CtlApprove, omni.Control{ToolCallID: tc.Payload.ToolCallID, Decision: omni.DecisionAllow})
	rs, status := e.wait(sid, task)
	if status != omni.StatusCompleted {
		t.Fatalf("status %q: %v", status, labels(rs, noPartials))
	}
	if len(asked) != 1 || asked[0] != "w1" {
		t.Errorf("approval asked for %v, want only w1 (ro is permission r)", asked)
	}
	for _, id := range []string{"r1", "w1"} {
		if out := outputsOf(rs, id); len(out) != 1 || out[0].Output != "wrote" {
			t.Errorf("%s outputs %+v, want one wrote", id, out)
		}
	}
	statuses, results := mcpResults(t, rs)
	if len(statuses) != 1 || statuses[0] != omni.StatusFailed {
		t.Fatalf("mcp_connect_end statuses %v, want one failed", statuses)
	}
	for _, r := range results[0] {
		switch r.Server {
		case "missing":
			if r.Status != omni.StatusFailed || !strings.Contains(r.Error, "/nonexistent/floe-mcp") {
				t.Errorf("missing: %+v, want failed naming the command", r)
			}
		default:
			if r.Status != omni.StatusCompleted || r.Tools != 2 {
				t.Errorf("%s: %+v, want completed with 2 tools", r.Server, r)
			}
		}
	}
	tl := payloadsOf(rs, omni.TypeToolListReady)
	specs, _ := tl[0].ToolSpecs()
	if names := toolNames(specs); names["mcp__missing__x"] || !names["mcp__ro__echo"] || !names["mcp__rw__write"] || !names["exec_command"] {
		t.Errorf("tool_list_ready names %v", names)
	}
}

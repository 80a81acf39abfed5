package toolrunner_test

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/procfs"
	"floe.dev/services/toolrunner"
)

// toolList asks the default pool for its tools.
func (h *harness) toolList() omni.ToolList {
	h.t.Helper()
	var list omni.ToolList
	bustest.Eventually(h.t, wait, "a tool list reply", func() bool {
		resp, err := h.env.Conn.Request(toolrunner.ToolListSubject(omni.DefaultPool), nil, wait)
		if err != nil {
			return false
		}
		if err := omni.Unpack(resp.Data, &list); err != nil {
			h.t.Fatal(err)
		}
		return true
	})
	return list
}

// call runs one tool job and returns its complete output, after checking
// the segment discipline.
func (h *harness) call(sid, id, name, args string) omni.Payload {
	h.t.Helper()
	h.enqueue(omni.ToolJob{SessionID: sid, ToolCallID: id, Name: name, Arguments: args, Workspace: h.ws, EnqueuedUnixMs: time.Now().UnixMilli()})
	return h.checkSegment(sid, h.waitOutput(sid, id))
}

func TestMCPToolListUnionWithConnectResults(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := mcpConfig(t, map[string]any{
		"go":      map[string]any{"url": httpServer(t, newGoServer(nil, false))},
		"bad":     map[string]any{"url": httpServer(t, newGoServer(nil, true))},
		"missing": map[string]any{"command": "/nonexistent/floe-mcp-server", "args": []string{"x"}},
		"ro":      map[string]any{"url": httpServer(t, newGoServer(nil, false)), "permission": "r"},
	})
	h.start(toolrunner.Config{MCPConfig: cfg})
	list := h.toolList()

	got := map[string]omni.ToolSpec{}
	for _, s := range list.Tools {
		got[s.Name] = s
	}
	for name, want := range map[string][2]string{
		"exec_command": {"rw", "builtin"}, "read_file": {"r", "builtin"},
		"mcp__go__echo": {"r", "mcp:go"}, "mcp__go__fail": {"rw", "mcp:go"}, "mcp__go__hang": {"rw", "mcp:go"},
		"mcp__ro__fail": {"r", "mcp:ro"},
	} {
		s, ok := got[name]
		if !ok {
			t.Errorf("tool %s missing from %d tools", name, len(list.Tools))
			continue
		}
		if s.Permission != want[0] || s.Source != want[1] {
			t.Errorf("%s: permission %q source %q, want %q %q", name, s.Permission, s.Source, want[0], want[1])
		}
	}
	if s := got["mcp__go__echo"]; !strings.Contains(string(s.Parameters), `"required":["text"]`) || s.Description != "Echoes text." {
		t.Errorf("echo spec = %q %s, want the server's description and schema", s.Description, s.Parameters)
	}
	for name := range got {
		if strings.HasPrefix(name, "mcp__bad__") || strings.HasPrefix(name, "mcp__missing__") {
			t.Errorf("tool %s offered from a failed server", name)
		}
	}

	res := map[string]omni.MCPConnectResult{}
	for _, r := range list.MCP {
		res[r.Server] = r
	}
	if len(list.MCP) != 4 {
		t.Fatalf("results %+v, want one per server", list.MCP)
	}
	if r := res["go"]; r.Status != omni.StatusCompleted || r.Transport != "http" || r.Tools != 9 || r.Error != "" {
		t.Errorf("go result %+v, want completed http with 9 tools", r)
	}
	if r := res["bad"]; r.Status != omni.StatusFailed || !strings.Contains(r.Error, `tool "broken": input schema`) {
		t.Errorf("bad result %+v, want failed naming the broken tool's schema", r)
	}
	if r := res["missing"]; r.Status != omni.StatusFailed || r.Transport != "stdio" || !strings.Contains(r.Error, "/nonexistent/floe-mcp-server") {
		t.Errorf("missing result %+v, want failed naming the command", r)
	}
}

func TestMCPCallsRunUnderTheToolRules(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := &goServer{}
	cfg := mcpConfig(t, map[string]any{
		"go":    map[string]any{"url": httpServer(t, newGoServer(nil, false)), "timeout_ms": 60000},
		"short": map[string]any{"url": httpServer(t, newGoServer(g, false)), "timeout_ms": 400},
	})
	h.start(toolrunner.Config{MCPConfig: cfg, MaxOutput: 2000})
	const sid = "s-mcp-calls"

	tests := []struct {
		name, tool, args string
		failed           bool
		want             []string // substrings of the output
		images           int
	}{
		{"echo", "mcp__go__echo", `{"text":"hi"}`, false, []string{"echo: hi"}, 0},
		{"missing required argument", "mcp__go__echo", `{}`, true, []string{"invalid arguments for mcp__go__echo", "text"}, 0},
		{"wrong argument type", "mcp__go__echo", `{"text":5}`, true, []string{"invalid arguments"}, 0},
		{"extra argument", "mcp__go__echo", `{"text":"a","x":1}`, true, []string{"invalid arguments"}, 0},
		{"not JSON", "mcp__go__echo", `{"text":`, true, []string{"invalid arguments", "not valid JSON"}, 0},
		{"isError", "mcp__go__fail", ``, true, []string{"it broke"}, 0},
		{"image", "mcp__go__image", `{}`, false, []string{"a picture"}, 1},
		{"never answers", "mcp__short__hang", `{}`, true, []string{"[timed out after 400ms]"}, 0},
		{"flood", "mcp__go__flood", `{}`, false, []string{"[progress 1/200] ppp", "[output truncated:"}, 0},
		{"progress", "mcp__go__progress", `{}`, false, []string{"[progress 1/3] step 1\n[progress 2/3] step 2\n[progress 3/3] step 3\n", "finished"}, 0},
		{"unknown tool of a server", "mcp__go__nope", `{}`, true, []string{`has no tool "nope"`}, 0},
		{"unknown server", "mcp__zz__echo", `{}`, true, []string{`no MCP server "zz"`}, 0},
	}
	for i, tt := range tests {
		p := h.call(sid, fmt.Sprintf("c%02d", i), tt.tool, tt.args)
		if failed := p.StopReason == omni.StatusFailed; failed != tt.failed {
			t.Errorf("%s: stop_reason %q, want failed=%v; output %q", tt.name, p.StopReason, tt.failed, p.Output)
		}
		for _, w := range tt.want {
			if !strings.Contains(p.Output, w) {
				t.Errorf("%s: output %.300q does not contain %q", tt.name, p.Output, w)
			}
		}
		if imgs := p.ImageURLs(); len(imgs) != tt.images || (tt.images > 0 && !strings.HasPrefix(imgs[0], "data:image/png;base64,iVBORw0KGgo")) {
			t.Errorf("%s: images %q, want %d PNG data URL", tt.name, imgs, tt.images)
		}
		if n := len([]rune(p.Output)); n > 2*2000+200 {
			t.Errorf("%s: output has %d characters, over the cap", tt.name, n)
		}
	}
	// The timed-out request was cancelled on the server, not left running.
	bustest.Eventually(t, wait, "the server sees the hung call cancelled", func() bool { return len(g.cancels()) == 1 })
}

func TestMCPAbortCancelsTheServerRequest(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := &goServer{}
	cfg := mcpConfig(t, map[string]any{"go": map[string]any{"url": httpServer(t, newGoServer(g, false))}})
	h.start(toolrunner.Config{MCPConfig: cfg})
	const sid = "s-mcp-abort"
	hb := h.watchHeartbeats(sid)
	h.enqueue(omni.ToolJob{SessionID: sid, ToolCallID: "h1", Name: "mcp__go__hang", Arguments: `{}`, Workspace: h.ws, EnqueuedUnixMs: time.Now().UnixMilli()})
	bustest.Eventually(t, wait, "the hung call reaches the server", func() bool { return len(hb.naming("h1")) > 0 && g.hangs() == 1 })
	if reply := h.cancel(sid, "h1"); len(reply.ToolCallIDs) != 1 || reply.ToolCallIDs[0] != "h1" {
		t.Fatalf("cancel reply %+v, want h1 stopped", reply)
	}
	bustest.Eventually(t, wait, "the server sees the call cancelled", func() bool { return len(g.cancels()) == 1 })
	// The cancelled call's one output is the aborted one.
	outs := completes(of(h.session(sid), "h1"))
	if len(outs) != 1 || outs[0].msg.Payload.StopReason != omni.StatusAborted || outs[0].msg.Payload.Output != omni.InterruptedOutput {
		t.Errorf("cancelled call's outputs = %+v, want one aborted %q", outs, omni.InterruptedOutput)
	}
}

// stdioConfig runs this test binary as the stdio server.
func stdioConfig(t *testing.T, extra map[string]any) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	srv := map[string]any{"command": exe, "env": map[string]string{stdioServerVar: "1"}}
	for k, v := range extra {
		srv[k] = v
	}
	return mcpConfig(t, map[string]any{"go": srv})
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func TestMCPStdioServerRestartsAfterItDies(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.start(toolrunner.Config{MCPConfig: stdioConfig(t, nil)})
	const sid = "s-mcp-restart"
	if _, err := strconv.Atoi(h.call(sid, "p1", "mcp__go__pid", `{}`).Output); err != nil {
		t.Fatal(err)
	}
	// The host's pid: a confined server's own is its PID namespace's.
	servers := stdioServers(t)
	if len(servers) != 1 {
		t.Fatalf("server processes %v, want one", servers)
	}
	pid1 := servers[0]

	// Killed mid-call: one failed output.
	hb := h.watchHeartbeats(sid)
	h.enqueue(omni.ToolJob{SessionID: sid, ToolCallID: "k1", Name: "mcp__go__hang", Arguments: `{}`, Workspace: h.ws, EnqueuedUnixMs: time.Now().UnixMilli()})
	bustest.Eventually(t, wait, "the hung call is running", func() bool { return len(hb.naming("k1")) > 0 })
	time.Sleep(100 * time.Millisecond) // let the request reach the server
	if err := syscall.Kill(pid1, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p := h.checkSegment(sid, h.waitOutput(sid, "k1"))
	if p.StopReason != omni.StatusFailed || !strings.Contains(p.Output, "MCP call to mcp__go__hang failed") {
		t.Errorf("killed call: stop_reason %q output %q, want a failed MCP call", p.StopReason, p.Output)
	}
	if n := len(completes(of(h.session(sid), "k1"))); n != 1 {
		t.Errorf("killed call has %d complete outputs, want 1", n)
	}

	// The next call works, on a new process (once the manager has seen
	// the death: confined, the server's exit reaches it through the
	// sandbox's helper, a moment later).
	bustest.Eventually(t, wait, "the server restarted", func() bool {
		s := stdioServers(t)
		return len(s) == 1 && s[0] != pid1
	})
	if p := h.call(sid, "e1", "mcp__go__echo", `{"text":"again"}`); p.Output != "echo: again" || p.StopReason == omni.StatusFailed {
		t.Errorf("call after the restart: %q (%q), want echo: again", p.Output, p.StopReason)
	}
	h.call(sid, "p2", "mcp__go__pid", `{}`)
	if servers := stdioServers(t); len(servers) != 1 || servers[0] == pid1 {
		t.Errorf("server processes after the restart %v, before %d", servers, pid1)
	}

	// A tool the server adds (notifications/tools/list_changed) is listed
	// and callable.
	h.call(sid, "g1", "mcp__go__grow", `{}`)
	bustest.Eventually(t, wait, "the new tool listed", func() bool {
		for _, s := range h.toolList().Tools {
			if s.Name == "mcp__go__grown" {
				return true
			}
		}
		return false
	})
	if p := h.call(sid, "g2", "mcp__go__grown", `{}`); p.Output != "new tool" {
		t.Errorf("new tool's output %q", p.Output)
	}
}

// Not parallel: it sets variables and counts this process's children.
func TestMCPStdioServerIsLazyExpandsEnvAndIsStoppedAtShutdown(t *testing.T) {
	t.Setenv("FLOE_TEST_MCP_EXPANDED", "s3cret")
	h := newHarness(t)
	r := h.start(toolrunner.Config{MCPConfig: stdioConfig(t, map[string]any{
		"env": map[string]string{stdioServerVar: "1", "FLOE_TEST_SECRET": "${FLOE_TEST_MCP_EXPANDED}"}})})
	// Asking for the server names connects nothing.
	body, _ := omni.Pack(&omni.ToolListRequest{ServersOnly: true})
	var names omni.ToolList
	bustest.Eventually(t, wait, "a servers-only reply", func() bool {
		resp, err := h.env.Conn.Request(toolrunner.ToolListSubject(omni.DefaultPool), body, wait)
		return err == nil && omni.Unpack(resp.Data, &names) == nil
	})
	if len(names.Servers) != 1 || names.Servers[0] != "go" || len(names.Tools) != 0 || len(names.MCP) != 0 {
		t.Errorf("servers-only reply %+v, want just the server name", names)
	}
	time.Sleep(300 * time.Millisecond)
	if kids := stdioServers(t); len(kids) != 0 {
		t.Errorf("server processes %v before anything needed them, want none (lazy start)", kids)
	}
	const sid = "s-mcp-lazy"
	// The declared env is expanded; the toolrunner's own variables stay
	// out (the same allow-list as exec_command).
	if p := h.call(sid, "v1", "mcp__go__env", `{}`); p.Output != "secret=s3cret leaked=" {
		t.Errorf("server env: %q, want the expanded secret and nothing else", p.Output)
	}
	h.call(sid, "p1", "mcp__go__pid", `{}`)
	kids := stdioServers(t)
	if len(kids) != 1 {
		t.Fatalf("server processes %v, want exactly one", kids)
	}
	pid := kids[0]
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Errorf("server %d still running after the toolrunner stopped", pid)
	}
}

// stdioServers returns the host pids of this process's descendants that
// run this binary as an MCP server (not the sandbox's helper, which has
// the same environment besides its own marker).
func stdioServers(t *testing.T) []int {
	t.Helper()
	var out []int
	for _, pid := range procfs.Descendants(os.Getpid()) {
		env := procfs.Environ(pid)
		if slices.Contains(env, stdioServerVar+"=1") && !slices.Contains(env, "FLOE_SANDBOX_INIT=1") {
			out = append(out, pid)
		}
	}
	return out
}

func TestMCPConfigErrorsNameTheFileAndPosition(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tests := []struct {
		name, body string
		want       []string
	}{
		{"syntax", "{\n  \"servers\": {\n    \"a\": {\"command\": \"x\",}\n  }\n}", []string{"invalid JSON at line 3, column"}},
		{"wrong type", `{"servers": {"a": {"command": 5}}}`, []string{"line 1, column", "servers.command", "string"}},
		{"unknown field", `{"servers": {"a": {"comand": "x"}}}`, []string{"unknown field", "comand"}},
		{"no transport", `{"servers": {"a": {}}}`, []string{`server "a"`, "command"}},
		{"both transports", `{"servers": {"a": {"command": "x", "url": "http://h/mcp"}}}`, []string{"both"}},
		{"bad permission", `{"servers": {"a": {"command": "x", "permission": "x"}}}`, []string{`permission "x"`}},
		{"bad name", `{"servers": {"a__b": {"command": "x"}}}`, []string{`server "a__b"`}},
		{"no servers", `{}`, []string{`no "servers"`}},
		{"empty", ``, []string{"empty"}},
	}
	for _, tt := range tests {
		p := dir + "/" + strings.ReplaceAll(tt.name, " ", "-") + ".json"
		if err := os.WriteFile(p, []byte(tt.body), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := toolrunner.Config{MCPConfig: p}
		err := cfg.Validate()
		if err == nil || !errors.Is(err, toolrunner.ErrInvalidConfig) {
			t.Errorf("%s: Validate() = %v, want an invalid config error", tt.name, err)
			continue
		}
		for _, w := range append(tt.want, "FLOE_MCP_CONFIG "+p) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not contain %q", tt.name, err, w)
			}
		}
	}
	// Run refuses to start on it too.
	h := newHarness(t)
	err := toolrunner.Run(t.Context(), h.env.Conn, toolrunner.Config{MCPConfig: dir + "/syntax.json"}, zerolog.Nop())
	if err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("Run = %v, want the config error", err)
	}
}

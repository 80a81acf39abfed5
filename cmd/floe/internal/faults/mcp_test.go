package faults

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"floe.dev/cmd/floe/internal/mcptest"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/procfs"
)

// A toolrunner killed (SIGKILL) in the middle of an MCP call: the call gets
// the same one failed "outcome unknown, not re-run" output as a built-in
// tool; the runner's stdio MCP server dies with it (no orphan); the next
// MCP call runs on the other runner, on its own server.
func TestToolrunnerKilledMidMCPCall(t *testing.T) {
	entry := mcptest.Everything(t)
	const hbTimeout = 3 * time.Second
	c := newCluster(t, 1, 1)
	// The server daemonizes a sleep before it starts (setsid nohup, its
	// parent gone): that grandchild must die with the runner too. The
	// entry is bash's $0, so that the sandbox lets the server read it.
	mark := fmt.Sprintf("1000.%d32", os.Getpid())
	cfg, _ := json.Marshal(map[string]any{"servers": map[string]any{
		"everything": map[string]any{"command": "bash", "args": []string{"-c",
			fmt.Sprintf(`(setsid nohup sleep %s >/dev/null 2>&1 &); exec node "$0" stdio`, mark), entry}}}})
	cfgPath := filepath.Join(t.TempDir(), "mcp.json")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	c.service("tracer", "tracer")
	runners := map[int]*proc{}
	for _, name := range []string{"toolrunner-1", "toolrunner-2"} {
		p := c.service("toolrunner", name, "FLOE_MCP_CONFIG="+cfgPath)
		runners[p.pid()] = p
	}
	c.service("engine", "engine", fmt.Sprintf("FLOE_HEARTBEAT_TIMEOUT_MS=%d", hbTimeout.Milliseconds()))

	call := func(id, tool string, args map[string]any) map[string]any {
		return map[string]any{"tool_call": map[string]any{"name": "mcp__everything__" + tool, "id": id, "arguments": args}}
	}
	ref := c.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{call("call_long", "trigger-long-running-operation", map[string]any{"duration": 30, "steps": 30})}},
		map[string]any{"steps": []any{call("call_next", "echo", map[string]any{"message": "after the kill"})}},
		map[string]any{"steps": []any{text("Done.", 1, 0)}},
	}})
	sid := c.session(ref)
	hb := c.watchHeartbeats(sid)
	task := c.submit(sid, "run the long MCP job")

	victim := runners[runnerPid(waitBeat(t, hb, "call_long"))]
	if victim == nil {
		t.Fatal("heartbeat from an unknown runner")
	}
	var server int
	eventually(t, 30*time.Second, "the victim's MCP server process", func() bool {
		for _, pid := range procfs.Descendants(victim.pid()) {
			if procfs.HasArgs(procfs.Args(pid), entry) {
				server = pid
				return true
			}
		}
		return false
	})
	t.Cleanup(func() { _ = syscall.Kill(-server, syscall.SIGKILL) })
	var daemon int
	eventually(t, 10*time.Second, "the server's daemonized sleep", func() bool {
		for _, pid := range procfs.WithArgs("sleep", mark) {
			if procfs.DescendsFrom(pid, victim.pid()) {
				daemon = pid
				return true
			}
		}
		return false
	})
	t.Cleanup(func() { _ = syscall.Kill(daemon, syscall.SIGKILL) })
	victim.kill(t)
	eventually(t, 10*time.Second, "the killed runner's MCP server's daemonized sleep to end", func() bool { return !procfs.Alive(daemon) })

	rs, status := c.wait(sid, task, 90*time.Second, nil)
	if status != omni.StatusCompleted {
		t.Fatalf("task ended %q, want completed; last: %v", status, lastLabels(rs, 10))
	}
	o := checkSession(t, rs, "run the long MCP job")
	p := o.outputs["call_long"].msg.Payload
	if p.StopReason != omni.StatusFailed || !strings.Contains(p.Output, "outcome is unknown") || !strings.Contains(p.Output, "not re-run") {
		t.Errorf("lost MCP call's output = %q (stop_reason %q), want the failed outcome-unknown output", p.Output, p.StopReason)
	}
	if got := o.outputs["call_next"].msg.Payload; got.StopReason == omni.StatusFailed || !strings.Contains(got.Output, "Echo: after the kill") {
		t.Errorf("next MCP call's output %q (stop_reason %q)", got.Output, got.StopReason)
	}
	eventually(t, 10*time.Second, "the killed runner's MCP server to exit", func() bool { return !procfs.Alive(server) })
	c.checkIdle(sid, omni.StatusCompleted)
	c.traceEqualsStream(sid)
	c.noViolations()
}

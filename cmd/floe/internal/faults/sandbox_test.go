package faults

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
)

// The probe of issue 20, as a test: a tool of a real deployment (every
// service a process, NATS with passwords, a gateway with a token) reads no
// token, key or password through /proc, and cannot open a connection to
// the gateway or to any NATS port, so nothing it can reach approves a call
// or puts a forged message into another Session; a port of another service
// on the host's loopback stays reachable (network on).
func TestToolReachesNoSecretAndNoFloePort(t *testing.T) {
	c := newCluster(t, 1, 1)
	nd := c.nodes[0]
	gwPort := freePort(t)
	otherPort := otherService(t)
	const token = "probe-token-5f1e"
	gwAddr := fmt.Sprintf("FLOE_HTTP_ADDR=127.0.0.1:%d", gwPort)
	clusterPorts := fmt.Sprintf("FLOE_SANDBOX_DENY_PORTS=%d,%d", nd.route, nd.monitor)
	c.service("tracer", "tracer")
	tr := c.service("toolrunner", "toolrunner", gwAddr, clusterPorts, "OPENAI_API_KEY=sk-probe-key-77")
	c.service("engine", "engine")
	c.service("gateway", "gateway", gwAddr, "FLOE_API_TOKEN="+token)
	// It said at start which backend confines its tools, once, and that
	// one is not "none".
	tr.waitLog(t, `"message":"tool sandbox"`, 10*time.Second)
	if log := tr.log(); strings.Count(log, `"message":"tool sandbox`) != 1 || strings.Contains(log, "NONE AVAILABLE") {
		t.Errorf("the toolrunner's start log, want one \"tool sandbox\" line naming a backend:\n%s", tr.tail(30))
	}

	var probe strings.Builder
	probe.WriteString(`cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -E 'PASSWORD|TOKEN|KEY' ; `)
	for _, p := range []int{gwPort, nd.client, nd.route, nd.monitor, otherPort} {
		fmt.Fprintf(&probe, "if (exec 3<>/dev/tcp/127.0.0.1/%d) 2>/dev/null; then echo OPEN-%d; else echo CLOSED-%d; fi; ", p, p, p)
	}
	fmt.Fprintf(&probe, "curl -s -m 2 -X POST -H 'Authorization: Bearer %s' http://127.0.0.1:%d/api/sessions -d '{}' || echo CURL-FAILED", token, gwPort)
	ref := c.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{execCall("probe", probe.String())}},
		map[string]any{"steps": []any{text("Done.", 1, 0)}},
	}})
	sid := c.session(ref)
	task := c.submit(sid, "probe")
	rs, status := c.wait(sid, task, 90*time.Second, nil)
	if status != omni.StatusCompleted {
		t.Fatalf("task ended %q; last: %v", status, lastLabels(rs, 10))
	}
	out := checkSession(t, rs, "probe").outputs["probe"].msg.Payload.Output
	t.Logf("probe output:\n%s", out)
	secrets := []string{token, "sk-probe-key-77"}
	for _, pw := range c.passwords {
		secrets = append(secrets, pw)
	}
	for _, s := range secrets {
		if s != "" && strings.Contains(out, s) {
			t.Errorf("the tool read a secret (%.6s…) through /proc", s)
		}
	}
	for _, p := range []int{gwPort, nd.client, nd.route, nd.monitor} {
		if !strings.Contains(out, fmt.Sprintf("CLOSED-%d", p)) {
			t.Errorf("Floe port %d reachable from the tool", p)
		}
	}
	if !strings.Contains(out, fmt.Sprintf("OPEN-%d", otherPort)) {
		t.Errorf("another loopback service (port %d) unreachable with network on", otherPort)
	}
	if strings.Contains(out, `"id"`) {
		t.Errorf("the tool created a Session through the gateway: %s", out)
	}
	c.noViolations()
}

// The same probe from a hook command (protocol.md §7: "a hook command runs
// under the same sandbox as tools"): a pre_tool_use hook of a real
// deployment's engine reads no token, key or password through /proc, no
// other Workspace and no Trace, and cannot connect to the gateway or any
// NATS port, while another loopback service stays reachable; it answers
// its findings as a denial's reason, which the model reads as the call's
// output.
func TestHookReachesNoSecretAndNoFloePort(t *testing.T) {
	c := newCluster(t, 1, 1)
	nd := c.nodes[0]
	gwPort := freePort(t)
	otherPort := otherService(t)
	const token = "probe-token-5f1e"
	otherWS := filepath.Join(c.home, "workspaces", "other", "secret.txt")
	planted := filepath.Join(c.home, "traces", "planted.jsonl")
	for path, body := range map[string]string{otherWS: "OTHER-WORKSPACE-SECRET", planted: "TRACE-SECRET"} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var probe strings.Builder
	probe.WriteString("#!/bin/bash\ncat >/dev/null\nfindings=$( {\n")
	probe.WriteString(`cat /proc/[0-9]*/environ | tr '\0' '\n' | grep -E 'PASSWORD|TOKEN|KEY'` + "\n")
	probe.WriteString("cat " + otherWS + " " + planted + "\n")
	for _, p := range []int{gwPort, nd.client, nd.route, nd.monitor, otherPort} {
		fmt.Fprintf(&probe, "if (exec 3<>/dev/tcp/127.0.0.1/%d) 2>/dev/null; then echo OPEN-%d; else echo CLOSED-%d; fi\n", p, p, p)
	}
	probe.WriteString("} 2>&1 | tr -cd '[:print:]\\n' | tr -d '\"\\\\' | tr '\\n' ' ' )\n")
	probe.WriteString(`printf '{"decision":"deny","reason":"%s"}' "$findings"` + "\n")
	hook := filepath.Join(c.dir, "probe-hook.sh")
	if err := os.WriteFile(hook, []byte(probe.String()), 0o755); err != nil {
		t.Fatal(err)
	}
	hooksFile := filepath.Join(c.dir, "hooks.json")
	if err := os.WriteFile(hooksFile, []byte(`{"hooks":{"pre_tool_use":[{"name":"probe","command":"`+hook+`"}]}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	gwAddr := fmt.Sprintf("FLOE_HTTP_ADDR=127.0.0.1:%d", gwPort)
	clusterPorts := fmt.Sprintf("FLOE_SANDBOX_DENY_PORTS=%d,%d", nd.route, nd.monitor)
	c.service("tracer", "tracer")
	c.service("toolrunner", "toolrunner", gwAddr, clusterPorts)
	eng := c.service("engine", "engine", gwAddr, clusterPorts, "FLOE_HOOKS="+hooksFile, "OPENAI_API_KEY=sk-probe-key-77")
	eng.waitLog(t, `"hook sandbox"`, 10*time.Second)
	c.service("gateway", "gateway", gwAddr, "FLOE_API_TOKEN="+token)

	ref := c.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{execCall("probe", "echo the tool ran")}},
		map[string]any{"steps": []any{text("Done.", 1, 0)}},
	}})
	sid := c.session(ref)
	task := c.submit(sid, "probe")
	rs, status := c.wait(sid, task, 90*time.Second, nil)
	if status != omni.StatusCompleted {
		t.Fatalf("task ended %q; last: %v", status, lastLabels(rs, 10))
	}
	out := checkSession(t, rs, "probe").outputs["probe"].msg.Payload.Output
	t.Logf("the call's output:\n%s", out)
	if !strings.HasPrefix(out, "Tool call denied by the probe hook: ") || strings.Contains(out, "the tool ran") {
		t.Fatalf("the hook did not deny with its findings: %q", out)
	}
	secrets := []string{token, "sk-probe-key-77", "OTHER-WORKSPACE-SECRET", "TRACE-SECRET"}
	for _, pw := range c.passwords {
		secrets = append(secrets, pw)
	}
	for _, s := range secrets {
		if s != "" && strings.Contains(out, s) {
			t.Errorf("the hook read a secret (%.6s…)", s)
		}
	}
	for _, p := range []int{gwPort, nd.client, nd.route, nd.monitor} {
		if !strings.Contains(out, fmt.Sprintf("CLOSED-%d", p)) {
			t.Errorf("Floe port %d reachable from the hook", p)
		}
	}
	if !strings.Contains(out, fmt.Sprintf("OPEN-%d", otherPort)) {
		t.Errorf("another loopback service (port %d) unreachable from the hook with network on", otherPort)
	}
	c.noViolations()
}

// otherService listens on a loopback port, as another service of the
// host, accepting and closing connections until the test ends, and
// returns the port.
func otherService(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().(*net.TCPAddr).Port
}

package faults

import (
	"fmt"
	"net"
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
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	go func() {
		for {
			conn, err := other.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	otherPort := other.Addr().(*net.TCPAddr).Port
	const token = "probe-token-5f1e"
	gwAddr := fmt.Sprintf("FLOE_HTTP_ADDR=127.0.0.1:%d", gwPort)
	clusterPorts := fmt.Sprintf("FLOE_SANDBOX_DENY_PORTS=%d,%d", nd.route, nd.monitor)
	c.service("tracer", "tracer")
	c.service("toolrunner", "toolrunner", gwAddr, clusterPorts, "OPENAI_API_KEY=sk-probe-key-77")
	c.service("engine", "engine")
	c.service("gateway", "gateway", gwAddr, "FLOE_API_TOKEN="+token)

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

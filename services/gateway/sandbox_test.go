package gateway_test

import (
	"testing"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// GET /api/sessions/:id reports the tool confinement the runners of the
// pool answer with (SPEC §7), asked on floe.toollist.<pool>.
func TestGetSessionReportsTheRunnersSandbox(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g := startGateway(t, env, "", nil)
	sub, err := env.Conn.Subscribe("floe.toollist."+omni.DefaultPool, func(m *nats.Msg) {
		b, _ := omni.Pack(&omni.ToolList{Runner: "r1", Sandbox: &omni.SandboxInfo{Backend: "bwrap", Network: "off"}})
		m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	env.Conn.Flush()
	sess := createSession(t, g.Alice, client.CreateSession{})
	got, err := g.Alice.GetSession(ctxT(t), sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := (client.Sandbox{Backend: "bwrap", Network: "off"}); got.Sandbox == nil || *got.Sandbox != want {
		t.Errorf("GET sandbox = %+v, want %+v", got.Sandbox, want)
	}
}

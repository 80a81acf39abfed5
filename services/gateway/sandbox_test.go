package gateway_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

// GET /api/sessions/:id reports the tool confinement the runners of the
// pool answer with (protocol.md §7), asked on floe.toollist.<pool>.
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

// A Workspace never lies inside $FLOE_HOME except its workspaces/, even
// when a configured root contains $FLOE_HOME (the default roots do: the
// user's home holds ~/.floe): no Session works inside the store, whatever
// its approval mode (protocol.md §7, §8).
func TestWorkspaceInsideFloeHomeIsRefused(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	home := filepath.Join(base, "floe-home")
	for _, d := range []string{"nats", "jetstream", "traces", "workspaces/mine"} {
		if err := os.MkdirAll(filepath.Join(home, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	env := newBus(t)
	g := startGateway(t, env, home, func(c *gateway.Config) { c.WorkspaceRoots = []string{base} })
	for _, d := range []string{home, filepath.Join(home, "nats"), filepath.Join(home, "jetstream"), filepath.Join(home, "traces")} {
		_, err := g.Alice.CreateSession(ctxT(t), client.CreateSession{Workspace: d})
		if !client.IsCode(err, omni.CodeBadRequest) || !strings.Contains(err.Error(), "FLOE_HOME") {
			t.Errorf("workspace %s: %v, want 400 naming $FLOE_HOME", d, err)
		}
	}
	if _, err := g.Alice.CreateSession(ctxT(t), client.CreateSession{Workspace: filepath.Join(home, "workspaces", "mine")}); err != nil {
		t.Errorf("workspace under $FLOE_HOME/workspaces: %v", err)
	}
	if _, err := g.Alice.CreateSession(ctxT(t), client.CreateSession{Workspace: base}); err != nil {
		t.Errorf("workspace beside $FLOE_HOME: %v", err)
	}
}

package gateway_test

import (
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/omni/cmdpolicy"
	"floe.dev/services/gateway/client"
)

// The command policy is copied into each Session when it is created and
// shown by GET /api/sessions/:id; changing the deployment's policy later
// leaves existing Sessions as they were.
func TestCommandPolicySnapshottedAtCreation(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g := startGateway(t, env, "", nil) // no policy configured: the factory set
	ctx := ctxT(t)
	first := createSession(t, g.Alice, client.CreateSession{})
	got, err := g.Alice.GetSession(ctx, first.ID)
	if err != nil {
		t.Fatal(err)
	}
	if p := got.CommandPolicy; p == nil || p.Source != cmdpolicy.SourceFactory || len(p.Rules) != len(cmdpolicy.Factory().Rules) {
		t.Fatalf("default commandPolicy = %+v, want the factory set", p)
	}
	if got.CommandPolicy.Rules[0].Name != "rm-recursive-force" || got.CommandPolicy.Rules[0].Pattern == "" {
		t.Fatalf("first factory rule = %+v", got.CommandPolicy.Rules[0])
	}

	// The deployment now has its own rules file (a restarted gateway).
	off := false
	g.cfg.CommandPolicy = &omni.CommandPolicy{Source: "/etc/floe/policy.json", Rules: []omni.CommandRule{
		{Name: "no-curl", Pattern: `^curl\s`, Description: "no downloads"},
		{Name: "spare", Pattern: `^wget\s`, Enabled: &off},
	}}
	g.swap(t)
	second := createSession(t, g.Alice, client.CreateSession{})
	got2, err := g.Alice.GetSession(ctx, second.ID)
	if err != nil {
		t.Fatal(err)
	}
	if p := got2.CommandPolicy; p == nil || p.Source != "/etc/floe/policy.json" || len(p.Rules) != 2 ||
		p.Rules[0].Name != "no-curl" || p.Rules[0].Description != "no downloads" || p.Rules[1].Enabled == nil || *p.Rules[1].Enabled {
		t.Fatalf("commandPolicy from the rules file = %+v", p)
	}
	again, err := g.Alice.GetSession(ctx, first.ID)
	if err != nil {
		t.Fatal(err)
	}
	if again.CommandPolicy.Source != cmdpolicy.SourceFactory {
		t.Fatalf("the older Session's policy changed to %+v", again.CommandPolicy)
	}

	g.cfg.CommandPolicy = cmdpolicy.Off()
	g.swap(t)
	third := createSession(t, g.Alice, client.CreateSession{})
	if p := third.CommandPolicy; p == nil || p.Source != cmdpolicy.SourceOff || len(p.Rules) != 0 {
		t.Fatalf("commandPolicy off = %+v", p)
	}
}

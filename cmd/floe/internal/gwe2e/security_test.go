package gwe2e

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/bus/embed"
	"floe.dev/pkg/omni"
)

// The attack: any local process connects to `floe serve`'s NATS port and,
// as if it were a gateway without a token, reads and drives every Session.
// The port requires the users floe serve generated; their passwords are
// private to the Floe user; the nats CLI gets a context file.
func TestServeNATSPortRequiresCredentials(t *testing.T) {
	h := newServeHome(t, "scripted:demo")
	p := h.serve()
	url := "nats://" + h.natsAddr

	for name, opts := range map[string][]nats.Option{
		"no credentials": nil,
		"wrong password": {nats.UserInfo(embed.UserAdmin, "guess")},
	} {
		nc, err := nats.Connect(url, append(opts, nats.Timeout(5*time.Second), nats.NoReconnect())...)
		if err == nil {
			nc.Close()
			t.Errorf("%s: connected to floe serve's NATS port", name)
		}
	}

	dir := stack.CredentialsDir(h.floeHome())
	for _, u := range embed.Users {
		fi, err := os.Stat(embed.PasswordFile(dir, u))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s password file: %v mode %v, want 0600", u, err, fi.Mode().Perm())
		}
	}
	// What floe serve printed points at a context that works, as ops.
	ctxPath := embed.ContextFile(dir, embed.UserOps)
	for deadline := time.Now().Add(waitLimit); !strings.Contains(p.errs.String(), "nats --context "+ctxPath); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("floe serve did not say how to use the nats CLI:\n%s", p.errs.String())
		}
	}
	b, err := os.ReadFile(ctxPath)
	if err != nil {
		t.Fatal(err)
	}
	var nctx struct{ URL, User, Password string }
	if err := json.Unmarshal(b, &nctx); err != nil || nctx.URL != url || nctx.User != embed.UserOps {
		t.Fatalf("context %s = %s (%v)", ctxPath, b, err)
	}
	ops, err := nats.Connect(nctx.URL, nats.UserInfo(nctx.User, nctx.Password))
	if err != nil {
		t.Fatalf("ops from the context: %v", err)
	}
	defer ops.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ops.RequestWithContext(ctx, "$JS.API.STREAM.INFO."+omni.SessionsStream, nil); err != nil {
		t.Errorf("ops stream info: %v", err)
	}
	// Writes are not ops's to make: the purge is dropped, unanswered.
	short, cancelShort := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelShort()
	if _, err := ops.RequestWithContext(short, "$JS.API.STREAM.PURGE."+omni.SessionsStream, nil); err == nil {
		t.Error("ops purged FLOE_SESSIONS")
	}
}

// A non-loopback NATS listener without authentication refuses to start, as
// the HTTP side does.
func TestServeRefusesAnOpenNonLoopbackNATSListener(t *testing.T) {
	h := newServeHome(t, "scripted:demo")
	h.natsAddr = "0.0.0.0:0"
	h.extraEnv = append(h.extraEnv, "FLOE_NATS_AUTH=off")
	p := h.start("serve")
	if code := p.wait(); code == 0 {
		t.Fatalf("floe serve exited 0 with an open 0.0.0.0 listener")
	}
	if !strings.Contains(p.errs.String(), "non-loopback") {
		t.Errorf("stderr does not say why:\n%s", p.errs.String())
	}
}

package webe2e

import (
	"strings"
	"testing"

	"floe.dev/services/gateway/client"
)

// The header shows the Session's tool sandbox {backend, network} as GET
// /api/sessions/:id reports it (issue 20 point 6): here the backend `auto`
// takes on this host (never off: CI runs the confined path) with the
// network off, so both fields are in the text.
func TestHeaderShowsTheSandbox(t *testing.T) {
	s := newServer(t, nil, "FLOE_SANDBOX_NETWORK=off")
	sid := s.session(t, "", client.CreateSession{})
	s.runnerUp(t, sid)
	got, err := s.api("").GetSession(ctxT(t), sid)
	if err != nil {
		t.Fatal(err)
	}
	sb := got.Sandbox
	if sb == nil || sb.Backend == "" || sb.Backend == "off" || sb.Network != "off" {
		t.Fatalf("GET reports sandbox %+v, want a confining backend with network off", sb)
	}
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	want := "sandbox " + sb.Backend + ", network off"
	tb.until("the sandbox in the header", `document.getElementById('s-model').textContent.endsWith(`+jsString(" · "+want)+`)`)
	if h := eval[string](tb, `document.getElementById('s-model').textContent`); strings.Contains(h, "UNCONFINED") {
		t.Fatalf("header %q", h)
	}
}

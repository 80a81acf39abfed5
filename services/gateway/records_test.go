package gateway_test

import (
	"net/http"
	"strings"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// A Session record that does not decode is skipped by the list (which
// keeps answering for everyone), counted in a metric, answers 500 on GET
// and can be deleted: by its owner when its principal field still reads,
// by any caller when nothing does.
func TestUndecodableRecordIsSkippedAndDeletable(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g := startGateway(t, env, "", nil)
	a1 := createSession(t, g.Alice, client.CreateSession{})
	a2 := createSession(t, g.Alice, client.CreateSession{})
	kv, err := env.JS.KeyValue(ctxT(t), omni.SessionsBucket)
	if err != nil {
		t.Fatal(err)
	}
	const garbage = "session-2026-01-01-00-00-00-0000dead"
	const bobs = "session-2026-01-01-00-00-00-0000b0b0"
	if _, err := kv.Put(ctxT(t), garbage, []byte{0xc1, 0x00, 0xff}); err != nil {
		t.Fatal(err)
	}
	wrongType, _ := omni.Pack(map[string]any{"id": bobs, "principal": "bob", "max_turns": "many"})
	if _, err := kv.Put(ctxT(t), bobs, wrongType); err != nil {
		t.Fatal(err)
	}
	l, err := g.Alice.ListSessions(ctxT(t))
	if err != nil || len(l) != 2 || l[0].ID != a1.ID || l[1].ID != a2.ID {
		t.Fatalf("alice's list with two damaged records = %+v, %v; want her two Sessions", l, err)
	}
	if l, err := g.Bob.ListSessions(ctxT(t)); err != nil || len(l) != 0 {
		t.Fatalf("bob's list = %+v, %v", l, err)
	}
	if m := metricsText(t, g); !strings.Contains(m, "floe_gateway_undecodable_session_records 2") {
		t.Fatalf("metrics do not count the two damaged records:\n%s", grepLines(m, "undecodable"))
	}
	if st, code := raw(t, "GET", g.URL+"/api/sessions/"+garbage, aliceToken, "", nil); st != http.StatusInternalServerError || code != omni.CodeInternal {
		t.Errorf("GET a damaged record = %d %q, want 500 internal", st, code)
	}
	// Bob's damaged record: its principal reads, so only Bob may delete it.
	if err := g.Alice.DeleteSession(ctxT(t), bobs); !client.IsCode(err, omni.CodeNotFound) {
		t.Errorf("alice deletes bob's damaged record: %v, want 404", err)
	}
	if err := g.Bob.DeleteSession(ctxT(t), bobs); err != nil {
		t.Errorf("bob deletes his damaged record: %v", err)
	}
	if err := g.Alice.DeleteSession(ctxT(t), garbage); err != nil {
		t.Errorf("delete an ownerless damaged record: %v", err)
	}
	for _, k := range []string{garbage, bobs} {
		if _, err := kv.Get(ctxT(t), k); err == nil {
			t.Errorf("record %s still stored after its DELETE", k)
		}
	}
	if l, err := g.Alice.ListSessions(ctxT(t)); err != nil || len(l) != 2 {
		t.Fatalf("list after the deletes = %+v, %v", l, err)
	}
	if m := metricsText(t, g); !strings.Contains(m, "floe_gateway_undecodable_session_records 0") {
		t.Fatalf("metric after the deletes:\n%s", grepLines(m, "undecodable"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

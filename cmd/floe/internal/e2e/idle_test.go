package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/engine"
)

// A Session idle for FLOE_IDLE_KEEP leaves the stream once the tracer has
// written it, and its next Task sends the model what it would have sent
// without the purge, starting from the context snapshot (no refold of
// the Trace).
func TestIdleSessionLeavesTheStreamAndResumesTheSame(t *testing.T) {
	logs := &bustest.Buffer{}
	e := start(t, envOpts{log: logs, engine: func(c *engine.Config) { c.SetIdleKeep(300 * time.Millisecond) }})
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"expect_last_user": "first", "steps": []any{map[string]any{"text": "answer one, rather long"}}},
		map[string]any{"expect_last_user": "second", "steps": []any{map[string]any{"text": "answer two"}}},
	}})
	// The last request's usage: the scripted model estimates it from the
	// characters of the context it was sent.
	usage := func(rs []rec) omni.Payload {
		t.Helper()
		u := lcUsages(rs)
		if len(u) == 0 {
			t.Fatal("no token_usage event")
		}
		return u[len(u)-1]
	}

	// The same two Tasks on a Session that stays on the stream between
	// them (run back to back, well inside the keep) ...
	kept := e.session(ref, omni.ApproveAllowAll, nil)
	e.wait(kept, e.submit(kept, "first"))
	rs, status := e.wait(kept, e.submit(kept, "second"))
	lcRequireStatus(t, rs, status, omni.StatusCompleted)
	want := lcContextQuarter(usage(rs))

	// ... and on one that leaves it between them.
	sid := e.session(ref, omni.ApproveAllowAll, nil)
	rs, status = e.wait(sid, e.submit(sid, "first"))
	lcRequireStatus(t, rs, status, omni.StatusCompleted)
	bustest.Eventually(t, 30*time.Second, "the idle Session's messages purged", func() bool { return bustest.Held(t, e.st.JS, sid) == 0 })
	rec, _, err := e.st.Sessions.Get(context.Background(), sid)
	if err != nil {
		t.Fatal(err)
	}
	if rec.PurgedThrough < rs[len(rs)-1].seq {
		t.Fatalf("record purged through %d, want at least the Task's end %d", rec.PurgedThrough, rs[len(rs)-1].seq)
	}
	rs, status = e.wait(sid, e.submit(sid, "second"))
	lcRequireStatus(t, rs, status, omni.StatusCompleted)
	if got := lcContextQuarter(usage(rs)); got != want {
		t.Fatalf("after the purge the model saw a context of %d estimated tokens, without it %d", got, want)
	}
	// One refold: the Session's first Task, which had no snapshot yet.
	var refolds []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "no usable context snapshot") && strings.Contains(l, sid) {
			refolds = append(refolds, l)
		}
	}
	if len(refolds) != 1 {
		t.Fatalf("%d Tasks of the purged Session folded the whole history, want 1 (its first):\n%s", len(refolds), strings.Join(refolds, "\n"))
	}
}

package bustest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// A replica cut off from its peers still answers direct gets with what it
// had: Get through it returns a record the leader has since replaced (the
// engine saw another Task there and dropped the one it was handed).
// GetLatest through the same server never does: it asks the stream leader,
// and fails while the leader cannot be reached.
func TestGetLatestNeverReadsALaggingReplica(t *testing.T) {
	c := Start3(t)
	c.Setup(bus.Config{Replicas: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js0, _ := jetstream.New(c.Connect(0))
	var leader string
	Eventually(t, 30*time.Second, "the sessions bucket's leader", func() bool {
		st, err := js0.Stream(ctx, "KV_"+omni.SessionsBucket)
		if err != nil || st.CachedInfo().Cluster == nil {
			return false
		}
		leader = st.CachedInfo().Cluster.Leader
		return leader != ""
	})
	li := c.Index(leader)
	lag := (li + 1) % 3
	// A connection on the lagging server directly (not through its client
	// Link, which Isolate would cut too) and one on the leader.
	ncLag, err := nats.Connect(c.Servers[lag].ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer ncLag.Close()
	ncLead, err := nats.Connect(c.Servers[li].ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer ncLead.Close()
	jsLag, _ := jetstream.New(ncLag)
	jsLead, _ := jetstream.New(ncLead)
	onLag, err := bus.Open(ctx, jsLag)
	if err != nil {
		t.Fatal(err)
	}
	onLead, err := bus.Open(ctx, jsLead)
	if err != nil {
		t.Fatal(err)
	}
	const sid = "session-2026-12-03-10-00-00-0000abcd"
	if err := onLead.Create(ctx, &omni.SessionRecord{ID: sid, TaskID: "task-old"}); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, "the record on the lagging replica", func() bool {
		r, _, err := onLag.Get(ctx, sid)
		return err == nil && r.TaskID == "task-old"
	})
	// Cut the lagging server's routes only: it keeps its client.
	for j := range 3 {
		if j != lag {
			c.routes[lag][j].Cut()
			c.routes[j][lag].Cut()
		}
	}
	Eventually(t, 20*time.Second, "the write acknowledged by the two others", func() bool {
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
		defer wcancel()
		_, err := onLead.Update(wctx, sid, func(r *omni.SessionRecord) error { r.TaskID = "task-new"; return nil })
		return err == nil
	})
	if r, _, err := onLead.GetLatest(ctx, sid); err != nil || r.TaskID != "task-new" {
		t.Fatalf("GetLatest on the leader = %+v, %v", r, err)
	}
	// Right after the cut the replica answers no direct get ("no
	// responders") for a moment, then answers with what it had. Checking
	// GetLatest in that first moment proves nothing (a GetLatest that were
	// a direct get passed so, 5 of 5 runs): wait for the stale answer,
	// then ask GetLatest through the same server, each time after a Get
	// that was stale.
	staleGet := func() bool {
		gctx, gcancel := context.WithTimeout(ctx, 2*time.Second)
		defer gcancel()
		r, _, err := onLag.Get(gctx, sid)
		return err == nil && r.TaskID == "task-old"
	}
	Eventually(t, 20*time.Second, "the lagging replica answering a direct get with the old record", staleGet)
	for i := range 5 {
		if i > 0 && !staleGet() {
			break // the replica stopped answering (it noticed the leader is gone)
		}
		gctx, gcancel := context.WithTimeout(ctx, 2*time.Second)
		r, _, err := onLag.GetLatest(gctx, sid)
		gcancel()
		if err == nil && r.TaskID != "task-new" {
			t.Fatalf("GetLatest through the lagging server read %q, a write behind (a direct get there had just read it too)", r.TaskID)
		}
	}
}

package task

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/scripted"
)

// bySession plays the parent's script for the parent Session and the
// child's for every other Session.
type bySession struct {
	model.Provider
	parent string
	child  model.Provider
}

func (b bySession) Stream(ctx context.Context, req *model.Request, emit func(model.Delta) error) (model.Result, error) {
	if req.SessionID == b.parent {
		return b.Provider.Stream(ctx, req, emit)
	}
	return b.child.Stream(ctx, req, emit)
}

// taskLoop runs every Task put on FLOE_TASKS (the child Tasks run_subagent
// starts) with a Runner of its own, as an engine replica does.
func (h *harness) taskLoop() {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	cons, err := h.env.JS.CreateOrUpdateConsumer(cctx, omni.TasksStream, jetstream.ConsumerConfig{
		Durable: "test-engine", FilterSubject: "floe.task.>", AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		h.t.Fatal(err)
	}
	var wg sync.WaitGroup
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		var t omni.Task
		if err := omni.Unpack(msg.Data(), &t); err != nil {
			_ = msg.Term()
			return
		}
		_ = msg.Ack()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := New(h.deps, t).Run(ctx); err != nil && ctx.Err() == nil {
				h.t.Errorf("child task %s: %v", t.ID, err)
			}
		}()
	})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		cc.Stop()
		cancel()
		wg.Wait()
	})
}

// run_subagent under always-ask: the parent's call is approved, the child
// Session runs a tool whose approval request surfaces on the parent (and
// is decided there), every child message is forwarded on the parent's
// nested subject with the child's id as origin, in the child's own order
// and byte for byte in content and timestamp, and the call's output is the
// child's final answer, after everything forwarded.
func TestSubagentForwardingAndApprovalThroughTheParent(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"tool_call": {"name": "run_subagent", "id": "call_s",
	     "arguments": {"description": "look", "prompt": "list the files"}}}]},
	  {"expect_tool_outputs": ["call_s"], "steps": [{"text": "Parent done."}]}
	]}`, func(s *Settings) { s.MaxSubagentDepth = 1 })
	child, err := scripted.Parse("child", []byte(`{"requests": [
	  {"expect_last_user": "list the files", "steps": [{"text": "Looking.", "chunks": 3},
	     {"tool_call": {"name": "exec_command", "id": "call_c", "arguments": {"cmd": "ls"}}}]},
	  {"expect_tool_outputs": ["call_c"], "steps": [{"text": "child answer"}]}
	]}`))
	if err != nil {
		t.Fatal(err)
	}
	sid := "parent1"
	prov := bySession{Provider: h.prov, parent: sid, child: child}
	h.deps.Resolve = func(string) (model.Provider, model.Info, error) { return prov, h.prov.Info(), nil }
	h.session(sid, omni.ApproveAlwaysAsk)
	fr := h.runner("", echo)
	h.taskLoop()
	done := h.run(sid, "t1", "delegate")

	approve := func(id string) {
		t.Helper()
		bustest.Eventually(t, 10*time.Second, id+" pending on the parent", func() bool {
			p := h.pending(sid)
			return len(p) == 1 && p[0] == id
		})
		if rep, err := h.control(sid, omni.CtlApprove, omni.Control{ToolCallID: id, Decision: omni.DecisionAllow}); err != nil || !rep.OK {
			t.Fatalf("approve %s: %+v %v", id, rep, err)
		}
	}
	approve("call_s")
	approve("call_c") // the child's call, decided through the parent
	if st := h.wait(done); st != Completed {
		t.Fatalf("status %q", st)
	}
	if errs := append(h.prov.Mismatches(), child.Mismatches()...); len(errs) > 0 {
		t.Fatalf("models saw: %v", errs)
	}
	if got := fr.ran(); len(got) != 1 || got[0] != "call_c" {
		t.Fatalf("runner jobs %v, want [call_c]", got)
	}

	msgs := h.messages(sid)
	ptr := index(msgs, isType(omni.TypeSubagent, ""))
	if ptr < 0 {
		t.Fatalf("no subagent event%s", dump(msgs))
	}
	childSID := msgs[ptr].Payload.SessionID
	if childSID == "" {
		t.Fatalf("subagent event without a child id%s", dump(msgs))
	}
	own := h.messages(childSID)
	var nested []omni.Message
	for _, m := range msgs {
		if len(m.Origin) > 0 {
			if len(m.Origin) != 1 || m.Origin[0] != childSID {
				t.Fatalf("nested message with origin %v, want [%s]", m.Origin, childSID)
			}
			nested = append(nested, m)
		}
	}
	if len(own) < 8 || len(nested) != len(own) {
		t.Fatalf("child has %d messages, %d forwarded:\nchild:%s\nforwarded:%s", len(own), len(nested), dump(own), dump(nested))
	}
	for i := range own {
		if own[i].Timestamp != nested[i].Timestamp || shape(own[i]) != shape(nested[i]) ||
			own[i].Payload.Type != nested[i].Payload.Type || own[i].Payload.EventType != nested[i].Payload.EventType {
			t.Fatalf("forwarded[%d] differs from the child's own:\n%s\n%s", i, shape(nested[i]), shape(own[i]))
		}
	}
	// The child's decision was recorded in the child's stream (and forwarded).
	if index(own, isType(omni.TypeApprovalDecision, "call_c")) < 0 {
		t.Fatalf("child has no approval_decision for call_c%s", dump(own))
	}
	out := index(msgs, func(m *omni.Message) bool {
		return len(m.Origin) == 0 && m.Payload.Type == omni.TypeToolCallOutput && m.Payload.ToolCallID == "call_s"
	})
	lastNested := -1
	for i, m := range msgs {
		if len(m.Origin) > 0 {
			lastNested = i
		}
	}
	if out < 0 || out < lastNested || ptr > index(msgs, func(m *omni.Message) bool { return len(m.Origin) > 0 }) {
		t.Fatalf("subagent@%d, output@%d, last nested@%d%s", ptr, out, lastNested, dump(msgs))
	}
	if got := msgs[out].Payload.Output; got != "child answer" {
		t.Fatalf("call_s output %q, want the child's final answer", got)
	}
	rec, _, err := h.env.Sessions.Get(context.Background(), childSID)
	if err != nil || rec.Parent != sid || rec.Depth != 1 || rec.State != omni.StateIdle || rec.LastStatus != omni.StatusCompleted {
		t.Fatalf("child record %+v %v", rec, err)
	}
}

// Aborting the parent while its subagent runs a tool: the child is
// aborted too (its runner cancels the tool, the child publishes its
// abort and goes idle aborted), everything of the child is forwarded
// before the parent's abort, which is the parent's last message, and
// neither model is asked again.
func TestAbortingTheParentAbortsARunningSubagent(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"tool_call": {"name": "run_subagent", "id": "call_s",
	     "arguments": {"description": "build", "prompt": "build it"}}}]},
	  {"steps": [{"text": "must not be asked"}]}
	]}`, func(s *Settings) { s.MaxSubagentDepth, s.CancelWait = 1, 500*time.Millisecond })
	child, err := scripted.Parse("child", []byte(`{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_c", "arguments": {"cmd": "make"}}}]},
	  {"steps": [{"text": "must not be asked"}]}
	]}`))
	if err != nil {
		t.Fatal(err)
	}
	sid := "parent2"
	prov := bySession{Provider: h.prov, parent: sid, child: child}
	h.deps.Resolve = func(string) (model.Provider, model.Info, error) { return prov, h.prov.Info(), nil }
	h.session(sid, omni.ApproveAllowAll)
	fr := h.runner("", func(omni.ToolJob) *omni.Message { return nil })
	h.taskLoop()
	done := h.run(sid, "t1", "delegate")
	bustest.Eventually(t, 10*time.Second, "the child's tool running", func() bool {
		return len(fr.ran()) == 1
	})
	msgs := h.abort(sid, done)
	last := msgs[len(msgs)-1]
	if last.Payload.Type != omni.TypeAbort || len(last.Origin) > 0 {
		t.Fatalf("parent's last message is not its abort%s", dump(msgs))
	}
	if n := count(msgs, func(m *omni.Message) bool { return m.Payload.Type == omni.TypeAbort && len(m.Origin) == 0 }); n != 1 {
		t.Fatalf("%d parent aborts%s", n, dump(msgs))
	}
	childSID := msgs[index(msgs, isType(omni.TypeSubagent, ""))].Payload.SessionID
	// The child's interrupted output and its abort were forwarded, before
	// the parent's abort.
	fwdOut := index(msgs, func(m *omni.Message) bool {
		return len(m.Origin) == 1 && m.Payload.Type == omni.TypeToolCallOutput && m.Payload.ToolCallID == "call_c"
	})
	fwdAbort := index(msgs, func(m *omni.Message) bool { return len(m.Origin) == 1 && m.Payload.Type == omni.TypeAbort })
	if fwdOut < 0 || msgs[fwdOut].Payload.Output != omni.InterruptedOutput || fwdAbort < fwdOut {
		t.Fatalf("child's interrupted output@%d and abort@%d not forwarded in order%s", fwdOut, fwdAbort, dump(msgs))
	}
	own := h.messages(childSID)
	if n := count(msgs, func(m *omni.Message) bool { return len(m.Origin) > 0 }); n != len(own) {
		t.Fatalf("%d of the child's %d messages forwarded%s", n, len(own), dump(msgs))
	}
	if own[len(own)-1].Payload.Type != omni.TypeAbort {
		t.Fatalf("child's last message is not abort%s", dump(own))
	}
	bustest.Eventually(t, 10*time.Second, "the child idle aborted", func() bool {
		rec := h.record(childSID)
		return rec.State == omni.StateIdle && rec.LastStatus == omni.StatusAborted
	})
	if n, c := h.prov.Calls(sid), child.Calls(childSID); n != 1 || c != 1 {
		t.Fatalf("models called: parent %d, child %d, want 1 and 1", n, c)
	}
	time.Sleep(200 * time.Millisecond)
	if again := h.messages(sid); len(again) != len(msgs) {
		t.Fatalf("messages after the parent's abort:%s", dump(again[len(msgs):]))
	}
}

package task

import (
	"context"
	"errors"
	"testing"
	"time"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// Unit tests of the Runner's parts, each against a real embedded
// nats-server (the harness), driven directly rather than through Run.

const noScript = `{"requests": []}`

// part returns a Runner for a begun Task of a new Session, its parts not
// started, and a context for the test.
func part(t *testing.T, sid, mode string, tune func(*Settings)) (*harness, *Runner, context.Context) {
	t.Helper()
	h := newHarness(t, noScript, tune)
	h.session(sid, mode)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if _, err := h.env.Sessions.Begin(ctx, sid, omni.StateRunning, "t1"); err != nil {
		t.Fatalf("begin: %v", err)
	}
	r := New(h.deps, omni.Task{ID: "t1", Kind: omni.TaskRun, SessionID: sid})
	*r.rec = *h.record(sid)
	return h, r, ctx
}

// The lease: taken only while the record names the Task; valid until
// another token is written, when the watcher ends the lease scope with
// ErrLeaseLost and valid turns false.
func TestLeaseIsLostWhenAnotherTokenIsWritten(t *testing.T) {
	h, r, ctx := part(t, "lease-u1", omni.ApproveAllowAll, func(s *Settings) { s.AckWait = 3 * time.Second })
	other := newLease(h.env.Sessions, "lease-u1", "t-other", 0)
	if _, err := other.take(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("take for a Task the record does not name: %v, want ErrLeaseLost", err)
	}
	lctx, err := r.lease.take(ctx)
	if err != nil {
		t.Fatalf("take: %v", err)
	}
	defer r.lease.release()
	if got := h.record("lease-u1").Lease; got != r.lease.token || got == "" {
		t.Fatalf("record lease %q, want the token %q", got, r.lease.token)
	}
	r.lease.watch(lctx)
	defer r.lease.stop()
	if !r.lease.valid() {
		t.Fatal("valid right after take = false")
	}
	h.update("lease-u1", func(rec *omni.SessionRecord) { rec.Lease = "stolen" })
	select {
	case <-lctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher did not notice the lost lease")
	}
	if !errors.Is(context.Cause(lctx), ErrLeaseLost) || r.lease.valid() {
		t.Fatalf("after the loss: cause %v, valid %v; want ErrLeaseLost, false", context.Cause(lctx), r.lease.valid())
	}
	r.lease.stop() // idempotent
}

// The producers fold what they publish, in order, and stop publishing
// once the lease is lost.
func TestProducersFoldWhatReachesTheStreamAndStopWhenFenced(t *testing.T) {
	h, r, ctx := part(t, "prod-u1", omni.ApproveAllowAll, nil)
	lctx, err := r.lease.take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer r.lease.release()
	r.prod.open()
	defer r.prod.close()
	m := omni.UserText("hello")
	r.prod.publish(&m, "")
	dup, err := r.prod.publishOnce(lctx, new(omni.UserText("once")), "t1/once")
	if err != nil || dup {
		t.Fatalf("publishOnce = %v, %v; want stored, not a duplicate", dup, err)
	}
	if n := len(r.hist.messages()); n != 2 {
		t.Fatalf("folded %d messages, want 2", n)
	}
	r.prod.settle(lctx)
	if msgs := h.messages("prod-u1"); len(msgs) != 2 || msgs[0].Payload.Text != "hello" || msgs[1].Payload.Text != "once" {
		t.Fatalf("stream = %s, want hello then once", dump(msgs))
	}
	h.update("prod-u1", func(rec *omni.SessionRecord) { rec.Lease = "stolen" })
	r.lease.checked.Store(0) // as after a stall: the next publish checks the record
	late := omni.UserText("late")
	r.prod.publish(&late, "")
	if err := r.prod.publishSync(lctx, new(omni.UserText("late sync")), ""); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("publishSync after the loss: %v, want ErrLeaseLost", err)
	}
	if n := len(r.hist.messages()); n != 2 {
		t.Fatalf("folded %d messages after the loss, want 2", n)
	}
	if msgs := h.messages("prod-u1"); len(msgs) != 2 {
		t.Fatalf("stream after the loss = %s, want the 2 messages of before", dump(msgs))
	}
}

// The calls of a turn: await returns once every call has its output,
// whoever published it (read back from the stream); a heartbeat marks a
// call started; keepStored forgets calls the stream lost.
func TestCallsAwaitOutputsReadBackFromTheStream(t *testing.T) {
	h, r, ctx := part(t, "calls-u1", omni.ApproveAllowAll, nil)
	if _, err := r.lease.take(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.lease.release()
	r.prod.open()
	defer r.prod.close()
	if err := r.calls.openHeartbeats(); err != nil {
		t.Fatal(err)
	}
	defer r.calls.closeHeartbeats()
	stop, err := r.calls.follow(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for _, id := range []string{"call_a", "call_b", "call_gone"} {
		r.calls.add(id, "exec_command", 0, 1)
	}
	if kept := r.calls.keepStored([]string{"call_a", "call_b", "call_gone"}, map[string]bool{"call_a": true, "call_b": true}); len(kept) != 2 || r.calls.known("call_gone") {
		t.Fatalf("keepStored = %v (call_gone known %v), want [call_a call_b] and call_gone forgotten", kept, r.calls.known("call_gone"))
	}
	fr := &fakeRunner{h: h, sid: "calls-u1"}
	r.calls.setToken("call_a", "tok-a")
	fr.beat(h.env.Conn, omni.ToolJob{SessionID: "calls-u1", ToolCallID: "call_a", BeatToken: "tok-a"})
	bustest.Eventually(t, 10*time.Second, "call_a started", func() bool {
		r.calls.mu.Lock()
		defer r.calls.mu.Unlock()
		return r.calls.m["call_a"].started
	})
	done := make(chan error, 1)
	go func() { done <- r.calls.await(ctx, []string{"call_a", "call_b"}) }()
	for _, id := range []string{"call_b", "call_a"} {
		fr.publish(h.env.JS, "calls-u1", new(omni.ToolCallOutput(id, "out "+id, "")))
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("await: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("await did not return once both outputs were stored")
	}
	if out := r.calls.outputsOf([]string{"call_a", "call_b"}); out["call_a"] != "out call_a" || out["call_b"] != "out call_b" {
		t.Fatalf("outputsOf = %v", out)
	}
}

// A started call whose heartbeats stop gets a failed output of its own,
// and await returns.
func TestCallsDeclareALostRunner(t *testing.T) {
	h, r, ctx := part(t, "calls-u2", omni.ApproveAllowAll, func(s *Settings) { s.HeartbeatTimeout = 100 * time.Millisecond })
	if _, err := r.lease.take(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.lease.release()
	r.prod.open()
	defer r.prod.close()
	ids := r.calls.resume([]string{"call_x"})
	if err := r.calls.await(ctx, ids); err != nil {
		t.Fatalf("await: %v", err)
	}
	out := r.calls.outputsOf(ids)["call_x"]
	if out == "" {
		t.Fatal("no output recorded for the lost call")
	}
	r.prod.settle(ctx)
	msgs := h.messages("calls-u2")
	if i := index(msgs, isType(omni.TypeToolCallOutput, "call_x")); i < 0 || msgs[i].Payload.Stop() != omni.StatusFailed {
		t.Fatalf("stream = %s, want a failed output for call_x", dump(msgs))
	}
}

// The control inbox answers every verb without the agent loop: approve of
// an unknown call is not_found, steering is queued until taken and refused
// once closed, retry-now reports whether a wait was skipped, and a bad
// verb or body is a bad request.
func TestControlInboxServesEveryVerb(t *testing.T) {
	h, r, _ := part(t, "ctl-u1", omni.ApproveAllowAll, nil)
	r.abort.cancel = func(error) {}
	if err := r.ctl.open(); err != nil {
		t.Fatal(err)
	}
	defer r.ctl.close()
	ask := func(verb string, c omni.Control) omni.ControlReply {
		t.Helper()
		rep, err := h.control("ctl-u1", verb, c)
		if err != nil {
			t.Fatalf("%s: %v", verb, err)
		}
		return rep
	}
	if rep := ask(omni.CtlApprove, omni.Control{ToolCallID: "nope", Decision: omni.DecisionAllow}); rep.Code != omni.CodeNotFound {
		t.Fatalf("approve unknown = %+v, want not_found", rep)
	}
	if rep := ask(omni.CtlApprove, omni.Control{ToolCallID: "nope", Decision: "maybe"}); rep.Code != omni.CodeBadRequest {
		t.Fatalf("approve maybe = %+v, want bad_request", rep)
	}
	if rep := ask("dance", omni.Control{}); rep.Code != omni.CodeBadRequest {
		t.Fatalf("unknown verb = %+v, want bad_request", rep)
	}
	if m, err := h.env.Conn.Request(omni.ControlSubject("ctl-u1", omni.CtlSteer), []byte{0xc1}, 5*time.Second); err != nil {
		t.Fatal(err)
	} else if rep := (omni.ControlReply{}); omni.Unpack(m.Data, &rep) != nil || rep.Code != omni.CodeBadRequest {
		t.Fatalf("undecodable body = %+v, want bad_request", rep)
	}
	if rep := ask(omni.CtlRetryNow, omni.Control{}); !rep.OK || rep.Skipped {
		t.Fatalf("retry-now with no wait = %+v, want ok, not skipped", rep)
	}
	for _, text := range []string{"a", "b"} {
		if rep := ask(omni.CtlSteer, omni.Control{Text: text}); !rep.OK {
			t.Fatalf("steer %s = %+v", text, rep)
		}
	}
	if got := r.ctl.takeSteering(true); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("takeSteering = %q, want [a b]", got)
	}
	if got := r.ctl.takeSteering(true); len(got) != 0 {
		t.Fatalf("takeSteering again = %q, want none (and intake closed)", got)
	}
	if rep := ask(omni.CtlSteer, omni.Control{Text: "late"}); rep.Code != omni.CodeNotRunning {
		t.Fatalf("steer after close = %+v, want not_running", rep)
	}
	if rep := ask(omni.CtlPending, omni.Control{}); !rep.OK || len(rep.Pending) != 0 {
		t.Fatalf("pending = %+v, want ok and none", rep)
	}
	if rep := ask(omni.CtlAbort, omni.Control{}); !rep.OK || !r.abort.aborted() {
		t.Fatalf("abort = %+v (aborted %v), want ok and aborted", rep, r.abort.aborted())
	}
	r.ctl.stopIntake()
	if _, err := h.control("ctl-u1", omni.CtlPending, omni.Control{}); err == nil {
		t.Fatal("a control request after stopIntake was answered")
	}
}

// Approvals: the command policy forbids before any mode; deny-all denies,
// read-only allows only read tools, auto allows; an approval waits for
// resolve and is listed as pending meanwhile.
func TestApprovalsDecide(t *testing.T) {
	h, r, ctx := part(t, "appr-u1", omni.ApproveAllowAll, nil)
	r.appr.setTools([]omni.ToolSpec{{Name: "read_file", Permission: "r"}, {Name: "exec_command", Permission: "rw"}})
	r.rec.CommandPolicy = &omni.CommandPolicy{Source: "test", Rules: []omni.CommandRule{{Name: "no-rm", Pattern: `^rm\s`}}}
	r.abort.cancel = func(error) {}
	call := func(name, args string) omni.Message { return omni.ToolCall(name, args, "call_1") }
	tests := []struct {
		mode, tool, args, want string
	}{
		{omni.ApproveAllowAll, "exec_command", `{"cmd":"rm -rf x"}`, omni.DecisionForbidden},
		{omni.ApproveAllowAll, "exec_command", `{"cmd":"ls"}`, omni.DecisionAllow},
		{omni.ApproveDenyAll, "read_file", `{}`, omni.DecisionDeny},
		{omni.ApproveReadOnly, "read_file", `{}`, omni.DecisionAllow},
	}
	for _, tt := range tests {
		h.update("appr-u1", func(rec *omni.SessionRecord) { rec.ApprovalMode = tt.mode })
		if got, err := r.appr.decide(ctx, call(tt.tool, tt.args)); err != nil || got != tt.want {
			t.Errorf("decide(%s, %s %s) = %q, %v; want %q", tt.mode, tt.tool, tt.args, got, err, tt.want)
		}
	}
	// read-only asks for a write tool: the decision comes from resolve.
	h.update("appr-u1", func(rec *omni.SessionRecord) { rec.ApprovalMode = omni.ApproveReadOnly })
	lctx, err := r.lease.take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer r.lease.release()
	r.prod.open()
	defer r.prod.close()
	r.calls.add("call_1", "exec_command", r.prod.token(), 1)
	got := make(chan string, 1)
	go func() {
		d, _ := r.appr.decide(lctx, call("exec_command", `{"cmd":"ls"}`))
		got <- d
	}()
	bustest.Eventually(t, 10*time.Second, "call_1 pending", func() bool { return len(r.appr.pendingEvents()) == 1 })
	if r.appr.resolve("call_2", omni.DecisionAllow) {
		t.Fatal("resolve of a call not pending = true")
	}
	if !r.appr.resolve("call_1", omni.DecisionDeny) {
		t.Fatal("resolve of the pending call = false")
	}
	if d := <-got; d != omni.DecisionDeny {
		t.Fatalf("decision %q, want deny", d)
	}
	if n := len(r.appr.pendingEvents()); n != 0 {
		t.Fatalf("%d pending after the decision, want 0", n)
	}
}

// The compactor is due by context length (the window less 2048 or the
// Session's max, whichever is less) or by turns; not otherwise.
func TestCompactorReason(t *testing.T) {
	tests := []struct {
		name           string
		window, maxLen int64
		maxTurns       int64
		last, turns    int64
		want           string
	}{
		{"nothing due", 10000, 0, 0, 100, 1, ""},
		{"window", 10000, 0, 0, 8000, 1, omni.CompactContext},
		{"session max below window", 10000, 500, 0, 600, 1, omni.CompactContext},
		{"unknown window, session max", 0, 500, 0, 600, 1, omni.CompactContext},
		{"turns", 10000, 0, 3, 100, 3, omni.CompactTurns},
	}
	for _, tt := range tests {
		h := newHistory()
		h.fc.LastRequestTotal, h.fc.Turns = tt.last, tt.turns
		c := &compactor{hist: h, llm: &llm{}, rec: &omni.SessionRecord{}}
		c.llm.info.ContextWindow = tt.window
		c.rec.Compaction.MaxContextLength, c.rec.Compaction.MaxSessionTurns = tt.maxLen, tt.maxTurns
		if got := c.reason(); got != tt.want {
			t.Errorf("%s: reason() = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// Subagents: a decision for a call no child waits on is not forwarded.
func TestSubagentsForwardOnlyTheirChildrensApprovals(t *testing.T) {
	_, r, _ := part(t, "sub-u1", omni.ApproveAllowAll, nil)
	if _, ok := r.subs.forwardApproval(omni.Control{ToolCallID: "call_1", Decision: omni.DecisionAllow}); ok {
		t.Fatal("forwardApproval with no child = ok")
	}
	r.subs.approvals["call_1"] = childApproval{session: "child-nobody", event: []byte(`{}`)}
	rep, ok := r.subs.forwardApproval(omni.Control{ToolCallID: "call_1", Decision: omni.DecisionAllow})
	if !ok || rep.Code != omni.CodeNotFound {
		t.Fatalf("forwardApproval to a child with no engine = %+v, %v; want not_found", rep, ok)
	}
	if n := len(r.subs.pendingEvents()); n != 1 {
		t.Fatalf("pendingEvents = %d, want 1", n)
	}
}

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// lcSubagentCall is a scripted run_subagent call.
func lcSubagentCall(id, prompt string) map[string]any {
	return map[string]any{"tool_call": map[string]any{"name": "run_subagent", "id": id,
		"arguments": map[string]any{"description": "helper", "prompt": prompt}}}
}

// lcChildOf returns the child Session id of the parent's subagent event.
func lcChildOf(t *testing.T, rs []rec) string {
	t.Helper()
	for _, r := range rs {
		if r.class == omni.ClassEvent && r.msg.Payload.Type == omni.TypeSubagent {
			return r.msg.Payload.SessionID
		}
	}
	t.Fatalf("no subagent event: %v", labels(rs, noPartials))
	return ""
}

// lcToolNames lists the tools of the first tool_list_ready in rs.
func lcToolNames(t *testing.T, rs []rec) []string {
	t.Helper()
	for _, r := range rs {
		if r.class == omni.ClassEvent && r.msg.Payload.Type == omni.TypeToolListReady {
			specs, err := r.msg.Payload.ToolSpecs()
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, s := range specs {
				names = append(names, s.Name)
			}
			return names
		}
	}
	t.Fatalf("no tool_list_ready")
	return nil
}

// lcForwardedOK checks that the parent's nested subject carries every
// message of the child's stream (meta, partial, model, event), in order,
// each with the child id prepended to origin and otherwise unchanged.
func lcForwardedOK(t *testing.T, parent []rec, child string, childRecs []rec) {
	t.Helper()
	var nested []rec
	for _, r := range parent {
		if r.class == omni.ClassNested {
			nested = append(nested, r)
		}
	}
	var own []rec
	for _, r := range childRecs {
		switch r.class {
		case omni.ClassMeta, omni.ClassPartial, omni.ClassModel, omni.ClassEvent:
			own = append(own, r)
		}
	}
	if len(nested) != len(own) {
		t.Fatalf("parent's nested subject has %d messages, the child's stream %d:\nnested %v\nchild  %v",
			len(nested), len(own), labels(nested, nil), labels(own, nil))
	}
	for i := range own {
		want, err := omni.Marshal(lcPtr(own[i].msg.WithOrigin(child)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(nested[i].raw, want) {
			t.Fatalf("nested message %d:\n got %s\nwant %s", i, nested[i].raw, want)
		}
	}
	if len(nested) == 0 || nested[0].msg.Type != omni.KindSessionMeta {
		t.Fatalf("the first forwarded message is not the child's session_meta")
	}
}

func lcPtr[T any](v T) *T { return &v }

// run_subagent runs a child Session in the same Workspace with its own
// subjects and Trace; every child message reaches the parent's nested
// subject with origin, the parent's Trace keeps one subagent pointer, the
// tool's output is the child's final answer, and the child (depth 1) has no
// run_subagent tool: the engine refuses it.
//
// The scripted model counts requests per Session, so parent and child
// play the same entries: entry 0 asks for a subagent (the child's own
// attempt hits the depth limit), entry 1 answers.
func TestLifecycleSubagent(t *testing.T) {
	e := lcStart(t, "", envOpts{})
	const answer = "There are three files."
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"thinking": "Delegate."}, lcSubagentCall("sub", "count the files")}},
		map[string]any{"expect_tool_outputs": []string{"sub"}, "steps": []any{map[string]any{"text": answer, "chunks": 3}}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, nil)
	rs, status := e.wait(sid, e.submit(sid, "how many files? ask a helper"))
	lcRequireStatus(t, rs, status, omni.StatusCompleted)
	lcNoFailedRequests(t, rs)
	checkDiscipline(t, rs)
	child := lcChildOf(t, rs)
	own := labels(rs, func(r rec) bool { return noPartials(r) && r.class != omni.ClassNested })
	lcSameGroups(t, "parent stream", own, lcGroups(
		lcSeq("session_meta", "tool_list_ready", "text", "request_begin", "thinking", "tool_call:sub"),
		[][]string{{"approval_decision:allow:sub", "subagent", "token_usage", "request_end:completed"}},
		lcSeq("tool_call_output:sub", "request_begin", "text", "token_usage", "request_end:completed"),
	)...)
	if i, j := indexOf(own, "approval_decision:allow:sub"), indexOf(own, "subagent"); j < i {
		t.Fatalf("subagent pointer before the approval: %v", own)
	}
	out := lcPayload(t, rs, "tool_call_output:sub")
	if out.Output != answer || out.StopReason != omni.StatusCompleted {
		t.Fatalf("run_subagent output = %q (%s), want the child's answer", out.Output, out.StopReason)
	}
	if names := lcToolNames(t, rs); indexOf(names, "run_subagent") < 0 {
		t.Fatalf("parent tools %v lack run_subagent", names)
	}

	// The child: its own stream, head first, then its Task.
	crs := e.lcAll(child, nil)
	crec, _, err := e.st.Sessions.Get(context.Background(), child)
	if err != nil {
		t.Fatal(err)
	}
	if crec.Parent != sid || crec.Depth != 1 || crec.Workspace != e.ws || crec.State != omni.StateIdle {
		t.Fatalf("child record = %+v", crec)
	}
	meta := lcWithout(crs, omni.ClassServer)[0]
	if meta.class != omni.ClassMeta || meta.msg.Payload.Source != "subagent" || meta.msg.Payload.Workspace != e.ws || meta.msg.Payload.SessionID != child {
		t.Fatalf("child's first message = %s", meta.raw)
	}
	if names := lcToolNames(t, crs); indexOf(names, "run_subagent") >= 0 {
		t.Fatalf("child tools %v include run_subagent at the depth limit", names)
	}
	lcSameGroups(t, "child stream", labels(crs, noPartials), lcGroups(
		lcSeq("session_meta", "tool_list_ready", "text", "request_begin", "thinking", "tool_call:sub"),
		[][]string{{"approval_decision:allow:sub", "tool_call_output:sub", "token_usage", "request_end:completed"}},
		lcSeq("request_begin", "text", "token_usage", "request_end:completed"),
	)...)
	if p := lcPayload(t, crs, "tool_call_output:sub"); p.StopReason != omni.StatusFailed || !strings.Contains(p.Output, "depth") {
		t.Fatalf("the child's own run_subagent = %q (%s), want refused at the depth limit", p.Output, p.StopReason)
	}
	if p := lcPayload(t, crs, "text"); p.Text != "count the files" {
		t.Fatalf("child's prompt = %q", p.Text)
	}
	lcForwardedOK(t, rs, child, crs)

	// Traces: the parent keeps the pointer only; the child has its own.
	pt := e.lcTrace(sid)
	if len(pt) != 1 {
		t.Fatalf("%d parent trace files", len(pt))
	}
	pointers := 0
	for i, m := range pt[0].msgs {
		if len(m.Origin) > 0 || strings.Contains(string(pt[0].lines[i]), child) && m.Payload.Type != omni.TypeSubagent {
			t.Fatalf("child message in the parent's Trace: %s", pt[0].lines[i])
		}
		if m.Payload.Type == omni.TypeSubagent {
			pointers++
		}
	}
	if pointers != 1 {
		t.Fatalf("%d subagent pointers in the parent's Trace, want 1", pointers)
	}
	ct := e.lcTrace(child)
	if len(ct) != 1 {
		t.Fatalf("%d child trace files", len(ct))
	}
	lcSameGroups(t, "child trace", lcMsgLabels(ct[0].msgs), lcGroups(
		lcSeq("session_meta", "tool_list_ready", "text", "request_begin", "thinking", "tool_call:sub"),
		[][]string{{"approval_decision:allow:sub", "tool_call_output:sub", "token_usage", "request_end:completed"}},
		lcSeq("request_begin", "text", "token_usage", "request_end:completed"),
	)...)
	if ct[0].msgs[0].Payload.Source != "subagent" {
		t.Fatalf("child trace head = %+v", ct[0].msgs[0].Payload)
	}
}

// lcApprovalRequests follows the parent's server subject and hands every
// approval_request to fn until ctx ends.
func lcApprovalRequests(ctx context.Context, e *env, sid string, fn func(ev omni.ServerEvent, tc omni.Message)) {
	_ = bus.FollowUntil(ctx, e.st.JS, sid, []string{omni.ClassServer}, 0, false, func(sm bus.StreamMsg) error {
		var ev omni.ServerEvent
		if json.Unmarshal(sm.Data, &ev) != nil || ev.Type != omni.ServerApprovalRequest {
			return nil
		}
		var tc omni.Message
		if err := omni.Unmarshal(ev.ToolCall, &tc); err != nil {
			return err
		}
		fn(ev, tc)
		return nil
	})
}

// Under always-ask the child's approval requests surface on the parent's
// server subject with origin and are answered through the parent's control
// subject; aborting the parent aborts the child, whose stream (and its
// forwarding) ends before the parent's abort, the parent's last message.
func TestLifecycleSubagentApprovalsAndAbort(t *testing.T) {
	e := lcStart(t, "", envOpts{})
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{lcSubagentCall("sub", "wait for something")}},
		map[string]any{"steps": []any{call("long", "sleep 30")}},
	}})
	sid := e.session(ref, omni.ApproveAlwaysAsk, nil)
	type asked struct {
		origin []string
		id     string
	}
	got := make(chan asked, 16)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go lcApprovalRequests(ctx, e.env, sid, func(ev omni.ServerEvent, tc omni.Message) {
		got <- asked{ev.Origin, tc.Payload.ToolCallID}
	})
	next := func() asked {
		t.Helper()
		select {
		case a := <-got:
			return a
		case <-time.After(60 * time.Second):
			t.Fatal("no approval request")
		}
		return asked{}
	}
	task := e.submit(sid, "delegate")

	// The parent's own run_subagent call.
	if a := next(); len(a.origin) != 0 || a.id != "sub" {
		t.Fatalf("first approval request = %+v, want the parent's sub", a)
	}
	e.lcMustControl(sid, omni.CtlApprove, omni.Control{ToolCallID: "sub", Decision: omni.DecisionAllow})
	// The child's run_subagent call, surfaced on the parent with origin and
	// answered through the parent.
	a := next()
	rs := e.lcAll(sid, nil)
	child := lcChildOf(t, rs)
	if len(a.origin) != 1 || a.origin[0] != child || a.id != "sub" {
		t.Fatalf("second approval request = %+v, want the child's sub with origin [%s]", a, child)
	}
	e.lcMustControl(sid, omni.CtlApprove, omni.Control{ToolCallID: "sub", Decision: omni.DecisionAllow})
	// The child's next call waits for approval; the parent lists it.
	if a := next(); len(a.origin) != 1 || a.origin[0] != child || a.id != "long" {
		t.Fatalf("third approval request = %+v, want the child's long call", a)
	}
	rep, err := e.lcControl(sid, omni.CtlPending, omni.Control{})
	if err != nil || !rep.OK || len(rep.Pending) != 1 {
		t.Fatalf("pending on the parent = %+v, %v; want the child's one request", rep, err)
	}
	var pend omni.ServerEvent
	if err := json.Unmarshal(rep.Pending[0], &pend); err != nil || len(pend.Origin) != 1 || pend.Origin[0] != child {
		t.Fatalf("pending = %s (%v)", rep.Pending[0], err)
	}

	// Abort the parent: the child is aborted too.
	e.lcMustControl(sid, omni.CtlAbort, omni.Control{})
	prs, status := e.wait(sid, task)
	lcRequireStatus(t, prs, status, omni.StatusAborted)
	lcEndsWithAbort(t, prs)
	var childTask string
	crec, _, err := e.st.Sessions.Get(context.Background(), child)
	if err != nil {
		t.Fatal(err)
	}
	crs := e.lcAll(child, nil)
	for _, r := range crs {
		if r.class == omni.ClassServer && r.ev.Type == omni.ServerTaskState && r.ev.State == omni.StateIdle {
			childTask = r.ev.TaskID
			if r.ev.Status != omni.StatusAborted {
				t.Fatalf("child ended %s, want aborted", r.ev.Status)
			}
		}
	}
	if childTask == "" || crec.State != omni.StateIdle || crec.LastStatus != omni.StatusAborted {
		t.Fatalf("child not aborted: record %+v, stream %v", crec, labels(crs, noPartials))
	}
	lcEndsWithAbort(t, crs)
	// Everything the child published was forwarded, before the parent's abort.
	lcForwardedOK(t, prs, child, crs)
	if l := labels(prs, noPartials); indexOf(l, "approval_decision:allow:long") >= 0 {
		t.Fatalf("the child's pending call was decided: %v", l)
	}
}

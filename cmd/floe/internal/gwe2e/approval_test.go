package gwe2e

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// always-ask against the real engine and tool runner: the approval_request
// reaches SSE, nothing runs until it is allowed (the tool writes a file that
// is absent until then), a pending request is re-sent after a resume's
// replay and on a fresh connection, a deny pairs the call with "Tool call
// denied by user." and runs nothing, and a decision for an unknown or
// already decided call is 404.
func TestAlwaysAskApprovals(t *testing.T) {
	e := start(t)
	ws := filepath.Join(e.ws, "approvals")
	allowed, denied := filepath.Join(ws, "allowed.txt"), filepath.Join(ws, "denied.txt")
	ref := script(t, obj{"requests": []any{
		obj{"steps": []any{
			obj{"text": "I will write two files."},
			obj{"tool_call": obj{"name": "write_file", "id": "call_w",
				"arguments": obj{"file_path": "allowed.txt", "content": "approved\n"}}},
			obj{"tool_call": obj{"name": "exec_command", "id": "call_d",
				"arguments": obj{"description": "write the other", "cmd": "echo nope > denied.txt"}}},
		}},
		obj{"expect_tool_outputs": []string{"call_w", "call_d"}, "steps": []any{obj{"text": "Done with files."}}},
	}})
	sid := e.session(e.c, client.CreateSession{Model: ref, Workspace: ws, ApprovalMode: omni.ApproveAlwaysAsk})
	ctx := ctxT(t)

	c0 := stream(t, e.c, sid, "")
	task := submit(t, e.c, sid, "write the files")
	req := c0.until("the approval request for call_w", approvalFor("call_w"))
	if req.ID == "" {
		t.Fatalf("the live approval_request has no id")
	}
	absent(t, allowed)
	for _, sm := range busAll(t, e.st.JS, sid, []string{omni.ClassModel, omni.ClassEvent}) {
		if m, _ := omni.Decode(sm.Data); m.Payload.ToolCallID == "call_w" && m.Payload.Type != omni.TypeToolCall && m.Payload.Type != omni.TypePartialToolCall {
			t.Fatalf("before any decision the stream holds %s", msgLabel(&m))
		}
	}

	// Decisions nobody waits for.
	if err := e.c.Approve(ctx, sid, "call_unknown", omni.DecisionAllow); apiStatus(err) != 404 || !client.IsCode(err, omni.CodeNotFound) {
		t.Fatalf("approve an unknown call: %v, want 404 not_found", err)
	}
	if err := e.c.Approve(ctx, sid, "call_w", "maybe"); apiStatus(err) != 400 {
		t.Fatalf("decision \"maybe\": %v, want 400", err)
	}

	// A resume: the replayed gap, then task_state running and the pending
	// request again, both without ids.
	c1 := stream(t, e.c, sid, c0.lastID())
	snap := c1.until("the snapshot", func(ev client.Event) bool { return ev.ID == "" })
	if !isTaskState(snap, omni.StateRunning) {
		t.Fatalf("after the replay came %s, want task_state running:%s", label(snap), describe(c1.got))
	}
	if ev := c1.next("the re-sent approval"); ev.ID != "" || approvalCallID(ev) != "call_w" {
		t.Fatalf("after the snapshot came %s, want the pending approval_request for call_w without id", label(ev))
	}
	// A fresh connection: the same two first.
	c2 := stream(t, e.c, sid, "")
	if ev := c2.next("the snapshot"); ev.ID != "" || !isTaskState(ev, omni.StateRunning) {
		t.Fatalf("fresh connection's first event = %s, want task_state running", label(ev))
	}
	if ev := c2.next("the re-sent approval"); ev.ID != "" || approvalCallID(ev) != "call_w" {
		t.Fatalf("fresh connection's second event = %s, want approval_request for call_w", label(ev))
	}
	c2.close()
	absent(t, allowed)

	if err := e.c.Approve(ctx, sid, "call_w", omni.DecisionAllow); err != nil {
		t.Fatalf("allow call_w: %v", err)
	}
	if err := e.c.Approve(ctx, sid, "call_w", omni.DecisionAllow); apiStatus(err) != 404 {
		t.Fatalf("allow call_w twice: %v, want 404", err)
	}
	eventually(t, "allowed.txt to be written", func() bool {
		b, err := os.ReadFile(allowed)
		return err == nil && string(b) == "approved\n"
	})

	if ev := c1.until("the approval request for call_d", approvalFor("call_d")); ev.ID == "" {
		t.Fatalf("the live approval_request for call_d has no id")
	}
	absent(t, denied)
	if err := e.c.Approve(ctx, sid, "call_d", omni.DecisionDeny); err != nil {
		t.Fatalf("deny call_d: %v", err)
	}
	end := c1.until("the task's end", idleOf(task))
	if se, _ := serverEv(end); se.Status != omni.StatusCompleted {
		t.Fatalf("task ended %q:%s", se.Status, describe(c1.got))
	}
	absent(t, denied)
	if err := e.c.Approve(ctx, sid, "call_d", omni.DecisionAllow); apiStatus(err) != 404 {
		t.Fatalf("decide call_d after the task: %v, want 404", err)
	}

	// The stream: each decision before its call's output; the denial's
	// synthetic output; one output per call.
	var decided []string
	outputs := map[string]omni.Message{}
	for _, sm := range e.busMsgs(sid, []string{omni.ClassModel, omni.ClassEvent, omni.ClassServer}, untilIdle(task)) {
		if sm.Class == omni.ClassServer {
			continue
		}
		m, _ := omni.Decode(sm.Data)
		switch m.Payload.Type {
		case omni.TypeApprovalDecision:
			decided = append(decided, m.Payload.ToolCallID+":"+m.Payload.Decision)
		case omni.TypeToolCallOutput:
			id := m.Payload.ToolCallID
			if _, dup := outputs[id]; dup {
				t.Fatalf("two outputs for %s", id)
			}
			if !slices.ContainsFunc(decided, func(d string) bool { return d == id+":allow" || d == id+":deny" }) {
				t.Fatalf("output of %s before its approval_decision", id)
			}
			outputs[id] = m
		}
	}
	if !slices.Equal(decided, []string{"call_w:allow", "call_d:deny"}) {
		t.Fatalf("decisions %v, want call_w allow then call_d deny", decided)
	}
	if o := outputs["call_d"].Payload; o.Output != omni.DeniedByUser || o.StopReason != omni.StatusAborted {
		t.Fatalf("denied call's output = %q (stop_reason %q), want %q (aborted)", o.Output, o.StopReason, omni.DeniedByUser)
	}
	if o := outputs["call_w"].Payload; o.StopReason == omni.StatusFailed || o.StopReason == omni.StatusAborted {
		t.Fatalf("allowed call's output = %q (stop_reason %q)", o.Output, o.StopReason)
	}
}

// A subagent under always-ask: its tool's approval_request reaches an SSE
// client of the parent with origin [child]; the decision goes through the
// parent's approval route and releases the child's tool; the parent's
// Trace holds its own messages only (one subagent pointer, nothing with an
// origin), while the child's messages reach the parent's stream as nested.
func TestSubagentApprovalThroughParent(t *testing.T) {
	e := start(t)
	ws := filepath.Join(e.ws, "sub")
	marker := filepath.Join(ws, "child.txt")
	// Parent and child play this one script, each with its own request
	// counter. The parent's first Task (deny-all) uses up requests 1-2, so
	// in its second Task the parent plays 3-4 while the child plays 1-2.
	ref := script(t, obj{"requests": []any{
		obj{"steps": []any{obj{"tool_call": obj{"name": "exec_command", "id": "call_x",
			"arguments": obj{"description": "mark", "cmd": "echo child-was-here > child.txt; echo marker-written"}}}}},
		obj{"steps": []any{obj{"text": "Child finished."}}},
		obj{"steps": []any{obj{"tool_call": obj{"name": "run_subagent", "id": "call_sub",
			"arguments": obj{"description": "helper", "prompt": "write the marker file"}}}}},
		obj{"expect_tool_outputs": []string{"call_sub"}, "steps": []any{obj{"text": "Parent finished."}}},
	}})
	sid := e.session(e.c, client.CreateSession{Model: ref, Workspace: ws, ApprovalMode: omni.ApproveDenyAll})
	ctx := ctxT(t)

	c := stream(t, e.c, sid, "")
	taskA := submit(t, e.c, sid, "warm up")
	c.until("the first task's end", idleOf(taskA))
	absent(t, marker)
	mode := omni.ApproveAlwaysAsk
	if _, err := e.c.PatchSession(ctx, sid, client.SessionPatch{ApprovalMode: &mode}); err != nil {
		t.Fatal(err)
	}

	taskB := submit(t, e.c, sid, "delegate")
	ev := c.until("the parent's own approval request", approvalFor("call_sub"))
	if se, _ := serverEv(ev); len(se.Origin) != 0 {
		t.Fatalf("the parent's own approval_request has origin %v", se.Origin)
	}
	if err := e.c.Approve(ctx, sid, "call_sub", omni.DecisionAllow); err != nil {
		t.Fatalf("allow run_subagent: %v", err)
	}
	var child string
	ev = c.until("the child's approval request", func(ev client.Event) bool {
		if m, ok := msgOf(ev); ok && m.Payload.Type == omni.TypeSubagent {
			child = m.Payload.SessionID
		}
		return approvalCallID(ev) == "call_x"
	})
	se, _ := serverEv(ev)
	if child == "" || !slices.Equal(se.Origin, []string{child}) {
		t.Fatalf("child approval_request origin = %v, want [%s] (the subagent event's session)", se.Origin, child)
	}
	absent(t, marker)
	// Pending on reconnect: the child's request is re-sent with its origin.
	c2 := stream(t, e.c, sid, "")
	c2.next("the snapshot")
	if ev := c2.next("the re-sent child approval"); approvalCallID(ev) != "call_x" {
		t.Fatalf("fresh connection's second event = %s, want the child's approval_request", label(ev))
	} else if se, _ := serverEv(ev); !slices.Equal(se.Origin, []string{child}) {
		t.Fatalf("re-sent child approval origin = %v", se.Origin)
	}
	c2.close()

	if err := e.c.Approve(ctx, sid, "call_x", omni.DecisionAllow); err != nil {
		t.Fatalf("allow the child's call through the parent: %v", err)
	}
	eventually(t, "the child's tool to write its file", func() bool {
		b, err := os.ReadFile(marker)
		return err == nil && string(b) == "child-was-here\n"
	})
	end := c.until("the parent task's end", idleOf(taskB))
	if se, _ := serverEv(end); se.Status != omni.StatusCompleted {
		t.Fatalf("parent task ended %q:%s", se.Status, describe(c.got))
	}

	// The parent's stream carries the child's messages as nested, with origin.
	nested := 0
	for _, ev := range c.got {
		if m, ok := msgOf(ev); ok && len(m.Origin) > 0 {
			if !slices.Equal(m.Origin, []string{child}) {
				t.Fatalf("nested message with origin %v", m.Origin)
			}
			nested++
		}
	}
	if nested == 0 {
		t.Fatalf("no nested child message on the parent's stream:%s", describe(c.got))
	}

	// The parent's Trace, once the tracer caught up, is exactly its
	// meta|model|event|trace messages: no child message, no origin.
	own := busAll(t, e.st.JS, sid, omni.TraceClasses)
	waitTracer(t, e.home, sid, own[len(own)-1].Seq)
	recs := traceRecords(t, e.home, sid)
	if len(recs) != len(own) {
		t.Fatalf("parent Trace has %d records, its own trace classes on the bus %d", len(recs), len(own))
	}
	pointers := 0
	for i, r := range recs {
		if !bytes.Equal(r, own[i].Data) {
			t.Fatalf("parent Trace record %d = %s, bus has %s", i, r, own[i].Data)
		}
		m, err := omni.Decode(r)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Origin) > 0 || (m.Type == omni.KindSessionMeta && m.Payload.SessionID != sid) {
			t.Fatalf("parent Trace holds a child message: %s", r)
		}
		if m.Payload.Type == omni.TypeSubagent {
			pointers++
			if m.Payload.SessionID != child {
				t.Fatalf("subagent pointer to %s, want %s", m.Payload.SessionID, child)
			}
		}
		if m.Payload.Type == omni.TypeToolCallOutput && bytes.Contains(r, []byte("marker-written")) {
			t.Fatalf("the child's tool output is in the parent's Trace: %s", r)
		}
	}
	if pointers != 1 {
		t.Fatalf("%d subagent pointers in the parent's Trace, want 1", pointers)
	}
	// The child's own stream holds its tool's output.
	childOut := false
	for _, sm := range busAll(t, e.st.JS, child, []string{omni.ClassModel}) {
		m, _ := omni.Decode(sm.Data)
		childOut = childOut || (m.Payload.Type == omni.TypeToolCallOutput && m.Payload.ToolCallID == "call_x" && bytes.Contains(sm.Data, []byte("marker-written")))
	}
	if !childOut {
		t.Fatalf("the child's stream has no output of call_x")
	}
}

// absent fails when path exists: the tool that writes it must not have run.
func absent(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s exists (or cannot be checked: %v): the tool ran without approval", filepath.Base(path), err)
	}
}

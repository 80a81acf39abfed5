package gwe2e

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/procfs"
	"floe.dev/services/gateway/client"
)

// Abort through HTTP, mid-answer and mid-tool: 202; abort is the run's
// last OmniMessage (only task_state idle follows); the Session goes idle
// with status aborted; the killed tool publishes nothing; abort when idle
// is 204.
func TestAbortMidAnswerAndMidTool(t *testing.T) {
	e := start(t)
	ctx := ctxT(t)

	t.Run("answer", func(t *testing.T) {
		ref := script(t, obj{"requests": []any{
			obj{"steps": []any{obj{"text": longText("slow", 200), "chunks": 200, "delay_ms": 20}}},
		}})
		sid := e.session(e.c, client.CreateSession{Model: ref})
		if interrupted, err := e.c.Abort(ctx, sid); err != nil || interrupted {
			t.Fatalf("abort before any Task = %v, %v; want 204", interrupted, err)
		}
		c := stream(t, e.c, sid, "")
		task := submit(t, e.c, sid, "talk slowly")
		c.until("5 text fragments", func(client.Event) bool { return count(c.got, isTextPartial) >= 5 })
		if interrupted, err := e.c.Abort(ctx, sid); err != nil || !interrupted {
			t.Fatalf("abort mid-answer = %v, %v; want 202", interrupted, err)
		}
		c.until("the task's end", idleOf(task))
		checkAborted(t, e, sid, task)
	})

	t.Run("tool", func(t *testing.T) {
		ws := filepath.Join(e.ws, "abort-tool")
		ref := script(t, obj{"requests": []any{
			obj{"steps": []any{obj{"tool_call": obj{"name": "exec_command", "id": "call_sleep",
				"arguments": obj{"description": "sleep", "cmd": "echo started; exec sleep 30.4242"}}}}},
			obj{"steps": []any{obj{"text": "never"}}},
		}})
		sid := e.session(e.c, client.CreateSession{Model: ref, Workspace: ws})
		c := stream(t, e.c, sid, "")
		task := submit(t, e.c, sid, "sleep a while")
		c.until("the tool's first output", func(ev client.Event) bool {
			m, ok := msgOf(ev)
			return ok && m.Payload.Type == omni.TypePartialToolCallOutput && strings.Contains(m.Payload.Output, "started")
		})
		if interrupted, err := e.c.Abort(ctx, sid); err != nil || !interrupted {
			t.Fatalf("abort mid-tool = %v, %v; want 202", interrupted, err)
		}
		c.until("the task's end", idleOf(task))
		// Case A: the stopped tool's complete output, aborted, comes
		// before abort (checkAborted checks abort is last).
		msgs := checkAborted(t, e, sid, task)
		outs := 0
		for _, sm := range msgs {
			if m, _ := omni.Decode(sm.Data); m.Payload.Type == omni.TypeToolCallOutput {
				outs++
				if m.Payload.StopReason != omni.StatusAborted || m.Payload.Output != "started\n"+omni.InterruptedOutput {
					t.Fatalf("the stopped tool's output = %s", sm.Data)
				}
			}
		}
		if outs != 1 {
			t.Fatalf("%d complete outputs of the stopped tool, want 1", outs)
		}
		// The command runs confined, in a PID namespace of its own: find
		// it from here by its command line, not by the pid it sees.
		eventually(t, "the sleep process to end", func() bool { return len(procfs.WithArgs("sleep", "30.4242")) == 0 })
	})
}

// Abort while a call waits for its approval: 202, the same end as any
// abort, the call never runs, and a decision afterwards is 404.
func TestAbortWhileApprovalPending(t *testing.T) {
	e := start(t)
	ctx := ctxT(t)
	ws := filepath.Join(e.ws, "abort-approval")
	ref := script(t, obj{"requests": []any{
		obj{"steps": []any{obj{"tool_call": obj{"name": "exec_command", "id": "call_p",
			"arguments": obj{"description": "touch", "cmd": "touch ran.txt"}}}}},
		obj{"steps": []any{obj{"text": "never"}}},
	}})
	sid := e.session(e.c, client.CreateSession{Model: ref, Workspace: ws, ApprovalMode: omni.ApproveAlwaysAsk})
	c := stream(t, e.c, sid, "")
	task := submit(t, e.c, sid, "ask first")
	c.until("the approval request", approvalFor("call_p"))
	if interrupted, err := e.c.Abort(ctx, sid); err != nil || !interrupted {
		t.Fatalf("abort with a pending approval = %v, %v; want 202", interrupted, err)
	}
	c.until("the task's end", idleOf(task))
	checkAborted(t, e, sid, task)
	if err := e.c.Approve(ctx, sid, "call_p", omni.DecisionAllow); apiStatus(err) != 404 {
		t.Fatalf("approve after the abort: %v, want 404", err)
	}
	absent(t, filepath.Join(ws, "ran.txt"))
}

// checkAborted asserts the end of an aborted Task on the bus and in the
// Session record, and that a second abort is 204; it returns the Task's
// messages.
func checkAborted(t *testing.T, e *env, sid, task string) []bus.StreamMsg {
	t.Helper()
	msgs := e.busMsgs(sid, omni.ClientClasses, untilIdle(task))
	last := -1
	for i, sm := range msgs {
		if sm.Class != omni.ClassServer {
			last = i
		}
	}
	if last < 0 {
		t.Fatalf("no OmniMessage in the aborted Task")
	}
	if m, _ := omni.Decode(msgs[last].Data); m.Type != omni.KindEvent || m.Payload.Type != omni.TypeAbort {
		t.Fatalf("the run's last OmniMessage is %s, want abort", msgs[last].Data)
	}
	for _, sm := range msgs[last+1:] {
		var se omni.ServerEvent
		if json.Unmarshal(sm.Data, &se); se.Type != omni.ServerTaskState || se.State != omni.StateIdle {
			t.Fatalf("after abort: %s", sm.Data)
		}
	}
	if n := len(msgs) - last - 1; n != 1 {
		t.Fatalf("%d server events after abort, want only task_state idle", n)
	}
	s, err := e.c.GetSession(ctxT(t), sid)
	if err != nil {
		t.Fatal(err)
	}
	if s.State != omni.StateIdle || s.LastStatus != omni.StatusAborted {
		t.Fatalf("session after abort: state %q, lastStatus %q; want idle, aborted", s.State, s.LastStatus)
	}
	if interrupted, err := e.c.Abort(ctxT(t), sid); err != nil || interrupted {
		t.Fatalf("abort when idle = %v, %v; want 204", interrupted, err)
	}
	return msgs
}

// Steering through HTTP: 202 while a Task runs, and the text reaches the
// stream as a [user_steering] user text and the model as its next input;
// 409 not_running when idle.
func TestSteerThroughHTTP(t *testing.T) {
	e := start(t)
	ctx := ctxT(t)
	// The Task waits on an approval, so it is surely running when the
	// steering comes.
	ref := script(t, obj{"requests": []any{
		obj{"steps": []any{obj{"tool_call": obj{"name": "exec_command", "id": "call_e",
			"arguments": obj{"description": "echo", "cmd": "echo hi"}}}}},
		obj{"expect_last_user": omni.Block(omni.TagUserSteering, "turn left"), "steps": []any{obj{"text": "Turning left."}}},
	}})
	sid := e.session(e.c, client.CreateSession{Model: ref, ApprovalMode: omni.ApproveAlwaysAsk})
	if err := e.c.Steer(ctx, sid, "too early"); apiStatus(err) != 409 || !client.IsCode(err, omni.CodeNotRunning) {
		t.Fatalf("steer when idle: %v, want 409 not_running", err)
	}
	c := stream(t, e.c, sid, "")
	task := submit(t, e.c, sid, "go")
	c.until("the approval request", approvalFor("call_e"))
	if err := e.c.Steer(ctx, sid, "turn left"); err != nil {
		t.Fatalf("steer while running: %v, want 202", err)
	}
	if err := e.c.Approve(ctx, sid, "call_e", omni.DecisionAllow); err != nil {
		t.Fatal(err)
	}
	end := c.until("the task's end", idleOf(task))
	if se, _ := serverEv(end); se.Status != omni.StatusCompleted {
		t.Fatalf("task ended %q (a failed request means the model did not get the steering):%s", se.Status, describe(c.got))
	}
	steered := count(c.got, func(ev client.Event) bool {
		m, ok := msgOf(ev)
		return ok && m.Payload.Type == omni.TypeText && m.Payload.Role == omni.RoleUser &&
			m.Payload.Text == omni.Block(omni.TagUserSteering, "turn left")
	})
	if steered != 1 {
		t.Fatalf("%d [user_steering] user texts on the stream, want 1:%s", steered, describe(c.got))
	}
	if err := e.c.Steer(ctx, sid, "too late"); apiStatus(err) != 409 || !client.IsCode(err, omni.CodeNotRunning) {
		t.Fatalf("steer after the task: %v, want 409 not_running", err)
	}
}

// Two POST /tasks at once through two gateway replicas: the Session record's
// compare-and-set lets exactly one through (202), the other gets 409
// task_in_progress; the winner's Task runs to completion.
func TestConcurrentTasksThroughTwoGateways(t *testing.T) {
	e := start(t)
	ref := script(t, obj{"requests": []any{}, "after_last": "final_text", "final_text": "Only once."})
	sid := e.session(e.c, client.CreateSession{Model: ref})
	gB := e.startGateway("")
	c := stream(t, e.c, sid, "")

	for round := 0; round < 3; round++ {
		ready := make(chan struct{})
		var wg sync.WaitGroup
		type result struct {
			task string
			err  error
		}
		results := make([]result, 2)
		for i, cl := range []*client.Client{e.c, gB.c} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-ready
				ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
				defer cancel()
				results[i].task, results[i].err = cl.SubmitTask(ctx, sid, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "race " + strconv.Itoa(i)}}})
			}()
		}
		close(ready)
		wg.Wait()
		var won []string
		conflicts := 0
		for _, r := range results {
			switch {
			case r.err == nil:
				won = append(won, r.task)
			case apiStatus(r.err) == 409 && client.IsCode(r.err, omni.CodeTaskInProgress):
				conflicts++
			default:
				t.Fatalf("round %d: submit: %v", round, r.err)
			}
		}
		if len(won) != 1 || conflicts != 1 {
			t.Fatalf("round %d: %d accepted, %d conflicts; want exactly one of each", round, len(won), conflicts)
		}
		end := c.until("the winner's end", idleOf(won[0]))
		if se, _ := serverEv(end); se.Status != omni.StatusCompleted {
			t.Fatalf("round %d: task ended %q", round, se.Status)
		}
	}
	// Exactly three Tasks ran: three prompts on the stream.
	prompts := count(c.got, func(ev client.Event) bool {
		m, ok := msgOf(ev)
		return ok && m.Payload.Type == omni.TypeText && m.Payload.Role == omni.RoleUser
	})
	if prompts != 3 {
		t.Fatalf("%d prompts on the stream, want 3:%s", prompts, describe(c.got))
	}
}

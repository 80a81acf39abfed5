package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/omni/cmdpolicy"
)

// deny-all is a refusal like a person's: decision deny and the output
// "Tool call denied by user."; forbidden is the command policy's alone.
func TestDenyAllRecordsDeny(t *testing.T) {
	e := start(t, envOpts{})
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"tool_call": map[string]any{"name": "exec_command", "id": "call_a",
			"arguments": map[string]any{"description": "mark", "cmd": "touch ran"}}}}},
		map[string]any{"expect_tool_outputs": []string{"call_a"}, "expect_last_user": omni.DeniedByUser,
			"steps": []any{map[string]any{"text": "ok"}}},
	}})
	sid := e.session(ref, omni.ApproveDenyAll, nil)
	rs, status := e.wait(sid, e.submit(sid, "go"))
	if status != omni.StatusCompleted {
		t.Fatalf("status %q; stream %v", status, labels(rs, noPartials))
	}
	ls := labels(rs, noPartials)
	if indexOf(ls, "approval_decision:deny:call_a") < 0 || indexOf(ls, "approval_decision:forbidden:call_a") >= 0 {
		t.Fatalf("stream %v, want approval_decision deny for call_a", ls)
	}
	out := outputOf(t, rs, "call_a")
	if out.Output != omni.DeniedByUser || out.StopReason != omni.StatusAborted {
		t.Fatalf("output = %q (%s), want %q (aborted)", out.Output, out.StopReason, omni.DeniedByUser)
	}
	if _, err := os.Stat(filepath.Join(e.ws, "ran")); err == nil {
		t.Fatal("the denied command ran")
	}
}

// The command policy is checked before any approval mode, allow-all
// included: a hit is forbidden, nothing runs, and the model reads "Tool
// call denied by policy."; other calls of the same turn run. A Session
// whose snapshot is "off" runs the same command.
func TestCommandPolicyForbidsBeforeApproval(t *testing.T) {
	e := start(t, envOpts{})
	if err := os.MkdirAll(filepath.Join(e.ws, "victim"), 0o755); err != nil {
		t.Fatal(err)
	}
	calls := []any{
		map[string]any{"name": "exec_command", "id": "call_rm",
			"arguments": map[string]any{"description": "wipe", "cmd": `touch ran-rm; \rm -r -f victim`}},
		map[string]any{"name": "exec_command", "id": "call_ok",
			"arguments": map[string]any{"description": "fine", "cmd": "echo rm -rf > said.txt; cat said.txt"}},
	}
	script := map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"parallel_tool_calls": calls}}},
		map[string]any{"expect_tool_outputs": []string{"call_rm", "call_ok"}, "steps": []any{map[string]any{"text": "done"}}},
	}}
	for _, mode := range []string{omni.ApproveAllowAll, omni.ApproveAlwaysAsk} {
		t.Run(mode, func(t *testing.T) {
			// always-ask would wait for a person: a forbidden call must
			// never ask, and the allowed one is answered below.
			sid := e.session(e.script(script), mode, nil)
			var stop func()
			if mode == omni.ApproveAlwaysAsk {
				stop = e.approveAll(t, sid)
			}
			rs, status := e.wait(sid, e.submit(sid, "go"))
			if stop != nil {
				stop()
			}
			if status != omni.StatusCompleted {
				t.Fatalf("status %q; stream %v", status, labels(rs, noPartials))
			}
			ls := labels(rs, nil)
			if indexOf(ls, "approval_decision:forbidden:call_rm") < 0 || indexOf(ls, "approval_decision:allow:call_ok") < 0 {
				t.Fatalf("stream %v", ls)
			}
			for _, r := range rs {
				if r.class == omni.ClassServer && r.ev.Type == omni.ServerApprovalRequest && string(r.ev.ToolCall) != "" {
					var tc omni.Message
					if omni.Unmarshal(r.ev.ToolCall, &tc) == nil && tc.Payload.ToolCallID == "call_rm" {
						t.Fatal("a forbidden call was put to a person")
					}
				}
			}
			if out := outputOf(t, rs, "call_rm"); out.Output != omni.DeniedByPolicy || out.StopReason != omni.StatusAborted {
				t.Fatalf("forbidden output = %q (%s)", out.Output, out.StopReason)
			}
			if out := outputOf(t, rs, "call_ok"); !strings.Contains(out.Output, "rm -rf") || out.Stop() != omni.StatusCompleted {
				t.Fatalf("allowed output = %+v", out)
			}
			if _, err := os.Stat(filepath.Join(e.ws, "ran-rm")); err == nil {
				t.Fatal("a forbidden command ran")
			}
			if _, err := os.Stat(filepath.Join(e.ws, "victim")); err != nil {
				t.Fatal("the directory was removed")
			}
		})
	}

	t.Run("off", func(t *testing.T) {
		sid := e.session(e.script(script), omni.ApproveAllowAll, func(r *omni.SessionRecord) { r.CommandPolicy = cmdpolicy.Off() })
		rs, status := e.wait(sid, e.submit(sid, "go"))
		if status != omni.StatusCompleted {
			t.Fatalf("status %q; stream %v", status, labels(rs, noPartials))
		}
		if indexOf(labels(rs, nil), "approval_decision:allow:call_rm") < 0 {
			t.Fatalf("stream %v", labels(rs, nil))
		}
		if _, err := os.Stat(filepath.Join(e.ws, "victim")); err == nil {
			t.Fatal("with the policy off the command should have run")
		}
	})
}

func outputOf(t *testing.T, rs []rec, id string) omni.Payload {
	t.Helper()
	for _, r := range rs {
		if r.class != omni.ClassServer && r.msg.Payload.Type == omni.TypeToolCallOutput && r.msg.Payload.ToolCallID == id {
			return r.msg.Payload
		}
	}
	t.Fatalf("no tool_call_output for %s", id)
	return omni.Payload{}
}

// approveAll answers every approval_request of sid with allow until stop.
func (e *env) approveAll(t *testing.T, sid string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		lcApprovalRequests(ctx, e, sid, func(_ omni.ServerEvent, tc omni.Message) {
			if _, err := e.lcControl(sid, omni.CtlApprove, omni.Control{ToolCallID: tc.Payload.ToolCallID, Decision: omni.DecisionAllow}); err != nil {
				t.Errorf("approve %s: %v", tc.Payload.ToolCallID, err)
			}
		})
	}()
	return func() { cancel(); <-done }
}

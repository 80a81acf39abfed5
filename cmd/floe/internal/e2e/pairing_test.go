package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// Every committed tool_call gets exactly one complete output, denials
// included, with three runner replicas; always-ask decisions come from a
// client answering approval requests.
func TestPairingWithThreeRunnersAndDenials(t *testing.T) {
	e := start(t, envOpts{runners: 3})
	const n = 12
	var calls []any
	for i := 0; i < n; i++ {
		calls = append(calls, map[string]any{"name": "exec_command", "id": fmt.Sprintf("c%02d", i),
			"arguments": map[string]any{"description": "job", "cmd": fmt.Sprintf("sleep 0.%d; echo out-%d", i%4, i)}})
	}
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"parallel_tool_calls": calls, "interleave": true}}},
		map[string]any{"steps": []any{map[string]any{"parallel_tool_calls": calls[:4]}}},
		map[string]any{"steps": []any{map[string]any{"text": "all done"}}},
	}})
	sid := e.session(ref, omni.ApproveAlwaysAsk, nil)

	// The approver: allow even calls, deny odd ones.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = bus.FollowUntil(ctx, e.st.JS, sid, []string{omni.ClassServer}, 0, false, func(sm bus.StreamMsg) error {
			var ev omni.ServerEvent
			if json.Unmarshal(sm.Data, &ev) != nil || ev.Type != omni.ServerApprovalRequest {
				return nil
			}
			var tc omni.Message
			if err := omni.Unmarshal(ev.ToolCall, &tc); err != nil {
				t.Errorf("approval_request toolCall: %v", err)
				return nil
			}
			id := tc.Payload.ToolCallID
			d := omni.DecisionAllow
			var k int
			fmt.Sscanf(id[len(id)-2:], "%d", &k)
			if k%2 == 1 {
				d = omni.DecisionDeny
			}
			body, _ := omni.Pack(&omni.Control{ToolCallID: id, Decision: d})
			rep, err := e.st.Conn.Request(omni.ControlSubject(sid, omni.CtlApprove), body, 5*time.Second)
			if err != nil {
				t.Errorf("approve %s: %v", id, err)
				return nil
			}
			var cr omni.ControlReply
			if omni.Unpack(rep.Data, &cr) != nil || !cr.OK {
				t.Errorf("approve %s: reply %+v", id, cr)
			}
			return nil
		})
	}()

	task := e.submit(sid, "many tools")
	rs, status := e.wait(sid, task)
	cancel()
	wg.Wait()
	if status != omni.StatusCompleted {
		t.Fatalf("status = %q; stream %v", status, labels(rs, noPartials))
	}
	checkDiscipline(t, rs)
	// The tool ids repeat across the two requests: the second request's
	// calls got fresh ids from the allocator.
	committed := map[string]bool{}
	outputs := map[string]int{}
	decisions := map[string]string{}
	for _, r := range rs {
		if r.class == omni.ClassServer {
			continue
		}
		p := &r.msg.Payload
		switch {
		case r.msg.Type == omni.KindModel && p.Type == omni.TypeToolCall:
			committed[p.ToolCallID] = true
		case r.msg.Type == omni.KindModel && p.Type == omni.TypeToolCallOutput:
			outputs[p.ToolCallID]++
			if !committed[p.ToolCallID] {
				t.Errorf("output for %s before its call", p.ToolCallID)
			}
			if decisions[p.ToolCallID] == "" {
				t.Errorf("output for %s before its approval_decision", p.ToolCallID)
			}
			if decisions[p.ToolCallID] == omni.DecisionDeny && (p.Output != omni.DeniedByUser || p.StopReason != omni.StatusAborted) {
				t.Errorf("denied %s output = %q/%q", p.ToolCallID, p.Output, p.StopReason)
			}
			if decisions[p.ToolCallID] == omni.DecisionAllow && !strings.HasPrefix(p.Output, "out-") {
				t.Errorf("allowed %s output = %q", p.ToolCallID, p.Output)
			}
		case p.Type == omni.TypeApprovalDecision:
			decisions[p.ToolCallID] = p.Decision
		}
	}
	if len(committed) != n+4 {
		t.Fatalf("committed %d calls, want %d", len(committed), n+4)
	}
	for id := range committed {
		if outputs[id] != 1 {
			t.Errorf("call %s has %d outputs, want exactly 1", id, outputs[id])
		}
	}
}

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine"
)

// Hooks end to end on the whole stack (protocol.md §7): a NATS policy service in a
// queue group denies a push while an ordinary command runs; a command
// stop hook continues the Task once. The model reads the denial naming the
// hook, the continue input arrives as a harness text, and the Trace holds
// every hook record where the original writes it.
func TestHooksOnTheStack(t *testing.T) {
	push := rcExecArgs("push", "git push origin main")
	list := rcExecArgs("list", "echo listed")
	f := rcNewFake(t,
		toolCallsTurn([3]string{"call_push", "exec_command", push}, [3]string{"call_ls", "exec_command", list}),
		rcAnswer("The push was refused."),
		rcAnswer("Checked again."),
	)
	dir := t.TempDir()
	once := filepath.Join(dir, "continued")
	stop := filepath.Join(dir, "stop.sh")
	if err := os.WriteFile(stop, []byte("#!/bin/sh\ncat >/dev/null\nif [ ! -f "+once+" ]; then touch "+once+
		"; echo '{\"decision\":\"continue\",\"input\":\"check once more\",\"reason\":\"first stop\"}'; else echo '{\"decision\":\"stop\"}'; fi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	hooksFile := filepath.Join(dir, "hooks.json")
	b, _ := json.Marshal(map[string]any{"hooks": map[string]any{
		"pre_tool_use": []map[string]any{{"name": "policy", "nats": true, "match": "exec_command", "required": true}},
		"stop":         []map[string]any{{"name": "again", "command": stop}},
	}})
	if err := os.WriteFile(hooksFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	e := rcEnv(t, f, func(c *engine.Config) { c.HooksFile = hooksFile })
	// Two replicas of the policy service in one queue group.
	for range 2 {
		nc, err := e.st.Server.Connect()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		if _, err := nc.QueueSubscribe(omni.HookSubject(omni.HookPreToolUse), "policy", func(m *nats.Msg) {
			var in map[string]string
			_ = json.Unmarshal(m.Data, &in)
			if strings.Contains(in["arguments"], "push origin main") {
				_ = m.Respond([]byte(`{"decision":"deny","reason":"pushes to main are not allowed"}`))
				return
			}
			_ = m.Respond(nil)
		}); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
	}
	sid := e.session("openai:gpt-test", omni.ApproveAllowAll, nil)
	rs, status := e.wait(sid, e.submit(sid, "push and list"))
	if status != omni.StatusCompleted {
		t.Fatalf("status %q; %v", status, labels(rs, noPartials))
	}
	if n := f.requests(); n != 3 {
		t.Fatalf("%d model requests, want 3", n)
	}
	ctx := sentContext(f.body(1))
	if !slices.Contains(ctx, "tool:call_push:Tool call denied by the policy hook: pushes to main are not allowed.") || !slices.Contains(ctx, "tool:call_ls:listed\n") {
		t.Fatalf("the second request got %q", ctx)
	}
	if last := sentContext(f.body(2)); last[len(last)-1] != "user:check once more" {
		t.Fatalf("the third request ends %q", last[len(last)-1])
	}
	// The Trace: the hook record after its call, before its decision; the
	// stop records around the continue input.
	e.lcTraced(sid)
	files, err := trace.Files(e.home, sid)
	if err != nil || len(files) != 1 {
		t.Fatalf("trace files %v, %v", files, err)
	}
	data, _ := os.ReadFile(files[0])
	msgs, skipped, err := trace.Read(strings.NewReader(string(data)))
	if err != nil || len(skipped) > 0 {
		t.Fatal(err, skipped)
	}
	var got []string
	for _, m := range msgs {
		p := &m.Payload
		switch {
		case p.Type == omni.TypeToolCall, p.Type == omni.TypeApprovalDecision:
			got = append(got, p.Type+":"+p.ToolCallID)
		case p.Type == omni.TypeHook:
			r, _ := p.Hook()
			got = append(got, "hook:"+r.Point+":"+r.Name+":"+r.Decision+":"+r.ToolCallID)
		case p.Type == omni.TypeText && p.Sender == omni.SenderHarness:
			got = append(got, "harness:"+p.Text)
		}
	}
	// The record right after its call (the stream waits for the hooks),
	// before the decision; the model stream's next call may come before
	// that decision (the seed's event/content spacing).
	at := func(x string) int { return slices.Index(got, x) }
	call, rec, dec := at("tool_call:call_push"), at("hook:pre_tool_use:policy:deny:call_push"), at("approval_decision:call_push")
	if call < 0 || rec != call+1 || dec < rec {
		t.Fatalf("the Trace has %q: want the hook record right after its call, before its decision", got)
	}
	if slices.ContainsFunc(got, func(s string) bool {
		return strings.HasPrefix(s, "hook:pre_tool_use:") && strings.HasSuffix(s, "call_ls")
	}) {
		t.Fatalf("the service's no-opinion for call_ls was recorded: %q", got)
	}
	tail := got[len(got)-3:]
	if want := []string{"hook:stop:again:continue:", "harness:check once more", "hook:stop:again:stop:"}; !slices.Equal(tail, want) {
		t.Fatalf("the Trace ends %q, want %q", tail, want)
	}
}

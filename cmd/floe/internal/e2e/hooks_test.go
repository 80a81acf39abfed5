package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
	// The stop hook runs confined (protocol.md §7): it keeps its mark in
	// the Workspace, its working directory and all it may write.
	once := ".floe-continued"
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
	e := rcEnv(t, f, func(c *engine.Config) { c.Hooks.File = hooksFile })
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

// Two whole engines (each engine.Run with its own connection, on one
// embedded broker) take the Tasks of eight Sessions, and two replicas of
// one NATS hook service in a queue group answer their pre_tool_use hooks
// (protocol.md §7 "Hooks": several replicas in a queue group): every call is
// answered exactly once, by either replica, whichever engine runs its
// Task; a denial reaches the model of whichever engine asked.
func TestNATSHookQueueGroupSharedByTwoWholeEngines(t *testing.T) {
	dir := t.TempDir()
	hooksFile := filepath.Join(dir, "hooks.json")
	if err := os.WriteFile(hooksFile, []byte(`{"hooks":{"pre_tool_use":[{"name":"policy","nats":true,"match":"exec_command","required":true}]}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var second engine.Config
	e := start(t, envOpts{engine: func(c *engine.Config) {
		// Two Tasks at a time each, so neither engine can take them all.
		c.Hooks.File, c.MaxTasks = hooksFile, 2
		second = *c
	}})
	nc2, err := e.st.Server.Connect()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- engine.Run(ctx, nc2, second, testLogger()) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("the second engine: %v", err)
		}
		nc2.Close()
	})

	// The service: two replicas; each counts its answers and notes which
	// connection asked (a requester's reply subjects share its inbox).
	var mu sync.Mutex
	answered := map[int]int{}
	askers := map[string]int{}
	for i := range 2 {
		nc, err := e.st.Server.Connect()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		if _, err := nc.QueueSubscribe(omni.HookSubject(omni.HookPreToolUse), "policy", func(m *nats.Msg) {
			var in map[string]string
			_ = json.Unmarshal(m.Data, &in)
			mu.Lock()
			answered[i]++
			askers[m.Reply[:strings.LastIndex(m.Reply, ".")]]++
			mu.Unlock()
			if strings.Contains(in["arguments"], "push origin main") {
				_ = m.Respond([]byte(`{"decision":"deny","reason":"pushes to main are not allowed"}`))
				return
			}
			_ = m.Respond([]byte(`{"decision":"allow"}`))
		}); err != nil {
			t.Fatal(err)
		}
		_ = nc.Flush()
	}

	const sessions = 8
	type task struct{ sid, id string }
	var tasks []task
	for i := range sessions {
		ref := e.script(map[string]any{"requests": []any{
			map[string]any{"steps": []any{call("a", fmt.Sprintf("sleep 0.2; echo ran-%d-a", i)), call("b", "git push origin main"), call("c", fmt.Sprintf("echo ran-%d-c", i))}},
			map[string]any{"expect_tool_outputs": []string{"a", "b", "c"}, "steps": []any{map[string]any{"text": "done"}}},
		}})
		sid := e.session(ref, omni.ApproveAllowAll, nil)
		tasks = append(tasks, task{sid, e.submit(sid, "work")})
	}
	for i, tk := range tasks {
		rs, status := e.wait(tk.sid, tk.id)
		if status != omni.StatusCompleted {
			t.Fatalf("session %d: status %q; %v", i, status, labels(rs, noPartials))
		}
		hooks, outputs := map[string]string{}, map[string]string{}
		for _, r := range rs {
			p := &r.msg.Payload
			switch {
			case r.class == omni.ClassServer:
			case p.Type == omni.TypeHook:
				h, _ := p.Hook()
				if _, twice := hooks[h.ToolCallID]; twice {
					t.Errorf("session %d: call %s has two hook records", i, h.ToolCallID)
				}
				hooks[h.ToolCallID] = h.Decision
			case p.Type == omni.TypeToolCallOutput:
				outputs[p.ToolCallID] = p.Output
			}
		}
		if want := map[string]string{"a": "allow", "b": "deny", "c": "allow"}; fmt.Sprint(hooks) != fmt.Sprint(want) {
			t.Errorf("session %d: hook records %v, want %v", i, hooks, want)
		}
		if outputs["b"] != "Tool call denied by the policy hook: pushes to main are not allowed." ||
			outputs["a"] != fmt.Sprintf("ran-%d-a\n", i) || outputs["c"] != fmt.Sprintf("ran-%d-c\n", i) {
			t.Errorf("session %d: outputs %q", i, outputs)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if n := answered[0] + answered[1]; n != 3*sessions {
		t.Errorf("the service answered %d requests, want %d (one per call)", n, 3*sessions)
	}
	if answered[0] == 0 || answered[1] == 0 {
		t.Errorf("one replica answered everything: %v", answered)
	}
	if len(askers) != 2 {
		t.Errorf("hook requests came from %d connections, want both engines': %v", len(askers), askers)
	}
	t.Logf("replicas answered %v; requests per engine connection %v", answered, askers)
}

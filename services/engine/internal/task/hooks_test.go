package task

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/hooks"
)

// withHooks gives the harness's Tasks the hooks of file (a FLOE_HOOKS
// document) on the test's broker.
func (h *harness) withHooks(file map[string]any) {
	h.t.Helper()
	b, err := json.Marshal(file)
	if err != nil {
		h.t.Fatal(err)
	}
	cfg, err := hooks.Parse(b)
	if err != nil {
		h.t.Fatal(err)
	}
	h.deps.Hooks = hooks.New(cfg, h.env.Conn, nil)
}

// hookScript writes an executable shell script.
func hookScript(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hook.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func hookRecords(msgs []omni.Message) []omni.HookRecord {
	var out []omni.HookRecord
	for i := range msgs {
		if r, ok := msgs[i].Payload.Hook(); ok {
			out = append(out, r)
		}
	}
	return out
}

// A pre_tool_use hook denies a call outright, whatever the mode: its
// record comes right after the call, then approval_decision deny and the
// aborted output naming the hook and its reason; nothing runs. Another
// call the hook answers allow is still decided by the mode and runs.
func TestPreToolUseHookDeniesACall(t *testing.T) {
	h := newHarness(t, `{"requests": [
  {"steps": [
    {"tool_call": {"name": "exec_command", "id": "call_push", "arguments": {"cmd": "git push origin main"}}},
    {"tool_call": {"name": "exec_command", "id": "call_ls", "arguments": {"cmd": "ls"}}}
  ]},
  {"expect_tool_outputs": ["call_push", "call_ls"], "steps": [{"text": "done"}]}
]}`, nil)
	h.withHooks(map[string]any{"hooks": map[string]any{"pre_tool_use": []map[string]any{
		{"name": "no-push-main", "match": "exec_command", "command": hookScript(t,
			`if grep -q 'push origin main'; then echo '{"decision":"deny","reason":"pushes to main are not allowed"}'; else echo '{"decision":"allow"}'; fi`)},
	}}})
	sid := "hook1"
	h.session(sid, omni.ApproveAllowAll)
	fr := h.runner(sid, echo)
	if st := h.wait(h.run(sid, "t1", "push it")); st != Completed {
		t.Fatalf("status %q", st)
	}
	msgs := h.messages(sid)
	call := index(msgs, isType(omni.TypeToolCall, "call_push"))
	rec := index(msgs, func(m *omni.Message) bool { r, ok := m.Payload.Hook(); return ok && r.ToolCallID == "call_push" })
	dec := index(msgs, isType(omni.TypeApprovalDecision, "call_push"))
	out := index(msgs, isType(omni.TypeToolCallOutput, "call_push"))
	if call < 0 || rec < 0 || dec < 0 || out < 0 || !(call < rec && rec < dec && dec < out) {
		t.Fatalf("call@%d hook@%d decision@%d output@%d%s", call, rec, dec, out, dump(msgs))
	}
	r, _ := msgs[rec].Payload.Hook()
	if r.Point != omni.HookPreToolUse || r.Name != "no-push-main" || r.Decision != omni.DecisionDeny || r.Reason != "pushes to main are not allowed" {
		t.Fatalf("record %+v", r)
	}
	if d := msgs[dec].Payload.Decision; d != omni.DecisionDeny {
		t.Fatalf("decision %q", d)
	}
	o := msgs[out].Payload
	if o.Output != "Tool call denied by the no-push-main hook: pushes to main are not allowed." || o.StopReason != omni.StatusAborted {
		t.Fatalf("output %q/%q", o.Output, o.StopReason)
	}
	if got := fr.ran(); len(got) != 1 || got[0] != "call_ls" {
		t.Fatalf("ran %v, want [call_ls]", got)
	}
	if d := msgs[index(msgs, isType(omni.TypeApprovalDecision, "call_ls"))].Payload.Decision; d != omni.DecisionAllow {
		t.Fatalf("call_ls decided %q", d)
	}
	if rs := hookRecords(msgs); len(rs) != 2 || rs[1].ToolCallID != "call_ls" || rs[1].Decision != omni.DecisionAllow {
		t.Fatalf("records %+v", rs)
	}
}

// A hook's allow does not override the approval mode (protocol.md §7): under
// deny-all the call is still denied, by the user.
func TestPreToolUseHookAllowLeavesTheMode(t *testing.T) {
	h := newHarness(t, twoCallsScript, nil)
	h.withHooks(map[string]any{"hooks": map[string]any{"pre_tool_use": []map[string]any{
		{"name": "yes", "command": hookScript(t, `echo '{"decision":"allow"}'`)},
	}}})
	sid := "hook2"
	h.session(sid, omni.ApproveDenyAll)
	fr := h.runner(sid, echo)
	if st := h.wait(h.run(sid, "t1", "run two")); st != Completed {
		t.Fatalf("status %q", st)
	}
	msgs := h.messages(sid)
	for _, id := range []string{"call_a", "call_b"} {
		if o := msgs[index(msgs, isType(omni.TypeToolCallOutput, id))].Payload.Output; o != omni.DeniedByUser {
			t.Fatalf("%s output %q", id, o)
		}
	}
	if len(fr.ran()) != 0 {
		t.Fatalf("ran %v", fr.ran())
	}
}

// A ralph-style stop hook keeps the Task going with its input (a harness
// text) until the answer says the tests pass; its records are on the
// stream in order.
func TestStopHookContinuesUntilDone(t *testing.T) {
	h := newHarness(t, `{"requests": [
  {"steps": [{"text": "tests fail"}]},
  {"expect_last_user": "run the tests again", "steps": [{"text": "tests pass"}]}
]}`, nil)
	h.withHooks(map[string]any{"hooks": map[string]any{"stop": []map[string]any{
		{"name": "ralph", "command": hookScript(t,
			`if grep -q '"last_text":"tests pass"'; then echo '{"decision":"stop","reason":"done"}'; else echo '{"decision":"continue","input":"run the tests again","reason":"not yet"}'; fi`)},
	}}})
	sid := "hook3"
	h.session(sid, omni.ApproveAllowAll)
	if st := h.wait(h.run(sid, "t1", "fix it")); st != Completed {
		t.Fatalf("status %q", st)
	}
	msgs := h.messages(sid)
	rs := hookRecords(msgs)
	if len(rs) != 2 || rs[0].Decision != omni.DecisionContinue || rs[0].Reason != "not yet" || rs[1].Decision != omni.DecisionStop {
		t.Fatalf("records %+v%s", rs, dump(msgs))
	}
	in := index(msgs, func(m *omni.Message) bool {
		return m.Payload.Type == omni.TypeText && m.Payload.Text == "run the tests again"
	})
	first := index(msgs, func(m *omni.Message) bool {
		r, ok := m.Payload.Hook()
		return ok && r.Decision == omni.DecisionContinue
	})
	if in < 0 || first > in || msgs[in].Payload.Sender != omni.SenderHarness || msgs[in].Payload.Role != omni.RoleUser {
		t.Fatalf("the continue input@%d after its record@%d%s", in, first, dump(msgs))
	}
	if errs := h.prov.Mismatches(); len(errs) > 0 {
		t.Fatalf("the model got: %v", errs)
	}
}

// A stop hook that always continues is bounded by maxTurns: the Task ends
// with the max-turns notice, and the answers after that cutoff are
// recorded, never honoured.
func TestStopHookContinueIsBoundedByMaxTurns(t *testing.T) {
	h := newHarness(t, `{"requests": [
  {"steps": [{"text": "one"}]},
  {"steps": [{"text": "two"}]},
  {"steps": [{"text": "three"}]}
]}`, nil)
	h.withHooks(map[string]any{"hooks": map[string]any{"stop": []map[string]any{
		{"name": "forever", "command": hookScript(t, `echo '{"decision":"continue","input":"again"}'`)},
	}}})
	sid := "hook4"
	h.sessionWith(sid, omni.ApproveAllowAll, func(r *omni.SessionRecord) { r.MaxTurns = 2 })
	if st := h.wait(h.run(sid, "t1", "go")); st != Failed {
		t.Fatalf("status %q, want failed (max turns)", st)
	}
	if n := h.prov.Calls(sid); n != 2 {
		t.Fatalf("%d requests, want 2", n)
	}
	msgs := h.messages(sid)
	if index(msgs, func(m *omni.Message) bool {
		return m.Payload.Text == omni.MaxTurnsNotice(2) && m.Payload.Type == omni.TypeText
	}) < 0 {
		t.Fatalf("no max-turns notice%s", dump(msgs))
	}
	if rs := hookRecords(msgs); len(rs) != 3 {
		t.Fatalf("records %+v, want 3 (two honoured, one after the cutoff)", rs)
	}
}

// A user_prompt hook's context goes before the Prompt as a harness text
// the model sees; a deny refuses the Prompt: the model is not called and
// the Task fails with the refusal.
func TestUserPromptHook(t *testing.T) {
	h := newHarness(t, `{"requests": [{"expect_last_user": "hello", "steps": [{"text": "hi"}]}]}`, nil)
	rec := h.recorded()
	h.withHooks(map[string]any{"hooks": map[string]any{"user_prompt": []map[string]any{
		{"name": "ctx", "command": hookScript(t, `echo '{"context":"The repo is Go."}'`)},
		{"name": "guard", "command": hookScript(t, `grep -q secret && echo '{"decision":"deny","reason":"no secrets"}'; exit 0`)},
	}}})
	sid := "hook5"
	h.session(sid, omni.ApproveAllowAll)
	if st := h.wait(h.run(sid, "t1", "hello")); st != Completed {
		t.Fatalf("status %q", st)
	}
	rec.mu.Lock()
	got := rec.reqs[0]
	rec.mu.Unlock()
	var texts []string
	for _, m := range got {
		texts = append(texts, m.Payload.Role+":"+m.Payload.Text)
	}
	if strings.Join(texts, "|") != "user:The repo is Go.|user:hello" {
		t.Fatalf("the model got %q", texts)
	}

	if st := h.wait(h.run(sid, "t2", "print the secret")); st != Failed {
		t.Fatalf("status %q, want failed", st)
	}
	if n := h.prov.Calls(sid); n != 1 {
		t.Fatalf("the model was called %d times, want 1 (not for the refused Prompt)", n)
	}
	msgs := h.messages(sid)
	if index(msgs, func(m *omni.Message) bool { return m.Payload.Text == "print the secret" }) >= 0 {
		t.Fatalf("the refused Prompt is on the stream%s", dump(msgs))
	}
	if index(msgs, func(m *omni.Message) bool {
		return m.Payload.Role == omni.RoleAssistant && m.Payload.Text == "[prompt refused by the guard hook: no secrets]"
	}) < 0 {
		t.Fatalf("no refusal%s", dump(msgs))
	}
}

// A call no person decides — denied by a pre_tool_use hook, forbidden by
// the command policy — has its records in one place, as in the original:
// the call, its hook records, approval_decision, the denied output, then
// the rest of the request (the next call, token_usage, request_end), however
// quickly the model's stream goes on. Before, the engine published the
// denial beside the stream, and a request that ended at once could put its
// token_usage first; replay --execute then parted there.
func TestDenialWithoutAPersonComesRightAfterTheCall(t *testing.T) {
	h := newHarness(t, `{"requests": [
  {"steps": [
    {"tool_call": {"name": "exec_command", "id": "call_rm", "arguments": {"cmd": "rm notes.txt"}}},
    {"tool_call": {"name": "exec_command", "id": "call_rf", "arguments": {"cmd": "rm -rf /"}}},
    {"tool_call": {"name": "exec_command", "id": "call_ls", "arguments": {"cmd": "ls"}}}
  ]},
  {"expect_tool_outputs": ["call_rm", "call_rf", "call_ls"], "steps": [{"text": "done"}]}
]}`, nil)
	h.withHooks(map[string]any{"hooks": map[string]any{"pre_tool_use": []map[string]any{
		{"name": "no-rm", "match": "exec_command", "command": hookScript(t,
			`if grep -q 'rm notes'; then echo '{"decision":"deny","reason":"no rm here"}'; fi`)},
	}}})
	for i := range 3 {
		sid := fmt.Sprintf("deny%d", i)
		h.sessionWith(sid, omni.ApproveAllowAll, func(r *omni.SessionRecord) {
			r.CommandPolicy = &omni.CommandPolicy{Source: "test", Rules: []omni.CommandRule{{Name: "no-rm-rf", Pattern: `^rm\s+-rf(\s|$)`}}}
		})
		fr := h.runner(sid, echo)
		if st := h.wait(h.run(sid, "t1", "tidy")); st != Completed {
			t.Fatalf("status %q", st)
		}
		var got []string
		for _, m := range h.messages(sid) {
			p := m.Payload
			switch {
			case m.IsPartial():
			case p.Type == omni.TypeToolCall, p.Type == omni.TypeApprovalDecision && p.Decision != omni.DecisionAllow:
				got = append(got, p.Type+":"+p.ToolCallID)
			case p.Type == omni.TypeToolCallOutput && p.StopReason == omni.StatusAborted:
				got = append(got, p.Type+":"+p.ToolCallID)
			case p.Type == omni.TypeHook:
				got = append(got, p.Type+":"+p.ToolCallID)
			case p.Type == omni.TypeTokenUsage:
				got = append(got, p.Type)
			}
		}
		want := []string{
			"tool_call:call_rm", "hook:call_rm", "approval_decision:call_rm", "tool_call_output:call_rm",
			"tool_call:call_rf", "approval_decision:call_rf", "tool_call_output:call_rf",
			"tool_call:call_ls", "token_usage", "token_usage",
		}
		if !slices.Equal(got, want) {
			t.Fatalf("run %d: records\n%q\nwant\n%q", i, got, want)
		}
		if ran := fr.ran(); !slices.Equal(ran, []string{"call_ls"}) {
			t.Fatalf("ran %v, want [call_ls]", ran)
		}
	}
}

package hooks

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/procfs"
)

// script writes an executable shell script and returns its path.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "hook.sh")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustParse(t *testing.T, v any) *Config {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(b)
	if err != nil {
		t.Fatalf("Parse(%s) = %v", b, err)
	}
	return c
}

func preTool(ws string) Input {
	return Input{Point: omni.HookPreToolUse, SessionID: "s1", TaskID: "t1", Workspace: ws,
		ToolName: "exec_command", ToolCallID: "call_1", Arguments: `{"cmd":"git push origin main"}`}
}

func TestCommandHooksDecide(t *testing.T) {
	ws := t.TempDir()
	tests := []struct {
		name  string
		hooks []Hook
		in    Input
		want  Outcome
	}{
		{
			name:  "allow is recorded and denies nothing",
			hooks: []Hook{{Name: "ok", Command: script(t, `echo '{"decision":"allow","reason":"fine"}'`)}},
			in:    preTool(ws),
			want:  Outcome{Records: []omni.HookRecord{{Point: "pre_tool_use", Name: "ok", Decision: "allow", Reason: "fine", ToolCallID: "call_1"}}},
		},
		{
			name: "the first deny wins and later hooks still run",
			hooks: []Hook{
				{Name: "audit", Command: script(t, `cat >/dev/null; echo '{"output":{"n":1}}'`)},
				{Name: "no-push", Command: script(t, `grep -q 'push origin main' && echo '{"decision":"deny","reason":"pushes to main are not allowed"}'; exit 0`)},
				{Name: "late", Command: script(t, `echo '{"decision":"deny","reason":"me too"}'`)},
			},
			in: preTool(ws),
			want: Outcome{Deny: true, By: "no-push", Reason: "pushes to main are not allowed", Records: []omni.HookRecord{
				{Point: "pre_tool_use", Name: "audit", Output: map[string]any{"n": json.Number("1")}, ToolCallID: "call_1"},
				{Point: "pre_tool_use", Name: "no-push", Decision: "deny", Reason: "pushes to main are not allowed", ToolCallID: "call_1"},
				{Point: "pre_tool_use", Name: "late", Decision: "deny", Reason: "me too", ToolCallID: "call_1"},
			}},
		},
		{
			name:  "no answer is no opinion and no record",
			hooks: []Hook{{Name: "quiet", Command: script(t, `cat >/dev/null`)}},
			in:    preTool(ws),
			want:  Outcome{},
		},
		{
			name:  "match picks the tools a hook sees",
			hooks: []Hook{{Name: "files", Match: "write_file|edit_file", Command: script(t, `echo '{"decision":"deny"}'`)}},
			in:    preTool(ws),
			want:  Outcome{},
		},
		{
			name:  "a crashing hook is no opinion, recorded with its stderr",
			hooks: []Hook{{Name: "crash", Command: script(t, `echo boom >&2; exit 3`)}},
			in:    preTool(ws),
			want:  Outcome{Records: []omni.HookRecord{{Point: "pre_tool_use", Name: "crash", Reason: "hook failed: exit status 3: boom", ToolCallID: "call_1"}}},
		},
		{
			name:  "garbage is no opinion",
			hooks: []Hook{{Name: "junk", Command: script(t, `echo 'not json'`)}},
			in:    preTool(ws),
			want:  Outcome{Records: []omni.HookRecord{{Point: "pre_tool_use", Name: "junk", Reason: "hook failed: answer: not a JSON object: not json", ToolCallID: "call_1"}}},
		},
		{
			name:  "a required hook that fails denies",
			hooks: []Hook{{Name: "gate", Required: true, Command: script(t, `exit 1`)}},
			in:    preTool(ws),
			want: Outcome{Deny: true, By: "gate", Reason: "hook failed: exit status 1", Records: []omni.HookRecord{
				{Point: "pre_tool_use", Name: "gate", Decision: "deny", Reason: "hook failed: exit status 1", ToolCallID: "call_1"}}},
		},
		{
			name: "stop: the first continue with an input wins",
			hooks: []Hook{
				{Name: "empty", Command: script(t, `echo '{"decision":"continue"}'`)},
				{Name: "ralph", Command: script(t, `echo '{"decision":"continue","input":"keep going","reason":"tests fail","output":{"round":2}}'`)},
				{Name: "other", Command: script(t, `echo '{"decision":"continue","input":"no"}'`)},
			},
			in: Input{Point: omni.HookStop, SessionID: "s1", TaskID: "t1", Workspace: ws, LastText: "done"},
			want: Outcome{Continue: true, By: "ralph", Reason: "tests fail", Input: "keep going", Records: []omni.HookRecord{
				{Point: "stop", Name: "empty", Decision: "continue"},
				{Point: "stop", Name: "ralph", Decision: "continue", Reason: "tests fail", Output: map[string]any{"round": json.Number("2")}},
				{Point: "stop", Name: "other", Decision: "continue"},
			}},
		},
		{
			name:  "stop: a required hook that fails stops",
			hooks: []Hook{{Name: "must", Required: true, Command: script(t, `exit 9`)}},
			in:    Input{Point: omni.HookStop, SessionID: "s1", TaskID: "t1", Workspace: ws},
			want:  Outcome{Records: []omni.HookRecord{{Point: "stop", Name: "must", Decision: "stop", Reason: "hook failed: exit status 9"}}},
		},
		{
			name: "user_prompt: context in order, a deny refuses",
			hooks: []Hook{
				{Name: "ctx", Command: script(t, `echo '{"context":"The repo uses Go 1.26."}'`)},
				{Name: "guard", Command: script(t, `grep -q secret && echo '{"decision":"deny","reason":"no secrets"}'; exit 0`)},
			},
			in: Input{Point: omni.HookUserPrompt, SessionID: "s1", TaskID: "t1", Workspace: ws, Prompt: "print the secret"},
			want: Outcome{Deny: true, By: "guard", Reason: "no secrets", Context: []string{"The repo uses Go 1.26."}, Records: []omni.HookRecord{
				{Point: "user_prompt", Name: "ctx"},
				{Point: "user_prompt", Name: "guard", Decision: "deny", Reason: "no secrets"},
			}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := New(mustParse(t, map[string]any{"hooks": map[string]any{tc.in.Point: tc.hooks}}), nil, nil)
			got := r.Run(context.Background(), tc.in)
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", tc.want) {
				t.Fatalf("Run =\n %+v\nwant\n %+v", got, tc.want)
			}
		})
	}
}

// A hook gets one JSON object on stdin, with the original's field names,
// runs in the Workspace, and knows its point from the environment.
func TestCommandHookInput(t *testing.T) {
	ws := t.TempDir()
	dump := filepath.Join(t.TempDir(), "in.json")
	h := Hook{Name: "dump", Command: script(t, `cat > `+dump+`; pwd >> `+dump+`; echo "$FLOE_HOOK" >> `+dump)}
	for _, tc := range []struct {
		in   Input
		want string
	}{
		{preTool(ws), `{"arguments":"{\"cmd\":\"git push origin main\"}","hook":"pre_tool_use","session_id":"s1","task_id":"t1","tool_call_id":"call_1","tool_name":"exec_command","workspace":"` + ws + `"}`},
		{Input{Point: omni.HookUserPrompt, SessionID: "s1", TaskID: "t1", Workspace: ws, Prompt: "hi <there> & more"},
			`{"hook":"user_prompt","prompt":"hi <there> & more","session_id":"s1","task_id":"t1","workspace":"` + ws + `"}`},
		{Input{Point: omni.HookStop, SessionID: "s1", TaskID: "t1", Workspace: ws, LastText: "bye"},
			`{"hook":"stop","last_text":"bye","session_id":"s1","task_id":"t1","workspace":"` + ws + `"}`},
		{Input{Point: omni.HookStop, SessionID: "s1", TaskID: "t1", Workspace: ws},
			`{"hook":"stop","session_id":"s1","task_id":"t1","workspace":"` + ws + `"}`},
	} {
		r := New(mustParse(t, map[string]any{"hooks": map[string]any{tc.in.Point: []Hook{h}}}), nil, nil)
		r.Run(context.Background(), tc.in)
		b, err := os.ReadFile(dump)
		if err != nil {
			t.Fatal(err)
		}
		if want := tc.want + "\n" + ws + "\n" + tc.in.Point + "\n"; string(b) != want {
			t.Errorf("%s hook got\n%s\nwant\n%s", tc.in.Point, b, want)
		}
	}
}

// A hanging hook is killed at its time limit, with what it started, and
// counts as no opinion (denies when required).
func TestHangingCommandHookTimesOut(t *testing.T) {
	ws := t.TempDir()
	pidFile := filepath.Join(t.TempDir(), "pid")
	hang := script(t, `sleep 60 & echo $! > `+pidFile+`; wait`)
	for _, required := range []bool{false, true} {
		r := New(mustParse(t, map[string]any{"hooks": map[string]any{"pre_tool_use": []Hook{
			{Name: "hang", Command: hang, TimeoutMs: 300, Required: required}}}}), nil, nil)
		start := time.Now()
		got := r.Run(context.Background(), preTool(ws))
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("the hook held the call %s", d)
		}
		want := omni.HookRecord{Point: "pre_tool_use", Name: "hang", Reason: "hook failed: timed out after 300ms", ToolCallID: "call_1"}
		if required {
			want.Decision = omni.DecisionDeny
		}
		if len(got.Records) != 1 || fmt.Sprint(got.Records[0]) != fmt.Sprint(want) || got.Deny != required {
			t.Fatalf("required=%v: Run = %+v", required, got)
		}
		b, _ := os.ReadFile(pidFile)
		var pid int
		fmt.Sscan(string(b), &pid)
		if pid == 0 {
			t.Fatal("the hook's child never started")
		}
		bustest.Eventually(t, 2*time.Second, "the hook's child to be killed", func() bool {
			return !procfs.Alive(pid)
		})
	}
}

// serve answers hook requests on floe.hook.<point> in queue group q with
// answer(request) until the test ends; it counts what it answered.
func serve(t *testing.T, nc *nats.Conn, point, q string, answer func(in map[string]string) string) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	sub, err := nc.QueueSubscribe(omni.HookSubject(point), q, func(m *nats.Msg) {
		var in map[string]string
		_ = json.Unmarshal(m.Data, &in)
		n.Add(1)
		if a := answer(in); a != "-" {
			_ = m.Respond([]byte(a))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return &n
}

func TestNATSHooks(t *testing.T) {
	env := bustest.Start(t, bus.Config{})
	svc := bustest.Connect(t, env.Server)
	serve(t, svc, omni.HookPreToolUse, "policy", func(in map[string]string) string {
		if strings.Contains(in["arguments"], "push origin main") {
			return `{"decision":"deny","reason":"pushes to main are not allowed"}`
		}
		return `{"decision":"allow"}`
	})
	serve(t, svc, omni.HookStop, "ralph", func(in map[string]string) string {
		if in["last_text"] != "tests pass" {
			return `{"decision":"continue","input":"run the tests again","output":{"round":1}}`
		}
		return ""
	})
	serve(t, svc, omni.HookUserPrompt, "hang", func(map[string]string) string { return "-" })
	cfg := mustParse(t, map[string]any{"hooks": map[string]any{
		"pre_tool_use": []Hook{{Name: "policy", NATS: true}},
		"stop":         []Hook{{Name: "ralph", NATS: true}},
		"user_prompt":  []Hook{{Name: "slow", NATS: true, TimeoutMs: 200}, {Name: "slow-required", NATS: true, TimeoutMs: 200, Required: true}},
	}})
	r := New(cfg, bustest.Connect(t, env.Server), nil)
	ctx := context.Background()
	ws := t.TempDir()

	if got := r.Run(ctx, preTool(ws)); !got.Deny || got.By != "policy" || got.Reason != "pushes to main are not allowed" {
		t.Errorf("deny: %+v", got)
	}
	in := preTool(ws)
	in.Arguments = `{"cmd":"ls"}`
	if got := r.Run(ctx, in); got.Deny || len(got.Records) != 1 || got.Records[0].Decision != omni.DecisionAllow {
		t.Errorf("allow: %+v", got)
	}
	got := r.Run(ctx, Input{Point: omni.HookStop, SessionID: "s1", TaskID: "t1", Workspace: ws, LastText: "one test fails"})
	if !got.Continue || got.Input != "run the tests again" || len(got.Records) != 1 || got.Records[0].Output["round"] != json.Number("1") {
		t.Errorf("continue: %+v", got)
	}
	if got := r.Run(ctx, Input{Point: omni.HookStop, SessionID: "s1", TaskID: "t1", Workspace: ws, LastText: "tests pass"}); got.Continue || len(got.Records) != 0 {
		t.Errorf("no opinion: %+v", got)
	}
	// A service that never answers: timed out; the required one denies.
	got = r.Run(ctx, Input{Point: omni.HookUserPrompt, SessionID: "s1", TaskID: "t1", Workspace: ws, Prompt: "hi"})
	if !got.Deny || got.By != "slow-required" || len(got.Records) != 2 || got.Records[0].Reason != "hook failed: timed out after 200ms" || got.Records[0].Decision != "" {
		t.Errorf("hanging: %+v", got)
	}
}

// A NATS hook nobody serves fails at once (no responders); a crashing
// service (one that reports an error) fails; neither holds the call.
func TestNATSHookWithoutServiceFails(t *testing.T) {
	env := bustest.Start(t, bus.Config{})
	svc := bustest.Connect(t, env.Server)
	sub, err := svc.Subscribe(omni.HookSubject(omni.HookStop), func(m *nats.Msg) {
		reply := nats.NewMsg(m.Reply)
		reply.Header.Set("Nats-Service-Error", "panic: nil map")
		reply.Header.Set("Nats-Service-Error-Code", "500")
		_ = m.RespondMsg(reply)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	_ = svc.Flush()
	cfg := mustParse(t, map[string]any{"hooks": map[string]any{
		"pre_tool_use": []Hook{{Name: "gone", NATS: true, Required: true}},
		"stop":         []Hook{{Name: "broken", NATS: true}},
	}})
	r := New(cfg, bustest.Connect(t, env.Server), nil)
	start := time.Now()
	got := r.Run(context.Background(), preTool(t.TempDir()))
	if !got.Deny || got.Reason != "hook failed: no service answers floe.hook.pre_tool_use" {
		t.Errorf("no responders: %+v", got)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("no responders took %s", d)
	}
	got = r.Run(context.Background(), Input{Point: omni.HookStop, SessionID: "s1", TaskID: "t1"})
	if got.Continue || len(got.Records) != 1 || got.Records[0].Reason != "hook failed: service error: panic: nil map" {
		t.Errorf("service error: %+v", got)
	}
}

// Two engines' Tasks (two Runners on their own connections) share one hook
// service running as two replicas in one queue group: every call is
// answered exactly once, and both replicas take a share.
func TestNATSHookQueueGroupSharedByTwoEngines(t *testing.T) {
	env := bustest.Start(t, bus.Config{})
	var answered sync.Map
	answer := func(in map[string]string) string {
		if _, dup := answered.LoadOrStore(in["tool_call_id"], true); dup {
			t.Errorf("call %s answered twice", in["tool_call_id"])
		}
		return `{"decision":"deny","reason":"seen ` + in["tool_call_id"] + `"}`
	}
	a := serve(t, bustest.Connect(t, env.Server), omni.HookPreToolUse, "audit-replicas", answer)
	b := serve(t, bustest.Connect(t, env.Server), omni.HookPreToolUse, "audit-replicas", answer)
	cfg := mustParse(t, map[string]any{"hooks": map[string]any{"pre_tool_use": []Hook{{Name: "audit", NATS: true}}}})
	engines := []*Runner{New(cfg, bustest.Connect(t, env.Server), nil), New(cfg, bustest.Connect(t, env.Server), nil)}
	const perEngine = 20
	var wg sync.WaitGroup
	for e, r := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perEngine {
				in := preTool("")
				in.ToolCallID = fmt.Sprintf("e%d-call-%d", e, i)
				got := r.Run(context.Background(), in)
				if !got.Deny || got.Reason != "seen "+in.ToolCallID {
					t.Errorf("%s: %+v", in.ToolCallID, got)
				}
			}
		}()
	}
	wg.Wait()
	if n := a.Load() + b.Load(); n != 2*perEngine {
		t.Fatalf("the replicas answered %d requests, want %d", n, 2*perEngine)
	}
	if a.Load() == 0 || b.Load() == 0 {
		t.Fatalf("one replica took every request: %d and %d", a.Load(), b.Load())
	}
}

func TestParseRejectsBadFiles(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{`{"hooks":{"post_tool_use":[]}}`, "unknown point"},
		{`{"hooks":{"stop":[{"command":"x"}]}}`, "name is required"},
		{`{"hooks":{"stop":[{"name":"a","command":"x"},{"name":"a","command":"y"}]}}`, "used twice"},
		{`{"hooks":{"stop":[{"name":"a"}]}}`, "command or"},
		{`{"hooks":{"stop":[{"name":"a","command":"x","nats":true}]}}`, "exclude"},
		{`{"hooks":{"stop":[{"name":"a","command":"x","match":"y"}]}}`, "pre_tool_use hooks only"},
		{`{"hooks":{"pre_tool_use":[{"name":"a","command":"x","match":"("}]}}`, "match"},
		{`{"hooks":{"stop":[{"name":"a","command":"x","timeout_ms":-1}]}}`, "timeout_ms"},
		{`{"hooks":{"stop":[{"name":"a","command":"x","tiemout_ms":5}]}}`, "unknown field"},
		{`{"hooks":{}} {}`, "trailing"},
	} {
		if _, err := Parse([]byte(tc.file)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%s) = %v, want an error with %q", tc.file, err, tc.want)
		}
	}
}

func TestParseAnswer(t *testing.T) {
	for _, tc := range []struct {
		point, in string
		want      string // %+v of the answer, or "error"
	}{
		{"stop", "", "<nil>"},
		{"stop", " \n", "<nil>"},
		{"stop", "{}", "&{Decision: Reason: Context: Input: Output:map[]}"},
		{"stop", `{"decision":"deny","input":"x"}`, "&{Decision: Reason: Context: Input:x Output:map[]}"},
		{"pre_tool_use", `{"decision":"continue","reason":7,"output":{"a":[1],"b":"c"}}`, "&{Decision: Reason: Context: Input: Output:map[b:c]}"},
		{"user_prompt", `{"decision":"deny","context":"c"}`, "&{Decision:deny Reason: Context:c Input: Output:map[]}"},
		{"stop", `[]`, "error"},
		{"stop", `null`, "error"},
		{"stop", `{} {}`, "error"},
		{"stop", `{"a":`, "error"},
		{"stop", "\xff{}", "error"},
	} {
		a, err := ParseAnswer(tc.point, []byte(tc.in))
		got := fmt.Sprintf("%+v", a)
		if err != nil {
			got = "error"
		}
		if a != nil && a.Output == nil {
			got = strings.Replace(got, "Output:map[]", "Output:map[]", 1)
		}
		if got != tc.want {
			t.Errorf("ParseAnswer(%s, %q) = %s (%v), want %s", tc.point, tc.in, got, err, tc.want)
		}
	}
}

func FuzzParseAnswer(f *testing.F) {
	for _, s := range []string{"", "{}", `{"decision":"continue","input":"x","output":{"a":1,"b":[2]}}`, `{"decision":"deny","reason":"r"}`, `[1]`, `{"output":null}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, p := range Points {
			a, err := ParseAnswer(p, []byte(s))
			if err != nil || a == nil {
				continue
			}
			if !json.Valid([]byte(strings.TrimSpace(s))) {
				t.Fatalf("ParseAnswer(%q) accepted invalid JSON", s)
			}
			// An answer records as a hook event that reads back.
			m := omni.HookEvent(omni.HookRecord{Point: p, Name: "f", Decision: a.Decision, Reason: a.Reason, Output: a.Output})
			if _, err := omni.Decode(omni.MustMarshal(&m)); err != nil {
				t.Fatalf("the record of %q does not decode: %v", s, err)
			}
		}
	})
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"hooks":{"pre_tool_use":[{"name":"a","command":"x","args":["y"],"match":"exec_.*","timeout_ms":5,"required":true}],"stop":[{"name":"s","nats":true}]}}`,
		`{"hooks":{}}`, `{}`, `{"hooks":{"stop":[{"name":"a"}]}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := Parse([]byte(s))
		if err != nil {
			return
		}
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Parse(b); err != nil {
			t.Fatalf("Parse(%q) accepted, its re-encoding %s is refused: %v", s, b, err)
		}
	})
}

// A hook command gets a plain environment (never the engine's credentials)
// and a relative command path is the hooks file's neighbour.
func TestCommandHookEnvironmentAndPath(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "sk-secret")
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "hooks"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hooks", "env.sh"), []byte("#!/bin/sh\ncat >/dev/null\nprintf '{\"reason\":\"%s|%s|%s\"}' \"$OPENAI_API_KEY\" \"$FLOE_HOOK\" \"$FLOE_TASK_ID\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "hooks.json")
	if err := os.WriteFile(file, []byte(`{"hooks":{"stop":[{"name":"env","command":"./hooks/env.sh"}]}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(file)
	if err != nil {
		t.Fatal(err)
	}
	got := New(cfg, nil, nil).Run(context.Background(), Input{Point: omni.HookStop, SessionID: "s1", TaskID: "t9", Workspace: t.TempDir()})
	if len(got.Records) != 1 || got.Records[0].Reason != "|stop|t9" {
		t.Fatalf("Run = %+v", got)
	}
}

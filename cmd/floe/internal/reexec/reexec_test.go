package reexec

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/sandbox"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine"
	"floe.dev/services/toolrunner"
	"floe.dev/services/tracer"
)

var (
	update = flag.Bool("update", false, "record the regression corpus (testdata/corpus) again with the scripted models")
	only   = flag.String("only", "", "with -update, record only this corpus Session")
)

func corpus(t *testing.T) []string {
	t.Helper()
	all, err := filepath.Glob(filepath.Join("testdata", "corpus", "*.jsonl"))
	// Subagent children's Trace files (session-…_NNN.jsonl) are replayed
	// with their parent.
	var files []string
	for _, f := range all {
		if !strings.HasPrefix(filepath.Base(f), "session-") {
			files = append(files, f)
		}
	}
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus under testdata/corpus (%v); record it with go test -run TestCorpus -update", err)
	}
	return files
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// The regression corpus: every recorded Session re-executes through the
// current engine into exactly its recorded Trace. An engine change that
// changes behaviour fails here with the first differing record.
func TestCorpusReplaysExactly(t *testing.T) {
	if *update {
		recordCorpus(t)
	}
	for _, path := range corpus(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			want, err := ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			kids, err := LoadChildren(want, DirFinder(filepath.Dir(path)))
			if err != nil {
				t.Fatal(err)
			}
			res, err := Run(ctxT(t), want, Options{Log: zerolog.Nop(), MaxTurns: corpusMaxTurns[filepath.Base(path)], Children: kids})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Children) != len(kids) {
				t.Fatalf("%d children compared, want %d", len(res.Children), len(kids))
			}
			if !res.Equal() {
				var b bytes.Buffer
				PrintDiff(&b, want, res.Records, res.Diff, 3)
				for _, c := range res.Children {
					fmt.Fprintf(&b, "subagent %s: ", c.Recorded)
					PrintDiff(&b, c.Want, c.Records, c.Diff, 3)
				}
				t.Fatalf("%s does not replay:\n%s", path, b.String())
			}
		})
	}
}

// A deliberately changed engine rule (max turns lowered to 1) makes the
// replay part from the record exactly where the second request of a Task
// would have begun: the max-turns notice is there instead.
func TestChangedEngineRuleFailsAtTheRightRecord(t *testing.T) {
	path := filepath.Join("testdata", "corpus", "tools_retry.jsonl")
	want, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The record of the first Task's second request_begin.
	at, begins := -1, 0
	for i, m := range want {
		if m.Payload.Type == omni.TypeRequestBegin {
			if begins++; begins == 2 {
				at = i
				break
			}
		}
	}
	res, err := Run(ctxT(t), want, Options{Log: zerolog.Nop(), Engine: func(c *engine.Config) { c.DefaultMaxTurns = 1 }, Pace: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	PrintDiff(&b, want, res.Records, res.Diff, 2)
	if res.Equal() || res.Diff != at {
		t.Fatalf("with max turns 1 the replay parts at record %d, want %d (the second request_begin):\n%s", res.Diff+1, at+1, b.String())
	}
	if got := res.Records[at]; got.Payload.Type != omni.TypeText || !strings.Contains(got.Payload.Text, "reached max turns") {
		t.Errorf("replayed record %d = %s, want the max-turns notice", at+1, Normalize(got))
	}
	if !strings.Contains(b.String(), "first difference at record") {
		t.Errorf("PrintDiff = %s", b.String())
	}
}

// corpusMaxTurns are the recorded Sessions' maxTurns (a Trace does not
// hold it).
var corpusMaxTurns = map[string]int{"max_turns.jsonl": 2}

// recordCorpus records the corpus with the scripted models through the
// real engine, toolrunner and tracer.
func recordCorpus(t *testing.T) {
	call := func(id, cmd string) map[string]any {
		return map[string]any{"tool_call": map[string]any{"name": "exec_command", "id": id,
			"arguments": map[string]any{"description": id, "cmd": cmd}, "chunks": 2}}
	}
	text := func(s string) map[string]any { return map[string]any{"text": s, "chunks": 2} }
	sessions := []struct {
		name     string
		mode     string
		maxTurns int
		prompts  []string
		decide   map[string]decision
		script   map[string]any
		// steer is sent during the first Task once it holds 5 records
		// (its first tool call is running).
		steer      string
		compaction omni.CompactionConfig
		// abortOn: the user aborts Task i once a record of the Session
		// satisfies abortOn[i] (and abortDelay has passed).
		abortOn map[int]func(omni.Message) bool
		// hooks is the hooks file ($DIR is where its scripts are
		// written: files), natsHooks answer its NATS hooks.
		hooks     string
		files     map[string]string
		natsHooks map[string]func(name string, in map[string]string) string
		// mcp: the Session's toolrunner has MCP servers: "notes" (a
		// real MCP server over HTTP) and "gone" (a command that does
		// not exist: its connect fails).
		mcp bool
	}{
		{name: "tools_retry", mode: omni.ApproveAllowAll, prompts: []string{"list and count", "again, briefly"}, script: map[string]any{"requests": []any{
			map[string]any{"steps": []any{map[string]any{"thinking": "Two commands, the slow one first."}, text("Running both."),
				call("call_slow", "sleep 0.3; echo slow"), call("call_fast", "echo fast")}, "usage": map[string]any{"total": 300, "output": 20}},
			map[string]any{"expect_tool_outputs": []string{"call_slow", "call_fast"}, "steps": []any{text("half an ans"),
				map[string]any{"error": map[string]any{"status": "timeout", "message": "reset"}}}},
			map[string]any{"steps": []any{text("Both ran: slow, then fast.")}, "usage": map[string]any{"total": 420, "output": 12}},
			map[string]any{"expect_last_user": "again, briefly", "steps": []any{text("Done.")}, "usage": map[string]any{"total": 450, "output": 2}},
		}}},
		{name: "approvals", mode: omni.ApproveAlwaysAsk, prompts: []string{"clean up"}, decide: map[string]decision{"call_ok": {decision: "allow"}, "call_no": {decision: "deny"}},
			script: map[string]any{"requests": []any{
				map[string]any{"steps": []any{call("call_ok", "echo kept"), call("call_no", "echo refused"), call("call_rm", "rm -rf /")}},
				map[string]any{"steps": []any{text("One ran, one was refused, one was forbidden.")}},
			}}},
		{name: "compaction", mode: omni.ApproveAllowAll, prompts: []string{"say hi", "/compact", "and now?"}, script: map[string]any{"requests": []any{
			map[string]any{"steps": []any{text("Hi.")}, "usage": map[string]any{"total": 100, "output": 2}},
			map[string]any{"steps": []any{text("[summary]\nThe user said hi; the agent answered.\n[/summary]")}, "usage": map[string]any{"total": 120, "output": 12}},
			map[string]any{"expect_last_user": "and now?", "steps": []any{call("call_ls", "echo after")}},
			map[string]any{"steps": []any{text("Still here.")}},
		}}},
		{name: "steering", mode: omni.ApproveAllowAll, prompts: []string{"wait, then answer"}, steer: "also say thanks",
			script: map[string]any{"requests": []any{
				map[string]any{"steps": []any{call("call_wait", "sleep 1; echo waited")}},
				map[string]any{"expect_last_user": "[user_steering]\nalso say thanks\n[/user_steering]", "steps": []any{text("Waited. Thanks!")}},
			}}},
		{name: "auto_compaction", mode: omni.ApproveAllowAll, prompts: []string{"first", "second"},
			compaction: omni.CompactionConfig{MaxContextLength: 4000},
			script: map[string]any{"requests": []any{
				map[string]any{"steps": []any{text("One.")}, "usage": map[string]any{"total": 5000, "output": 2}},
				map[string]any{"steps": []any{text("[summary]\nThe user said first; the agent answered One.\n[/summary]")}, "usage": map[string]any{"total": 300, "output": 12}},
				map[string]any{"expect_last_user": "second", "steps": []any{text("Two.")}, "usage": map[string]any{"total": 400, "output": 2}},
			}}},
		{name: "aborts", mode: omni.ApproveAllowAll, prompts: []string{"tell a long story", "run the slow one", "and now?"},
			abortOn: map[int]func(omni.Message) bool{
				0: func(m omni.Message) bool {
					return m.Payload.Type == omni.TypeText && m.Payload.Text == "Once upon a time."
				},
				1: func(m omni.Message) bool { return m.Payload.Type == omni.TypeToolCall },
			},
			script: map[string]any{"requests": []any{
				map[string]any{"steps": []any{text("Once upon a time."), map[string]any{"delay_ms": 60000}, text("never")}},
				map[string]any{"steps": []any{text("Running it."), call("call_slow", "echo started; sleep 30")}},
				map[string]any{"expect_last_user": "and now?", "steps": []any{text("Both were stopped.")}},
			}}},
		{name: "hooks", mode: omni.ApproveAllowAll, prompts: []string{"tidy up", "forget it", "one more"},
			hooks: `{"hooks": {
				"user_prompt": [{"name": "facts", "command": "$DIR/facts.sh"}],
				"pre_tool_use": [{"name": "audit", "command": "$DIR/audit.sh"},
					{"name": "no-rm", "command": "$DIR/no-rm.sh", "match": "exec_command", "required": true},
					{"name": "policy", "nats": true}],
				"stop": [{"name": "ralph", "nats": true}]}}`,
			files: map[string]string{
				"facts.sh": "#!/bin/sh\nin=$(cat)\ncase \"$in\" in *forget*) echo '{\"decision\":\"deny\",\"reason\":\"nothing is forgotten\"}';; *) echo '{\"context\":\"The repo is small.\"}';; esac\n",
				"audit.sh": "#!/bin/sh\ncat >/dev/null\necho '{\"output\":{\"seen\":true,\"n\":1}}'\n",
				"no-rm.sh": "#!/bin/sh\nin=$(cat)\ncase \"$in\" in *'rm '*) echo '{\"decision\":\"deny\",\"reason\":\"no rm here\"}';; esac\n",
			},
			natsHooks: func() map[string]func(string, map[string]string) string {
				stops := 0
				return map[string]func(string, map[string]string) string{
					omni.HookPreToolUse: func(_ string, in map[string]string) string {
						if in["tool_call_id"] == "call_ls" {
							return ""
						}
						return `{"decision":"allow","reason":"looked"}`
					},
					omni.HookStop: func(_ string, in map[string]string) string {
						switch stops++; stops {
						case 1:
							return `{"decision":"continue","input":"check again","reason":"not yet"}`
						case 2:
							return `{"decision":"stop","reason":"done","output":{"rounds":2}}`
						}
						return ""
					},
				}
			}(),
			script: map[string]any{"requests": []any{
				map[string]any{"expect_last_user": "tidy up", "steps": []any{call("call_ls", "echo listed"), call("call_rm", "rm notes.txt")}},
				map[string]any{"steps": []any{text("Listed; the rm was refused.")}},
				map[string]any{"expect_last_user": "check again", "steps": []any{text("Checked again.")}},
				map[string]any{"expect_last_user": "one more", "steps": []any{text("Sure.")}},
			}}},
		// Calls no person decides, in a request that ends at once: the
		// hook's deny and the policy's forbidden are decided right after
		// their calls, before the request's token_usage.
		{name: "denials", mode: omni.ApproveAllowAll, prompts: []string{"tidy up"},
			hooks: `{"hooks": {"pre_tool_use": [{"name": "no-rm", "command": "$DIR/no-rm.sh", "match": "exec_command"}]}}`,
			files: map[string]string{
				"no-rm.sh": "#!/bin/sh\nin=$(cat)\ncase \"$in\" in *'rm notes'*) echo '{\"decision\":\"deny\",\"reason\":\"no rm here\"}';; esac\n",
			},
			script: map[string]any{"requests": []any{
				map[string]any{"steps": []any{call("call_ls", "echo listed"), call("call_rm", "rm notes.txt"), call("call_rf", "rm -rf /")}},
				map[string]any{"expect_tool_outputs": []string{"call_ls", "call_rm", "call_rf"}, "steps": []any{text("Listed; the hook refused one rm, the policy the other.")}},
			}}},
		{name: "mcp", mode: omni.ApproveAllowAll, prompts: []string{"look up a", "and b?"}, mcp: true,
			script: map[string]any{"requests": []any{
				map[string]any{"expect_last_user": "look up a", "steps": []any{map[string]any{"tool_call": map[string]any{
					"name": "mcp__notes__lookup", "id": "call_a", "arguments": map[string]any{"key": "a"}}}}},
				map[string]any{"expect_last_user": "found: a", "steps": []any{text("a is there.")}},
				map[string]any{"expect_last_user": "and b?", "steps": []any{map[string]any{"tool_call": map[string]any{
					"name": "mcp__notes__lookup", "id": "call_b", "arguments": map[string]any{"key": "b"}}}}},
				map[string]any{"steps": []any{text("b too.")}},
			}}},
		// The child inherits the scripted model, which counts requests
		// per Session: it plays the same entries. Its run_subagent call
		// fails (nesting depth), then it runs the command and answers.
		{name: "subagent", mode: omni.ApproveAllowAll, prompts: []string{"count the files with a subagent"},
			script: map[string]any{"requests": []any{
				map[string]any{"steps": []any{map[string]any{"tool_call": map[string]any{"name": "run_subagent", "id": "call_sub",
					"arguments": map[string]any{"description": "count", "prompt": "count the files"}}},
					// The child's failed call's output lands before the
					// stream ends (the engine publishes it beside it).
					map[string]any{"delay_ms": 300}}},
				map[string]any{"steps": []any{call("call_count", "echo 3")}},
				map[string]any{"steps": []any{text("Counted: 3.")}},
			}}},
		{name: "max_turns", mode: omni.ApproveAllowAll, maxTurns: 2, prompts: []string{"loop"}, script: map[string]any{"requests": []any{
			map[string]any{"steps": []any{call("call_1", "echo one")}},
			map[string]any{"steps": []any{call("call_2", "echo two")}},
		}}},
	}
	for _, s := range sessions {
		if *only != "" && s.name != *only {
			continue
		}
		home := t.TempDir()
		ws := filepath.Join(home, "ws")
		os.MkdirAll(ws, 0o755)
		b, _ := json.Marshal(s.script)
		script := filepath.Join(home, "script.json")
		os.WriteFile(script, b, 0o644)
		eng := engine.Config{Home: home, RetryBase: 10 * time.Millisecond, RetryCap: 10 * time.Millisecond, RetryMax: 5, DefaultMaxTurns: s.maxTurns}
		if s.hooks != "" {
			for name, body := range s.files {
				os.WriteFile(filepath.Join(home, name), []byte(body), 0o755)
			}
			eng.Hooks.File = filepath.Join(home, "hooks.json")
			os.WriteFile(eng.Hooks.File, []byte(strings.ReplaceAll(s.hooks, "$DIR", home)), 0o644)
			eng.Hooks.Sandbox = sandbox.Config{Backend: sandbox.Off}
		}
		tr := tracer.DefaultConfig()
		tr.Home = home
		trc := toolrunner.Config{RunnerID: "corpus"}
		if s.mcp {
			trc.MCPConfig = mcpNotes(t, home)
		}
		st, err := stack.Start(ctxT(t), stack.Options{Home: home, Listen: "off", Engine: &eng, Tracer: &tr, Toolrunner: &trc}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		for point, answer := range s.natsHooks {
			sub, err := st.Conn.Subscribe(omni.HookSubject(point), func(m *nats.Msg) {
				var in map[string]string
				json.Unmarshal(m.Data, &in)
				m.Respond([]byte(answer(m.Header.Get(hookHeader), in)))
			})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Unsubscribe()
		}
		now := time.Now()
		sid := omni.NewSessionID(now, "c0000001")
		if err := st.Sessions.Create(ctxT(t), &omni.SessionRecord{ID: sid, Model: "scripted:" + script, Workspace: ws,
			ApprovalMode: s.mode, SystemPrompt: "You are the corpus agent.", State: omni.StateIdle, CreatedUnixMs: now.UnixMilli(),
			Compaction: s.compaction}); err != nil {
			t.Fatal(err)
		}
		var pc *pacer
		if s.steer != "" {
			pc = newPacer(30 * time.Second)
			fctx, stop := context.WithCancel(ctxT(t))
			defer stop()
			pc.start(fctx, st, sid)
		}
		for i, p := range s.prompts {
			tk := task{kind: omni.TaskRun, input: []omni.InputPart{{Type: "text", Text: p}}}
			if p == "/compact" {
				tk = task{kind: omni.TaskCompact}
			}
			if i == 0 && s.steer != "" {
				tk.steers = []steer{{text: s.steer, at: 5}}
			}
			if on := s.abortOn[i]; on != nil {
				abortWhen(t, st, sid, on)
			}
			if err := runTask(ctxT(t), st, sid, fmt.Sprintf("corpus-%d", i), i, tk, decided(s.decide), pc, nil); err != nil {
				t.Fatal(err)
			}
		}
		recs, err := newTrace(ctxT(t), st, home, sid)
		if err != nil {
			t.Fatal(err)
		}
		st.Stop()
		// The Trace files of the Session, one after the other.
		files, _ := trace.Files(home, sid)
		var data []byte
		for _, f := range files {
			b, _ := os.ReadFile(f)
			data = append(data, b...)
		}
		os.MkdirAll(filepath.Join("testdata", "corpus"), 0o755)
		if err := os.WriteFile(filepath.Join("testdata", "corpus", s.name+".jsonl"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		// A subagent child's Trace files go beside it, by their names.
		kids, err := LoadChildren(recs, HomeFinder(home))
		if err != nil {
			t.Fatal(err)
		}
		for kid := range kids {
			files, _ := trace.Files(home, kid)
			for _, f := range files {
				b, _ := os.ReadFile(f)
				os.WriteFile(filepath.Join("testdata", "corpus", filepath.Base(f)), b, 0o644)
			}
		}
		t.Logf("recorded %s: %d records", s.name, len(recs))
	}
	_ = bus.ErrStop
}

// decided answers each call id's approval with its decision in m
// (allow when it has none), as runTask answers a replay's.
func decided(m map[string]decision) *asks {
	a := &asks{byID: map[string][]decision{}}
	for id, d := range m {
		d.task = -1
		a.byID[id] = []decision{d}
	}
	return a
}

// A request about a call id in a Task is answered by that Task's
// recorded decision for the id: an id recurs (a scripted model's ids, a
// fork continuing past a call it carries cut without a decision), and
// calls decided without asking (the policy, a hook) take no answer.
func TestApprovalsAreMatchedPerTaskAndCall(t *testing.T) {
	call := func(id string) omni.Message { return omni.ToolCall("exec_command", `{}`, id) }
	dec := func(d, id string) omni.Message { return omni.ApprovalDecision(d, id) }
	out := func(id, text string) omni.Message { return omni.ToolCallOutput(id, text, omni.StatusAborted) }
	end := func(status string) omni.Message { return omni.RequestEnd(status, "", 0, 0) }
	deny := omni.HookEvent(omni.HookRecord{Point: omni.HookPreToolUse, Name: "no-rm", Decision: omni.DecisionDeny, ToolCallID: "call_rm"})
	recs := []omni.Message{
		omni.SessionMeta(omni.Meta{SessionID: "s"}),
		omni.UserText("a"), omni.RequestBegin(), call("call_1"), end(omni.StatusAborted), omni.Abort(omni.AbortedByUser), // 1-5
		omni.UserText("b"), omni.RequestBegin(), call("call_1"), dec(omni.DecisionDeny, "call_1"), // 6-9
		call("call_rm"), dec(omni.DecisionForbidden, "call_rm"), // 10-11
		call("call_rm"), deny, dec(omni.DecisionDeny, "call_rm"), // 12-14
		call("call_rm"), dec(omni.DecisionAllow, "call_rm"), end(omni.StatusCompleted), // 15-17
		out("call_1", omni.DeniedByUser), out("call_rm", omni.DeniedByPolicy), // 18-19
		omni.UserText("c"), omni.RequestBegin(), call("call_1"), dec(omni.DecisionAllow, "call_1"), end(omni.StatusCompleted), // 20-24
	}
	tasks := plan(recs)
	if len(tasks) != 3 {
		t.Fatalf("plan found %d Tasks, want 3", len(tasks))
	}
	a := approvals(recs, tasks)
	for _, want := range []struct {
		task     int
		id       string
		decision string
		index    int
		ok       bool
	}{
		{0, "call_1", "", 0, false},
		{1, "call_rm", omni.DecisionAllow, 16, true},
		{1, "call_1", omni.DecisionDeny, 9, true},
		{1, "call_1", "", 0, false},
		{1, "call_rm", "", 0, false},
		{2, "call_1", omni.DecisionAllow, 23, true},
	} {
		d, ok := a.next(want.task, want.id)
		if d.decision != want.decision || d.index != want.index || ok != want.ok {
			t.Errorf("next(%d, %s) = %q@%d, %v; want %q@%d, %v", want.task, want.id, d.decision, d.index, ok, want.decision, want.index, want.ok)
		}
	}
}

// mcpNotes starts the "notes" MCP server (its lookup tool answers
// "found: <key>") and writes an MCP config naming it and a server whose
// command does not exist.
func mcpNotes(t *testing.T, dir string) string {
	srv := sdk.NewServer(&sdk.Implementation{Name: "notes", Version: "1"}, nil)
	srv.AddTool(&sdk.Tool{Name: "lookup", Description: "Looks a key up in the notes.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"key":{"type":"string"}},"required":["key"]}`)},
		func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			var a struct{ Key string }
			_ = json.Unmarshal(req.Params.Arguments, &a)
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "found: " + a.Key}}}, nil
		})
	hs := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	b, _ := json.Marshal(map[string]any{"servers": map[string]any{
		"notes": map[string]any{"url": hs.URL + "/mcp"},
		"gone":  map[string]any{"command": "/nonexistent/floe-mcp-server"},
	}})
	p := filepath.Join(dir, "mcp.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// abortWhen aborts the Session's running Task half a second after a
// record satisfying on reaches the stream (a tool it started has
// produced its first output by then).
func abortWhen(t *testing.T, st *stack.Stack, sid string, on func(omni.Message) bool) {
	last, err := bus.LastSeq(ctxT(t), st.JS)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = bus.FollowUntil(ctxT(t), st.JS, sid, omni.TraceClasses, last+1, false, func(sm bus.StreamMsg) error {
			if m, err := omni.Decode(sm.Data); err == nil && on(m) {
				time.Sleep(500 * time.Millisecond)
				_, _ = st.Conn.Request(omni.ControlSubject(sid, omni.CtlAbort), nil, 5*time.Second)
				return bus.ErrStop
			}
			return nil
		})
	}()
}

// A record without its Session's settings (a --trace file) replays its
// automatic compaction with settings inferred from it; with settings under
// which the engine would not compact, the replay parts exactly at the
// compaction_begin.
func TestAutomaticCompactionReplaysFromTheTraceAlone(t *testing.T) {
	path := filepath.Join("testdata", "corpus", "auto_compaction.jsonl")
	want, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := InferCompaction(want); got != (omni.CompactionConfig{MaxContextLength: 5000}) {
		t.Fatalf("InferCompaction = %+v, want a context threshold of 5000", got)
	}
	res, err := Run(ctxT(t), want, Options{Log: zerolog.Nop(), Compaction: omni.CompactionConfig{MaxSessionTurns: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	at := slices.IndexFunc(want, func(m omni.Message) bool { return m.Payload.Type == omni.TypeCompactionBegin })
	if res.Diff != at {
		var b bytes.Buffer
		PrintDiff(&b, want, res.Records, res.Diff, 3)
		t.Fatalf("without the threshold the replay parts at record %d, want %d (the compaction_begin):\n%s", res.Diff, at, b.String())
	}
}

// A subagent's child replays from its own record and is compared record
// for record: a child record the engine would write differently (the
// failed nested call's output) parts there, in the child's comparison,
// while the parent stays equal.
func TestSubagentChildIsComparedRecordForRecord(t *testing.T) {
	path := filepath.Join("testdata", "corpus", "subagent.jsonl")
	want, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	kids, err := LoadChildren(want, DirFinder(filepath.Dir(path)))
	if err != nil || len(kids) != 1 {
		t.Fatalf("LoadChildren = %d children, %v; want 1", len(kids), err)
	}
	var child string
	for id := range kids {
		child = id
	}
	recs := slices.Clone(kids[child])
	at := slices.IndexFunc(recs, func(m omni.Message) bool {
		return m.Payload.Type == omni.TypeToolCallOutput && strings.Contains(m.Payload.Output, "nesting depth")
	})
	if at < 0 {
		t.Fatal("the child's record has no failed nested call")
	}
	recs[at].Payload.Output = "a changed engine rule"
	kids[child] = recs
	res, err := Run(ctxT(t), want, Options{Log: zerolog.Nop(), Children: kids, Pace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Diff >= 0 || len(res.Children) != 1 || res.Children[0].Diff != at || res.Equal() {
		var b bytes.Buffer
		PrintDiff(&b, want, res.Records, res.Diff, 2)
		t.Fatalf("parent diff %d (want -1), children %d, child diff at %d (want %d):\n%s", res.Diff, len(res.Children),
			func() int {
				if len(res.Children) == 0 {
					return -2
				}
				return res.Children[0].Diff
			}(), at, b.String())
	}
}

// A fork's Trace (protocol.md §3: session_meta carries forked_from) replays
// equal: forked_from points at the parent, an id the replay's Session
// cannot have. Before, every fork parted at record 1.
func TestForkedTraceReplaysExactly(t *testing.T) {
	want, err := ReadFile(filepath.Join("testdata", "corpus", "tools_retry.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	want[0] = omni.ForkMeta(&want[0], want[0].Payload.SessionID, omni.ForkedFrom{SessionID: "session-2026-01-01-00-00-00-0000abcd", Seq: 42})
	if _, ok := want[0].Payload.ForkedFrom(); !ok {
		t.Fatal("the head carries no forked_from")
	}
	res, err := Run(ctxT(t), want, Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Equal() {
		var b bytes.Buffer
		PrintDiff(&b, want, res.Records, res.Diff, 3)
		t.Fatalf("a fork's Trace does not replay exactly:\n%s", b.String())
	}
	// Only forked_from is set aside: another model still parts at record 1.
	other := want[0]
	other.Payload.ModelID = "another-model"
	if Normalize(other) == Normalize(want[0]) {
		t.Fatal("a session_meta with another model normalizes equal")
	}
}

// A fork cut inside a model request (protocol.md §3) closes the open
// request as the engine closes one a user aborts (token_usage, then
// request_end{aborted, attempt}, then abort), so its Trace replays
// exactly. Before, the fork's bare request_end{aborted} parted from the
// engine's token_usage there.
func TestForkCutInsideARequestReplaysExactly(t *testing.T) {
	recs, err := ReadFile(filepath.Join("testdata", "corpus", "tools_retry.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	at := slices.IndexFunc(recs, func(m omni.Message) bool { return m.Payload.Type == omni.TypeToolCall })
	var carried []trace.Record
	for i := range recs[:at+1] {
		carried = append(carried, trace.Record{Data: omni.MustMarshal(&recs[i])})
	}
	cut, err := trace.Close(carried, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []omni.Message{omni.ForkMeta(&cut.Head, cut.Head.Payload.SessionID, omni.ForkedFrom{SessionID: "session-2026-01-01-00-00-00-0000abcd", Seq: 9})}
	want = append(append(want, recs[1:at+1]...), cut.Close...)
	if n := len(cut.Close); n != 3 || cut.Close[0].Payload.Type != omni.TypeTokenUsage {
		t.Fatalf("the cut closes with %d records (%v), want token_usage, request_end, abort", n, cut.Close)
	}
	res, err := Run(ctxT(t), want, Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Equal() {
		var b bytes.Buffer
		PrintDiff(&b, want, res.Records, res.Diff, 3)
		t.Fatalf("a fork cut inside a request does not replay exactly:\n%s", b.String())
	}
}

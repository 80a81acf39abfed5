package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"floe.dev/cmd/floe/internal/render"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/sandbox"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway/client"
)

// Two prompts in a row go to one Session: the second model request
// carries the first exchange. Ctrl-D at the empty prompt leaves with
// status 0 and prints the resume command.
func TestChatTwoPromptsOneSession(t *testing.T) {
	fake := newFakeOpenAI(t)
	_, ws, env := chatEnv(t)
	p := startPTY(t, ws, append(env, fake.env()...), "chat")
	p.expect("floe chat — session ")
	p.expect("> ")
	p.send("first question\r")
	p.expect("answer 1")
	p.expect("> ")
	// The first Task done, the engine asks the model for a title.
	fake.waitTitles(t, 1)
	p.send("second question\r")
	p.expect("answer 2")
	p.expect("> ")
	p.send("\x04") // Ctrl-D
	p.expect("resume with: floe chat --resume session-")
	if code := p.wait(); code != 0 {
		t.Fatalf("exit status %d, want 0", code)
	}
	got := strings.Join(fake.request(t, 1).texts(), "\n")
	for _, want := range []string{"user: first question", "assistant: answer 1", "user: second question"} {
		if !strings.Contains(got, want) {
			t.Errorf("second request lacks %q:\n%s", want, got)
		}
	}
	if n := strings.Count(p.screen(), "floe chat — session "); n != 1 {
		t.Errorf("%d banners, want one Session", n)
	}
	// The model's title is the Session's: in floe sessions and on resume.
	if t2 := strings.Join(fake.titleRequest(t, 0).texts(), "\n"); !strings.Contains(t2, "[User]\nfirst question") || !strings.Contains(t2, "[Assistant]\nanswer 1") {
		t.Errorf("the title request reads\n%s", t2)
	}
	if out, errOut, code := runPiped(t, ws, append(env, fake.env()...), "", "sessions"); code != 0 || !strings.Contains(out, "Fake title 1") {
		t.Errorf("floe sessions: %d\n%s\n%s", code, out, errOut)
	}
	if out, errOut, code := runPiped(t, ws, append(env, fake.env()...), "", "chat", "--resume"); code != 0 || !strings.Contains(out, "title Fake title 1") {
		t.Errorf("floe chat --resume: %d\n%s\n%s", code, out, errOut)
	}
	// What the user saw: the prompts with what was typed, the answers on
	// their own lines, nothing written over the input.
	// Each Task ends with its line: how it ended, its time and tokens.
	var seen []string
	ends := 0
	for _, l := range terminalScreen(p.rawOutput(), 250) {
		if taskLineRe.MatchString(l) {
			ends++
			l = "──"
		}
		if l != "" && !strings.HasPrefix(l, "floe chat — ") && !strings.HasPrefix(l, "workspace ") && !strings.HasPrefix(l, "Type a message") {
			seen = append(seen, l)
		}
	}
	want := []string{"> first question", "answer 1", "──", "> second question", "answer 2", "──", ">"}
	if len(seen) < len(want) || strings.Join(seen[:len(want)], "\n") != strings.Join(want, "\n") || !strings.HasPrefix(seen[len(seen)-1], "resume with: ") {
		t.Errorf("the screen reads\n%s\nwant\n%s\nthen the resume line", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
}

// taskLineRe matches the line that ends a Task.
var taskLineRe = regexp.MustCompile(`^── (completed|failed|aborted) · ([0-9.]+ s|\d+m \d\ds)( · \d+ requests?)?( · [0-9,]+ tokens \([0-9,]+ out\))?$`)

// gatedCmd is a slow command that runs until the test creates the file
// "proceed" in its Workspace (openGate), bounded at a minute: the steering
// is queued while it runs, however loaded the machine.
const gatedCmd = "echo started; i=0; while [ ! -e proceed ]; do i=$((i+1)); if [ $i -gt 600 ]; then break; fi; sleep 0.1; done; echo finished"

func openGate(t *testing.T, ws string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(ws, "proceed"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Typing while a slow tool runs steers the Task: the line shows as
// queued, and the next model request gets it as [user_steering].
func TestChatSteeringDuringSlowTool(t *testing.T) {
	_, ws, env := chatEnv(t)
	model := writeScript(t, ws, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "arguments": {"description": "slow", "cmd": "`+gatedCmd+`"}}}]},
	  {"expect_last_user": "[user_steering]\nuse the blue one\n[/user_steering]", "steps": [{"text": "steered fine"}]}
	]}`)
	p := startPTY(t, ws, env, "chat", "--model", model)
	p.expect("> ")
	p.send("do the slow thing\r")
	p.expect("started")
	p.send("use the blue one\r")
	p.expect("queued: use the blue one")
	openGate(t, ws)
	p.expect("> use the blue one  (steering)")
	p.expect("steered fine")
	p.expect("> ")
	p.send("/exit\r")
	if code := p.wait(); code != 0 {
		t.Fatalf("exit status %d, want 0", code)
	}
	if s := p.screen(); strings.Contains(s, "expect_last_user") || strings.Contains(s, "task failed") {
		t.Errorf("the steering did not reach the model as [user_steering]:\n%s", s)
	}
}

// always-ask: y allows, a bare Enter allows, n denies, Ctrl-C denies.
func TestChatApprovalsInline(t *testing.T) {
	_, ws, env := chatEnv(t)
	call := func(word string) string {
		return `{"steps": [{"tool_call": {"name": "exec_command", "arguments": {"description": "say", "cmd": "echo said-` + word + `"}}}]}`
	}
	model := writeScript(t, ws, `{"requests": [`+call("one")+`,`+call("two")+`,`+call("three")+`,`+call("four")+`,
	  {"steps": [{"text": "all asked"}]}]}`)
	p := startPTY(t, ws, env, "chat", "--model", model, "--approve", "always-ask")
	p.expect("approvals always-ask")
	p.expect("> ")
	p.send("run three commands\r")
	p.expect("allow exec_command? [Y/n/a] ")
	p.send("y\r")
	p.expect("✓ allowed")
	p.expect("said-one")
	p.expect("allow exec_command? [Y/n/a] ")
	p.send("\r")
	p.expect("✓ allowed")
	p.expect("said-two")
	p.expect("allow exec_command? [Y/n/a] ")
	p.send("n\r")
	p.expect("✗ deny")
	p.expect("allow exec_command? [Y/n/a] ")
	p.send("\x03") // Ctrl-C at the question denies
	p.expect("✗ deny")
	p.expect("all asked")
	for _, word := range []string{"three", "four"} {
		if strings.Contains(p.screen(), "said-"+word+"\n") {
			t.Errorf("the denied command %s ran", word)
		}
	}
	p.send("\x04")
	if code := p.wait(); code != 0 {
		t.Fatalf("exit status %d, want 0", code)
	}
}

// Ctrl-C during a tool aborts the Task and the prompt comes back; Ctrl-C
// at the empty prompt then leaves with status 0.
func TestChatCtrlC(t *testing.T) {
	p, model := chatInLongTool(t, "after the abort")
	start := time.Now()
	p.send("\x03")
	p.expect("interrupting")
	p.expect("task aborted")
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the abort took %v", d)
	}
	p.expect("> ")
	p.send("/model\r")
	p.expect("model " + model)
	p.send("typed but not sent")
	time.Sleep(2100 * time.Millisecond) // past the double Ctrl-C window
	p.send("\x03")                      // clears the line
	p.expect("^C")
	p.send("next one\r")
	p.expect("after the abort")
	p.expect("> ")
	time.Sleep(2100 * time.Millisecond)
	p.send("\x03")
	if code := p.wait(); code != 0 {
		t.Fatalf("exit status %d after Ctrl-C at the empty prompt, want 0", code)
	}
	if strings.Contains(p.screen(), "> typed but not sent\n") && strings.Contains(p.screen(), "> typed but not sentnext one") {
		t.Errorf("Ctrl-C did not clear the line")
	}
}

// --resume without an id continues the most recent Session: its last
// turns are shown, and the next request carries the history.
func TestChatResume(t *testing.T) {
	fake := newFakeOpenAI(t)
	_, ws, env := chatEnv(t)
	env = append(env, fake.env()...)
	out, errOut, code := runPiped(t, ws, env, "remember the number 42\n", "chat")
	if code != 0 || !strings.Contains(out, "answer 1") {
		t.Fatalf("first chat: status %d\n%s\n%s", code, out, errOut)
	}
	m := sessionRe.FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "resume with: floe chat --resume "+m[1]) {
		t.Fatalf("no resume command:\n%s", out)
	}
	p := startPTY(t, ws, env, "chat", "--resume")
	p.expect("resumed session " + m[1])
	p.expect("> remember the number 42")
	p.expect("answer 1")
	p.expect("> ")
	p.send("what was the number?\r")
	p.expect("answer 2")
	p.send("\x04")
	if code := p.wait(); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	got := strings.Join(fake.request(t, 1).texts(), "\n")
	if !strings.Contains(got, "user: remember the number 42") || !strings.Contains(got, "assistant: answer 1") {
		t.Errorf("the resumed request lacks the history:\n%s", got)
	}
}

// Piped stdin: one prompt per line, each after the Task before it, and
// the chat ends at EOF. An approval has no terminal to ask: it is denied
// and says so.
func TestChatPipedStdin(t *testing.T) {
	_, ws, env := chatEnv(t)
	model := writeScript(t, ws, `{"requests": [
	  {"expect_last_user": "line one", "steps": [{"text": "reply one", "delay_ms": 200}]},
	  {"expect_last_user": "line two", "steps": [{"tool_call": {"name": "exec_command", "arguments": {"description": "x", "cmd": "echo never"}}}]},
	  {"steps": [{"text": "reply two"}]}
	]}`)
	out, errOut, code := runPiped(t, ws, env, "line one\n/model\nline two\n", "chat", "--model", model, "--approve", "always-ask")
	if code != 0 {
		t.Fatalf("status %d\n%s\n%s", code, out, errOut)
	}
	order := []string{"> line one", "reply one", "model " + model, "> line two", "allow exec_command? [Y/n/a] no terminal to ask: denied", "reply two", "resume with:"}
	at := 0
	for _, w := range order {
		i := strings.Index(out[at:], w)
		if i < 0 {
			t.Fatalf("output lacks %q after offset %d:\n%s", w, at, out)
		}
		at += i + len(w)
	}
	if strings.Contains(out, "\x1b[") {
		t.Errorf("escape sequences in piped output:\n%q", out)
	}
}

// floe chat --server talks to a separate floe serve with its token; the
// Session is created over HTTP, and its system prompt carries the
// Workspace's AGENTS.md. A wrong token and an unreachable server are one
// line and status 1.
func TestChatServer(t *testing.T) {
	home, ws, env := chatEnv(t)
	if err := os.WriteFile(filepath.Join(ws, "AGENTS.md"), []byte("Use tabs, never spaces.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	model := writeScript(t, ws, `{"requests": [{"steps": [{"text": "served answer"}]}]}`)
	addr := freeAddr(t)
	serveEnv := append(append([]string{}, env...), "FLOE_HTTP_ADDR="+addr, "FLOE_NATS_LISTEN=off", "FLOE_API_TOKEN=alice:tok-1,bob:tok-2", "FLOE_HOME="+filepath.Join(home, "server"), "FLOE_SCRIPTS_DIR="+ws)
	serve := startPTY(t, ws, serveEnv, "serve")
	serve.expect("floe serve: http://" + addr)
	url := "http://" + addr

	clientEnv := append(append([]string{}, env...), "FLOE_API_TOKEN=alice:tok-1")
	p := startPTY(t, ws, clientEnv, "chat", "--server", url, "--model", model)
	p.expect("floe chat — session ")
	p.expect("> ")
	p.send("hello server\r")
	p.expect("served answer")
	p.expect("> ")
	p.send("\x04")
	p.expect("resume with: floe chat --resume session-")
	p.expect("--server " + url)
	if code := p.wait(); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	sid := sessionRe.FindStringSubmatch(p.screen())[1]
	meta := firstTraceRecord(t, filepath.Join(home, "server"), sid)
	if !strings.Contains(meta.Payload.SystemPrompt, "Use tabs, never spaces.") || !strings.Contains(meta.Payload.SystemPrompt, "AGENTS.md") {
		t.Errorf("session_meta.system_prompt lacks AGENTS.md:\n%s", meta.Payload.SystemPrompt)
	}

	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{append(append([]string{}, env...), "FLOE_API_TOKEN=wrong"), []string{"chat", "--server", url}, "refused the token"},
		{env, []string{"chat", "--server", url}, "refused the token"},
		{clientEnv, []string{"chat", "--server", "http://" + freeAddr(t)}, "cannot reach the server at"},
		{clientEnv, []string{"chat", "--server", url, "--resume", "session-nope"}, "no session session-nope"},
	} {
		out, errOut, code := runPiped(t, ws, tc.env, "", tc.args...)
		if code != 1 || !strings.Contains(errOut, tc.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || out != "" {
			t.Errorf("floe %v: status %d, want 1 and one line with %q\nstdout: %s\nstderr: %s", tc.args, code, tc.want, out, errOut)
		}
	}
	serve.cmd.Process.Signal(os.Interrupt)
	serve.wait()
}

// firstTraceRecord reads the session_meta heading a Session's Trace.
func firstTraceRecord(t *testing.T, home, sid string) omni.Message {
	t.Helper()
	var files []string
	deadline := time.Now().Add(bound)
	for len(files) == 0 && time.Now().Before(deadline) {
		files, _ = filepath.Glob(filepath.Join(home, "traces", "*", sid+"_*.jsonl"))
		time.Sleep(20 * time.Millisecond)
	}
	if len(files) == 0 {
		t.Fatalf("no Trace for %s under %s", sid, home)
	}
	f, err := os.Open(files[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	msgs, _, err := trace.Read(f)
	if err != nil || len(msgs) == 0 || msgs[0].Type != omni.KindSessionMeta {
		t.Fatalf("trace %s: %d records, %v", files[0], len(msgs), err)
	}
	return msgs[0]
}

// Bad input is one line and a non-zero status, and nothing starts: no
// Session, no Trace, no store.
func TestChatBadInput(t *testing.T) {
	home, ws, env := chatEnv(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"chat", "--model", "bogus:x"}, 2, `unknown provider "bogus"`},
		{[]string{"chat", "--model", "gpt-4o"}, 2, "is not provider:model_id"},
		{[]string{"chat", "--model", "openai:gpt-4o-mini"}, 2, "needs OPENAI_API_KEY"},
		{[]string{"chat", "--model", "anthropic:claude-sonnet-4-5"}, 2, "needs ANTHROPIC_API_KEY"},
		{[]string{"run", "--model", "bogus:x", "hi"}, 2, `unknown provider "bogus"`},
		{[]string{"run", "--model", "openai:gpt-4o-mini", "hi"}, 2, "needs OPENAI_API_KEY"},
		{[]string{"chat", "--approve", "sometimes"}, 2, "--approve"},
		{[]string{"chat", "extra"}, 2, "unexpected argument"},
		{[]string{"chat", "--workspace", "/nonexistent/dir"}, 2, "is not a directory"},
		// last: these start the services
		{[]string{"chat", "--resume"}, 1, "no session to resume"},
		{[]string{"chat", "--resume", "session-nope"}, 1, "no session session-nope"},
	} {
		out, errOut, code := runPiped(t, ws, env, "", tc.args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != tc.code || !strings.Contains(errOut, tc.want) || len(lines) != 1 || strings.Contains(errOut, "goroutine") {
			t.Errorf("floe %v: status %d (want %d), stderr %q (want one line with %q), stdout %q", tc.args, code, tc.code, errOut, tc.want, out)
		}
		if tc.code == 2 {
			for _, d := range []string{"traces", "jetstream"} {
				if _, err := os.Stat(filepath.Join(home, "floe", d)); err == nil {
					t.Errorf("floe %v created %s", tc.args, d)
				}
			}
		}
	}
}

// The slash commands: /help, /model, /session, /approve, /compact,
// /abort when idle, an unknown one, /exit.
func TestChatSlashCommands(t *testing.T) {
	_, ws, env := chatEnv(t)
	model := writeScript(t, ws, `{"requests": [
	  {"steps": [{"text": "first answer"}]},
	  {"steps": [{"text": "the summary of it all"}]}
	], "after_last": "final_text", "final_text": "after compaction"}`)
	p := startPTY(t, ws, env, "chat", "--model", model)
	p.expect("> ")
	p.send("/help\r")
	p.expect("/approve [MODE]")
	p.send("/bogus\r")
	p.expect("unknown command /bogus: /help lists the commands")
	p.send("/abort\r")
	p.expect("nothing is running")
	p.send("/approve sometimes\r")
	p.expect(`unknown approval mode "sometimes"`)
	p.send("/approve read-only\r")
	p.expect("approval mode read-only")
	p.send("/approve\r")
	p.expect("approval mode read-only (set with")
	p.send("hello\r")
	p.expect("first answer")
	p.expect("> ")
	p.send("/session\r")
	// The backend the toolrunner's auto takes on this host, never off
	// (protocol.md §7: the Session shows it).
	p.expect(fmt.Sprintf("sandbox %s, network on", autoBackend(t)))
	p.expect("trace " + filepath.Join(filepath.Dir(ws), "floe", "traces"))
	p.expect("resume: floe chat --resume session-")
	p.send("/compact\r")
	p.expect("… compacting (")
	p.expect("… compaction completed")
	p.expect("> ")
	p.send("/model\r")
	p.expect("model " + model)
	p.send("\x1b[A\r") // up: the last line again
	p.expect("model " + model)
	p.send("/exit\r")
	if code := p.wait(); code != 0 {
		t.Fatalf("exit status %d", code)
	}
}

// A second Ctrl-C within 2 s leaves, whatever the first one did.
// autoBackend is the sandbox backend auto takes on this host; the test
// fails when it is none (CI runs the tools confined).
func autoBackend(t *testing.T) sandbox.Backend {
	t.Helper()
	sb, err := sandbox.New(sandbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if sb.Backend() == sandbox.Off {
		t.Fatalf("no sandbox backend on this host: %s", sb.Warning())
	}
	return sb.Backend()
}

func TestChatDoubleCtrlCLeaves(t *testing.T) {
	p, _ := chatInLongTool(t, "Done.")
	p.send("\x03")
	p.expect("interrupting")
	p.send("\x03")
	if code := p.wait(); code != 0 {
		t.Fatalf("exit status %d, want 0", code)
	}
	p.expect("resume with: floe chat --resume ")
}

// A model that cannot be reached: each failed attempt is one line, the
// wait before the retry counts down, the final failure repeats the
// cause, and the prompt comes back.
func TestChatRetryCountdown(t *testing.T) {
	_, ws, env := chatEnv(t)
	dead := freeAddr(t)
	env = append(env, "OPENAI_BASE_URL=http://"+dead+"/v1", "OPENAI_API_KEY=sk-x",
		"FLOE_RETRY_BASE_MS=2000", "FLOE_RETRY_CAP_MS=2000", "FLOE_RETRY_MAX=1")
	p := startPTY(t, ws, env, "chat", "--model", "openai:gpt-4o-mini")
	p.expect("> ")
	p.send("hello?\r")
	refused := "connection refused by the model server at http://" + dead + "/v1/chat/completions (is it running?)"
	p.expect("model request failed: " + refused + "; retrying in 2 s (attempt 2 of 2)")
	p.expect("retrying in 2 s… ")
	p.expect("retrying in 1 s… ")
	p.expect("task failed: model request failed: " + refused)
	p.expect("> ")
	p.send("\x04")
	if code := p.wait(); code != 0 {
		t.Fatalf("exit status %d", code)
	}
}

// floe run asks as floe chat does: Enter allows, and Ctrl-C at the
// question denies (the Task goes on without the call).
func TestRunApprovalsOnTerminal(t *testing.T) {
	_, ws, env := chatEnv(t)
	call := func(word string) string {
		return `{"steps": [{"tool_call": {"name": "exec_command", "arguments": {"description": "say", "cmd": "echo said-` + word + `"}}}]}`
	}
	model := writeScript(t, ws, `{"requests": [`+call("one")+`,`+call("two")+`, {"steps": [{"text": "run is done"}]}]}`)
	p := startPTY(t, ws, env, "run", "--model", model, "--approve", "always-ask", "two commands")
	p.expect("allow exec_command? [Y/n/a] ")
	p.send("\r")
	p.expect("said-one")
	p.expect("allow exec_command? [Y/n/a] ")
	p.send("\x03")
	p.expect("^C denied")
	p.expect("✗ deny")
	p.expect("run is done")
	if code := p.wait(); code != 0 {
		t.Fatalf("exit status %d, want 0", code)
	}
	if strings.Contains(p.screen(), "said-two\n") {
		t.Errorf("the denied command ran")
	}
}

// Ctrl-C during floe run's tool interrupts the Task: status 130.
func TestRunCtrlCAborts(t *testing.T) {
	_, ws, env := chatEnv(t)
	p := startPTY(t, ws, env, "run", "--model", longToolScript(t, ws, "Done."), "wait")
	p.expect("long-start")
	p.send("\x03")
	p.expect("floe: interrupting")
	p.expect("aborted")
	if code := p.wait(); code != 130 {
		t.Fatalf("exit status %d, want 130", code)
	}
}

// longToolScript is a scripted model whose first request runs a minute
// long command (printing long-start first), then answers final.
func longToolScript(t *testing.T, dir, final string) string {
	return writeScript(t, dir, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "arguments": {"description": "long", "cmd": "echo long-start; sleep 60"}}}]}
	], "after_last": "final_text", "final_text": "`+final+`"}`)
}

// chatInLongTool starts a chat whose first Task is in the long command.
func chatInLongTool(t *testing.T, final string) (*ptyProc, string) {
	_, ws, env := chatEnv(t)
	model := longToolScript(t, ws, final)
	p := startPTY(t, ws, env, "chat", "--model", model)
	p.expect("> ")
	p.send("wait a minute\r")
	p.expect("long-start")
	return p, model
}

// The screen a user sees while steering, approving and editing: the
// typed steering line, its queued note, its delivery, a short diff and
// the approval answered under it, in that order and never overwritten.
func TestChatScreen(t *testing.T) {
	_, ws, env := chatEnv(t)
	model := writeScript(t, ws, `{"requests": [
	  {"steps": [{"text": "Let me run it, streaming slowly", "chunks": 8, "delay_ms": 60}, {"tool_call": {"name": "exec_command", "arguments": {"description": "slow", "cmd": "`+gatedCmd+`"}}}]},
	  {"steps": [{"text": "steered fine"}, {"tool_call": {"name": "edit_file", "arguments": {"file_path": "a.txt", "old_string": "x\ny\n", "new_string": "x\nz\n"}}}]},
	  {"steps": [{"text": "all done"}]}
	]}`)
	p := startPTY(t, ws, env, "chat", "--model", model, "--approve", "always-ask")
	p.expect("> ")
	p.send("do the slow thing\r")
	p.expect("allow exec_command? [Y/n/a] ")
	p.send("\r")
	p.expect("started")
	p.send("use the blue one\r")
	p.expect("queued: use the blue one")
	openGate(t, ws)
	p.expect("(steering)")
	p.expect("allow edit_file? [Y/n/a] ")
	p.send("n\r")
	p.expect("all done")
	p.expect("> ")
	p.send("\x04")
	p.wait()
	screen := terminalScreen(p.rawOutput(), 250)
	at := 0
	for _, want := range []string{
		"> do the slow thing",
		"Let me run it, streaming slowly",
		`→ exec_command {"description":"slow","cmd":"` + gatedCmd + `"}`,
		"allow exec_command? [Y/n/a]",
		"  ✓ allowed call_1",
		"  │ started",
		"steer> use the blue one",
		"queued: use the blue one (delivered after the current step)",
		"  │ finished",
		"> use the blue one  (steering)",
		"steered fine",
		"→ edit_file a.txt",
		"  - y",
		"  + z",
		"? approve edit_file a.txt (call_2)",
		"allow edit_file? [Y/n/a] n",
		"  ✗ deny call_2",
		"all done",
		">",
	} {
		for at < len(screen) && screen[at] != want {
			at++
		}
		if at == len(screen) {
			t.Fatalf("the screen lacks the line %q in order:\n%s", want, strings.Join(screen, "\n"))
		}
	}
}

// A Session floe run made is one floe chat can resume, by id and as the
// most recent.
func TestChatResumesARun(t *testing.T) {
	_, ws, env := chatEnv(t)
	model := writeScript(t, ws, `{"requests": [{"steps": [{"text": "ran once"}]}]}`) // each process plays it from the start
	_, errOut, code := runPiped(t, ws, env, "", "run", "--model", model, "once")
	m := sessionRe.FindStringSubmatch(errOut)
	if code != 0 || m == nil {
		t.Fatalf("floe run: status %d\n%s", code, errOut)
	}
	for _, args := range [][]string{{"chat", "--resume", m[1]}, {"chat", "--resume"}} {
		out, errOut, code := runPiped(t, ws, env, "and more\n", args...)
		if code != 0 || !strings.Contains(out, "resumed session "+m[1]) || !regexp.MustCompile(`> once\nran once\n── completed · [0-9.]+ s · 1 request[^\n]*\n> and more\n`).MatchString(out) {
			t.Errorf("floe %v: status %d\n%s\n%s", args, code, out, errOut)
		}
	}
}

// An approval request that reaches the chat before the call it asks
// about (a reconnect's snapshot lists pending approvals ahead of the
// replayed calls) is shown and asked only once the call is on screen; one
// whose call never comes is asked after waitMax, not lost.
func TestChatApprovalWaitsForItsCall(t *testing.T) {
	var buf strings.Builder
	ch := &chat{o: &chatOpts{askOK: true}, con: &plainConsole{w: &buf}}
	ch.r = render.New(ch.con, false)
	ctx := t.Context()
	approval := func(tc omni.Message) *omni.ServerEvent {
		raw, err := omni.Marshal(&tc)
		if err != nil {
			t.Fatal(err)
		}
		return &omni.ServerEvent{Type: omni.ServerApprovalRequest, ToolCall: raw}
	}
	edit := omni.ToolCall("edit_file", `{"file_path":"a.txt","old_string":"y\n","new_string":"z\n"}`, "call_2")
	ch.onServer(ctx, approval(edit), true)
	if len(ch.approvals) != 0 || strings.Contains(buf.String(), "? approve") {
		t.Fatalf("asked before its call was shown:\n%s", buf.String())
	}
	ch.onServer(ctx, approval(edit), false) // the live copy: no second question
	data, err := omni.Marshal(&edit)
	if err != nil {
		t.Fatal(err)
	}
	ch.onEvent(ctx, client.Event{ID: "1-7", Data: data})
	got := buf.String()
	call, ask := strings.Index(got, "→ edit_file a.txt"), strings.Index(got, "? approve edit_file a.txt (call_2)")
	if call < 0 || ask < call || strings.Count(got, "? approve") != 1 || len(ch.approvals) != 1 {
		t.Fatalf("want the call, then one approval request:\n%s", got)
	}

	lost := omni.ToolCall("exec_command", `{"cmd":"true"}`, "call_3")
	ch.onServer(ctx, approval(lost), true)
	ch.waiting[0].since = time.Now().Add(-waitMax)
	ch.askStale(ctx)
	if len(ch.approvals) != 2 || !strings.Contains(buf.String(), "? approve exec_command") {
		t.Fatalf("an approval whose call never came was not asked:\n%s", buf.String())
	}
}

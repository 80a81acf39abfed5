package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// tmuxPane is floe running in a tmux pane of a private tmux server: what
// a person at a real terminal of that size sees, scrollback included.
type tmuxPane struct {
	t      *testing.T
	socket string
}

// startTmux runs floe args in a cols×rows pane with env and dir.
func startTmux(t *testing.T, dir string, env []string, cols, rows int, args ...string) *tmuxPane {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatalf("tmux is needed (scripts/test installs it: apt-get install -y tmux): %v", err)
	}
	b := make([]byte, 6)
	rand.Read(b)
	p := &tmuxPane{t: t, socket: "floe-test-" + hex.EncodeToString(b)}
	shell := []string{"env", "-i"}
	shell = append(shell, env...)
	shell = append(shell, buildFloe(t))
	shell = append(shell, args...)
	p.tmux("-f", "/dev/null", "new-session", "-d", "-x", strconv.Itoa(cols), "-y", strconv.Itoa(rows), "-c", dir, "-s", "main", shellJoin(shell))
	p.tmux("set-option", "-t", "main", "remain-on-exit", "on")
	p.tmux("set-option", "-t", "main", "history-limit", "10000")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pane:\n%s", p.capture())
		}
		exec.Command("tmux", "-L", p.socket, "kill-server").Run()
	})
	return p
}

func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

func (p *tmuxPane) tmux(args ...string) string {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "tmux", append([]string{"-L", p.socket}, args...)...).CombinedOutput()
	if err != nil {
		p.t.Fatalf("tmux %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// capture is the pane's history and screen, wrapped lines joined.
func (p *tmuxPane) capture() string {
	out, err := exec.Command("tmux", "-L", p.socket, "capture-pane", "-p", "-J", "-S", "-", "-t", "main").CombinedOutput()
	if err != nil {
		return "(capture: " + err.Error() + ": " + string(out) + ")"
	}
	return string(out)
}

// keys types literal text, then presses Enter when enter is set.
func (p *tmuxPane) keys(text string, enter bool) {
	p.t.Helper()
	if text != "" {
		p.tmux("send-keys", "-t", "main", "-l", text)
	}
	if enter {
		p.tmux("send-keys", "-t", "main", "Enter")
	}
}

// until polls the pane until cond holds for its capture.
func (p *tmuxPane) until(what string, cond func(screen string) bool) string {
	p.t.Helper()
	deadline := time.Now().Add(bound)
	for {
		s := p.capture()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("timed out after %v waiting for %s", bound, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// exited waits until floe has exited (the pane is dead).
func (p *tmuxPane) exited() {
	p.t.Helper()
	deadline := time.Now().Add(bound)
	for strings.TrimSpace(p.tmux("display-message", "-p", "-t", "main", "#{pane_dead}")) != "1" {
		if time.Now().After(deadline) {
			p.t.Fatalf("floe did not exit within %v", bound)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *tmuxPane) contains(want string) string {
	p.t.Helper()
	return p.until(want, func(s string) bool { return strings.Contains(s, want) })
}

// A streamed paragraph wider than the terminal is on the screen exactly
// once when it ends (the line editor used to redraw it a row lower each
// time: 8 copies of one paragraph at 140 columns).
func TestChatWideParagraphOnceInTmux(t *testing.T) {
	para := strings.TrimSpace(strings.Repeat("Floe streams this sentence into a narrow terminal. ", 6))
	if len(para) < 300 {
		t.Fatalf("paragraph of %d characters", len(para))
	}
	_, ws, env := chatEnv(t)
	model := writeScript(t, ws, `{"requests": [{"steps": [{"text": "`+para+`", "chunks": 40, "delay_ms": 30}, {"text": "Short tail line."}]}]}`)
	p := startTmux(t, ws, env, 80, 30, "chat", "--model", model)
	p.contains("> ")
	p.keys("write a paragraph", true)
	screen := p.contains("── completed")
	if n := strings.Count(screen, para); n != 1 {
		t.Fatalf("the %d-character paragraph appears %d times at 80 columns, want once:\n%s", len(para), n, screen)
	}
	if n := strings.Count(screen, "Floe streams this sentence"); n != 6 {
		t.Fatalf("%d pieces of the paragraph on the screen, want its 6 sentences once each:\n%s", n, screen)
	}
	if n := strings.Count(screen, "Short tail line."); n != 1 {
		t.Fatalf("the last line appears %d times", n)
	}
}

// transcriptOf cuts a chat screen from the Prompt's line to the Task's
// closing line.
func transcriptOf(t *testing.T, screen, prompt string) []string {
	t.Helper()
	var out []string
	in := false
	for _, l := range strings.Split(screen, "\n") {
		l = strings.TrimRight(l, " ")
		if l == "> "+prompt {
			in = true
		}
		if in {
			out = append(out, l)
			if strings.HasPrefix(l, "── ") {
				return out
			}
		}
	}
	t.Fatalf("no transcript from %q to a closing line in:\n%s", prompt, screen)
	return nil
}

// A resumed Session reads as the live run did: the same labels, boxes,
// folding and closing line, line for line.
func TestChatResumeRendersLikeLiveInTmux(t *testing.T) {
	home, ws, env := chatEnv(t)
	model := writeScript(t, ws, `{"requests": [
	  {"steps": [{"thinking": "Look at the files first.", "chunks": 3},
	             {"text": "Listing them.", "chunks": 2},
	             {"tool_call": {"name": "exec_command", "arguments": {"description": "List", "cmd": "for i in $(seq 1 30); do echo file-$i; done"}}}],
	   "usage": {"output": 12, "total": 340}},
	  {"steps": [{"tool_call": {"name": "write_file", "arguments": {"file_path": "notes.txt", "content": "one\ntwo\n"}}}],
	   "usage": {"output": 8, "total": 400}},
	  {"steps": [{"text": "Done: 30 files, and notes written.", "chunks": 3}], "usage": {"output": 9, "total": 420}}
	]}`)
	live := startTmux(t, ws, env, 100, 60, "chat", "--model", model)
	live.contains("> ")
	live.keys("list and note", true)
	live.contains("── completed")
	live.keys("\x04", false)
	liveScreen := live.contains("resume with: floe chat --resume ")
	live.exited() // it holds the home's store until then
	got := transcriptOf(t, liveScreen, "list and note")
	for _, want := range []string{"thinking: Look at the files first.", "Listing them.", "→ exec_command", "  ┌ output call_1", "  │ file-1", "… 15 more lines (30 in all) …", "→ write_file notes.txt (2 lines)", "  + one", "Done: 30 files, and notes written."} {
		if !strings.Contains(strings.Join(got, "\n"), want) {
			t.Fatalf("the live run lacks %q:\n%s", want, strings.Join(got, "\n"))
		}
	}
	m := sessionRe.FindStringSubmatch(liveScreen)
	if m == nil {
		t.Fatalf("no session id:\n%s", liveScreen)
	}
	_ = home
	resumed := startTmux(t, ws, env, 100, 60, "chat", "--resume", m[1])
	resumed.contains("> ")
	resumedScreen := resumed.until("the history", func(s string) bool { return strings.Contains(s, "── completed") })
	if again := transcriptOf(t, resumedScreen, "list and note"); strings.Join(again, "\n") != strings.Join(got, "\n") {
		t.Fatalf("resumed, the Session reads\n%s\n\nlive it read\n%s", strings.Join(again, "\n"), strings.Join(got, "\n"))
	}
	if !strings.Contains(resumedScreen, "title list and note") {
		t.Errorf("the resumed chat does not show the title:\n%s", resumedScreen)
	}
	resumed.keys("\x04", false)
}

// floe attach: an approval answered elsewhere clears attach's question,
// and the next Enter answers the next call, not the stale one (which
// answered 404 before); a answers for the rest of the Session.
func TestAttachApprovalAnsweredElsewhereInTmux(t *testing.T) {
	home, ws, env := chatEnv(t)
	model := writeScript(t, ws, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_a", "arguments": {"description": "A", "cmd": "echo from-a"}}}]},
	  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_b", "arguments": {"description": "B", "cmd": "echo from-b"}}}]},
	  {"steps": [{"tool_call": {"name": "exec_command", "id": "call_c", "arguments": {"description": "C", "cmd": "echo from-c"}}}]},
	  {"steps": [{"text": "all three ran"}]}
	]}`)
	addr := freeAddr(t)
	serveEnv := append(append([]string{}, env...), "FLOE_HTTP_ADDR="+addr, "FLOE_NATS_LISTEN=off", "FLOE_HOME="+filepath.Join(home, "server"), "FLOE_SCRIPTS_DIR="+ws)
	serve := startPTY(t, ws, serveEnv, "serve")
	serve.expect("floe serve: http://" + addr)
	url := "http://" + addr
	c := client.New(url)
	ctx := t.Context()
	sess, err := c.CreateSession(ctx, client.CreateSession{Model: model, Workspace: ws, ApprovalMode: omni.ApproveAlwaysAsk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubmitTask(ctx, sess.ID, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "run three"}}}); err != nil {
		t.Fatal(err)
	}
	p := startTmux(t, ws, env, 100, 40, "attach", sess.ID, "--url", url)
	p.contains("allow exec_command? [Y/n/a] ")

	// Answered in another client (the Web App, say).
	if err := c.Approve(ctx, sess.ID, "call_a", omni.DecisionAllow); err != nil {
		t.Fatal(err)
	}
	p.contains("(answered elsewhere: allowed)")
	p.until("the next question", func(s string) bool {
		return strings.Count(s, "allow exec_command? [Y/n/a]") == 2 && strings.Contains(s, "from-a")
	})
	p.keys("", true) // Enter: allows call_b, not the stale call_a
	p.contains("from-b")
	p.until("the third question", func(s string) bool { return strings.Count(s, "allow exec_command? [Y/n/a]") == 3 })
	p.keys("a", true)
	screen := p.contains("all three ran")
	if strings.Contains(screen, "404") || strings.Contains(screen, "not found") || strings.Contains(screen, "floe: approve") {
		t.Fatalf("a stale answer reached the gateway:\n%s", screen)
	}
	for _, id := range []string{"call_a", "call_b", "call_c"} {
		if !strings.Contains(screen, "✓ allowed "+id) {
			t.Fatalf("%s not allowed:\n%s", id, screen)
		}
	}
	p.contains("── completed")
	serve.cmd.Process.Signal(os.Interrupt)
	serve.wait()
}

// floe chat with a pre_tool_use command hook (FLOE_HOOKS, confined like a
// tool) that denies a push: the chat shows which hook denied the call and
// why, and the call's output names the hook; nothing ran.
func TestChatShowsAHookDeniedCallInTmux(t *testing.T) {
	_, ws, env := chatEnv(t)
	hook := filepath.Join(t.TempDir(), "no-push-main.sh")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\ncase \"$(cat)\" in *'push origin main'*) echo '{\"decision\":\"deny\",\"reason\":\"pushes to main are not allowed\"}' ;; esac\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	hooksFile := filepath.Join(t.TempDir(), "hooks.json")
	if err := os.WriteFile(hooksFile, []byte(`{"hooks":{"pre_tool_use":[{"name":"no-push-main","command":"`+hook+`","match":"exec_command"}]}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	model := writeScript(t, ws, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "arguments": {"description": "Push", "cmd": "touch pushed && git push origin main"}}}]},
	  {"expect_tool_outputs": ["call_1"], "steps": [{"text": "The push was refused."}]}
	]}`)
	p := startTmux(t, ws, append(env, "FLOE_HOOKS="+hooksFile), 120, 40, "chat", "--model", model)
	p.contains("> ")
	p.keys("push it", true)
	screen := p.contains("── completed")
	got := strings.Join(transcriptOf(t, screen, "push it"), "\n")
	for _, want := range []string{
		"⚑ pre_tool_use hook no-push-main: deny — pushes to main are not allowed",
		"Tool call denied by the no-push-main hook: pushes to main are not allowed.",
		"The push was refused.",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the chat lacks %q:\n%s", want, got)
		}
	}
	if _, err := os.Stat(filepath.Join(ws, "pushed")); err == nil {
		t.Error("the denied command ran")
	}
	p.keys("\x04", false)
}

// "a" at an approval prompt allows the tool for the rest of the Session,
// also in another process: the engine stores it with the Session, /session
// shows it, and a resumed chat's next call of the tool is allowed without
// a question.
func TestAllowForSessionOutlivesTheProcessInTmux(t *testing.T) {
	_, ws, env := chatEnv(t)
	// Each process plays the script from its start: one call, then an
	// answer, in both.
	model := writeScript(t, ws, `{"requests": [
	  {"steps": [{"tool_call": {"name": "exec_command", "arguments": {"description": "say", "cmd": "echo ran-it"}}}]},
	  {"steps": [{"text": "the command ran"}]}
	]}`)
	live := startTmux(t, ws, env, 100, 40, "chat", "--model", model, "--approve", "always-ask")
	live.contains("> ")
	live.keys("first", true)
	live.contains("allow exec_command? [Y/n/a] ")
	live.keys("a", true)
	live.contains("allowing exec_command for the rest of this session")
	live.contains("── completed")
	live.keys("/session", true)
	live.contains("allowed for this session: exec_command")
	live.keys("\x04", false)
	screen := live.contains("resume with: floe chat --resume ")
	live.exited()
	m := sessionRe.FindStringSubmatch(screen)
	if m == nil {
		t.Fatalf("no session id:\n%s", screen)
	}

	resumed := startTmux(t, ws, env, 100, 40, "chat", "--resume", m[1])
	resumed.contains("> ")
	resumed.keys("second", true)
	screen = resumed.until("the second Task's end", func(s string) bool {
		return strings.Contains(s, "> second") && strings.Count(s, "── completed") == 2
	})
	got := strings.Join(transcriptOf(t, screen, "second"), "\n")
	if strings.Contains(got, "[Y/n/a]") || !strings.Contains(got, "ran-it") || !strings.Contains(got, "✓ allowed") {
		t.Fatalf("the resumed chat's call was not allowed without asking:\n%s", got)
	}
	resumed.keys("\x04", false)
	resumed.exited()
}

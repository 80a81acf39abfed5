package main

import (
	"regexp"
	"strings"
	"testing"
)

// /fork forks the Session at its end; /rewind N before the N-th last
// Prompt; each says how to continue in the fork.
func TestChatForkAndRewind(t *testing.T) {
	_, ws, env := chatEnv(t)
	model := writeScript(t, ws, `{"requests": [
	  {"steps": [{"text": "first answer"}]},
	  {"steps": [{"text": "second answer"}]}
	]}`)
	p := startPTY(t, ws, env, "chat", "--model", model)
	p.expect("> ")
	p.send("/rewind 1\r")
	p.expect("this chat has seen 0 Prompts")
	p.send("one\r")
	p.expect("first answer")
	p.expect("> ")
	p.send("two\r")
	p.expect("second answer")
	p.expect("> ")
	p.send("/fork\r")
	p.expect("continue there: floe chat --resume session-")
	p.send("/rewind 1\r")
	p.expect("continue there: floe chat --resume session-")
	p.send("/rewind x\r")
	p.expect("/rewind N forks the Session before")
	p.send("/exit\r")
	if code := p.wait(); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	re := regexp.MustCompile(`forked before the Prompt 1 back into (session-\S+) \(from session-\S+ at (\d+)\)`)
	if m := re.FindStringSubmatch(p.screen()); m == nil {
		t.Errorf("no rewind fork on the screen:\n%s", p.screen())
	}
}

// /rewind N reaches Prompts from before this process: a chat resumed on a
// Session of five Prompts (it shows the last three Tasks) rewinds four, to
// before the second Prompt, reading the earlier history page; the fork's
// transcript ends with the first Task.
func TestChatRewindReachesPromptsFromTheHistory(t *testing.T) {
	_, ws, env := chatEnv(t)
	model := writeScript(t, ws, `{"requests": [
	  {"steps": [{"text": "answer one"}]},
	  {"steps": [{"text": "answer two"}]},
	  {"steps": [{"text": "answer three"}]},
	  {"steps": [{"text": "answer four"}]},
	  {"steps": [{"text": "answer five"}]}
	]}`)
	out, errOut, code := runPiped(t, ws, env, "one\ntwo\nthree\nfour\nfive\n", "chat", "--model", model)
	m := sessionRe.FindStringSubmatch(out + errOut)
	if code != 0 || m == nil || !strings.Contains(out, "answer five") {
		t.Fatalf("floe chat: status %d\n%s\n%s", code, out, errOut)
	}
	out, errOut, code = runPiped(t, ws, env, "/rewind 6\n/rewind 4\n", "chat", "--resume", m[1])
	if code != 0 || !strings.Contains(out, "earlier turns not shown") || strings.Contains(out, "answer one") {
		t.Fatalf("floe chat --resume: status %d, want the last three Tasks only\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "this chat has seen 5 Prompts") {
		t.Errorf("/rewind 6 of five Prompts: not refused\n%s", out)
	}
	fm := regexp.MustCompile(`forked before the Prompt 4 back into (session-\S+) \(from ` + m[1] + ` after record \d+\)`).FindStringSubmatch(out)
	if fm == nil {
		t.Fatalf("/rewind 4 did not fork:\n%s\n%s", out, errOut)
	}
	out, errOut, code = runPiped(t, ws, env, "", "chat", "--resume", fm[1])
	if code != 0 || !regexp.MustCompile(`> one\nanswer one\n`).MatchString(out) || strings.Contains(out, "two") {
		t.Errorf("the fork's transcript, want the first Task only: status %d\n%s\n%s", code, out, errOut)
	}
}

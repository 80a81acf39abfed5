package main

import (
	"regexp"
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

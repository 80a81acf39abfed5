package webe2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

func execCall(id, description, cmd string) obj {
	return obj{"tool_call": obj{"name": "exec_command", "id": id, "arguments": obj{"description": description, "cmd": cmd}}}
}

func cardSel(id string) string {
	return fmt.Sprintf(`#transcript li[data-kind=tool][data-tool-call-id=%q]`, id)
}

// Under always-ask a tool card shows Allow and Deny; Allow runs the tool
// and its output appears on the card; Deny shows the denial and nothing
// runs. The list says "waiting for approval" meanwhile.
func TestApprovalAllowAndDeny(t *testing.T) {
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{obj{"text": "First I'll greet you from a shell."}, execCall("call_hello", "Say hello", "echo hello-from-tool")}},
		obj{"steps": []any{obj{"text": "Now I'd like to create a file."}, execCall("call_touch", "Create a marker file", "touch should-not-exist")}},
		obj{"steps": []any{obj{"text": "Done: one command ran, one was denied."}}},
	}})
	sid := s.session(t, "", client.CreateSession{ApprovalMode: omni.ApproveAlwaysAsk, Title: "Approvals"})
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("the transcript ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.send("Greet me, then make a marker file.")

	hello := cardSel("call_hello")
	tb.has("the approval buttons on the card", hello+`[data-status=waiting] .approval button`)
	tb.until("the list to say waiting for approval", fmt.Sprintf(`document.querySelector('#sessions li[data-session-id=%q]').dataset.state === 'waiting_for_approval'`, sid))
	if got := eval[string](tb, `[...document.querySelectorAll('`+hello+` .approval button')].map((b) => b.textContent).join(',')`); got != "Allow,Allow for this Session,Deny" {
		t.Fatalf("approval buttons %q", got)
	}
	if got := eval[string](tb, `document.getElementById('s-state').textContent`); got != "waiting for approval" {
		t.Fatalf("session state %q", got)
	}
	tb.click(hello, "Allow")
	tb.has("the allowed tool's output", hello+`[data-status=done][data-decision=allow]`)
	if out := eval[string](tb, `document.querySelector('`+hello+` pre.output').textContent`); !strings.Contains(out, "hello-from-tool") {
		t.Fatalf("output on the card %q", out)
	}

	touch := cardSel("call_touch")
	tb.has("the second approval", touch+`[data-status=waiting] .approval button`)
	tb.screenshot("webapp-approval.png") // a finished tool card and a pending one
	tb.click(touch, "Deny")
	tb.has("the denied card", touch+`[data-status=denied][data-decision=deny]`)
	if out := eval[string](tb, `document.querySelector('`+touch+` pre.output').textContent`); out != "Tool call denied by user." {
		t.Fatalf("denied card output %q", out)
	}
	tb.until("the final answer", `[...document.querySelectorAll('#transcript li[data-kind=text]')].some((li) => li.innerText.includes('one was denied'))`)
	tb.until("idle", `document.getElementById('s-state').textContent === 'idle'`)
	if _, err := os.Stat(filepath.Join(s.dir, "should-not-exist")); err == nil {
		t.Fatal("the denied command ran")
	}
	if eval[bool](tb, `!!document.querySelector('#transcript .approval')`) {
		t.Fatal("approval buttons left after the decisions")
	}
	noDuplicates(t, tb.transcript())
}

// Reloading the page mid-answer shows the same transcript, nothing
// doubled, and the answer goes on streaming into it.
func TestReloadMidAnswerKeepsTranscript(t *testing.T) {
	answer := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 12)
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{execCall("call_ls", "List", "echo one; echo two")}},
		obj{"steps": []any{obj{"thinking": "Now the long answer."}, obj{"text": answer, "chunks": 60, "delay_ms": 60}}},
	}})
	sid := s.session(t, "", client.CreateSession{})
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.send("Tell me a long story.")
	tb.until("the answer half streamed", `[...document.querySelectorAll('#transcript li[data-kind=text][data-streaming=true]')].some((li) => li.innerText.length > 100)`)
	before := tb.transcript()

	tb.reload()
	tb.until("ready again", `document.getElementById('transcript').dataset.ready === 'true'`)
	mid := tb.transcript()
	if got := kinds(mid); !slices.Equal(got, []string{"user", "tool", "thinking", "text"}) {
		t.Fatalf("after the reload the transcript is %v, want user, tool, thinking, text", got)
	}
	for i := range 3 {
		if mid[i] != before[i] {
			t.Fatalf("item %d changed across the reload: %+v, was %+v", i, mid[i], before[i])
		}
	}
	if !strings.HasPrefix(answer, strings.TrimSpace(mid[3].Text)) || len(mid[3].Text) < len(strings.TrimSpace(before[3].Text)) {
		t.Fatalf("after the reload the answer is %q, before it was %q", mid[3].Text, before[3].Text)
	}
	tb.until("the answer complete", `document.querySelector('#transcript li[data-kind=text]:not([data-streaming])')`)
	tb.until("idle", `document.getElementById('s-state').textContent === 'idle'`)
	final := tb.transcript()
	if strings.TrimSpace(final[3].Text) != strings.TrimSpace(answer) {
		t.Fatalf("final answer %q", final[3].Text)
	}
	noDuplicates(t, final)
	// A fresh page shows exactly the same.
	fresh := newTab(t)
	fresh.open(s.url(), sid)
	fresh.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	if got := fresh.transcript(); !slices.Equal(got, final) {
		t.Fatalf("a fresh page shows %+v\nthe reloaded page %+v", got, final)
	}
}

// Killing and restarting `floe serve` mid-answer: the page reconnects by
// itself (EventSource, Last-Event-ID) and completes the answer without a
// reload; the answer is there once, and a fresh page shows the same.
func TestServeRestartMidAnswerCompletes(t *testing.T) {
	answer := strings.Repeat("Resilient streams survive restarts. ", 10)
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{obj{"text": answer, "chunks": 80, "delay_ms": 40}}},
	}, "after_last": "repeat_last"}, "FLOE_ENGINE_ACK_WAIT_MS=1500")
	sid := s.session(t, "", client.CreateSession{})
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.send("Stream something long.")
	tb.until("the answer streaming", `[...document.querySelectorAll('#transcript li[data-kind=text][data-streaming=true]')].some((li) => li.innerText.length > 40)`)
	s.stop()
	s.start()
	tb.until("the complete answer", fmt.Sprintf(`[...document.querySelectorAll('#transcript li[data-kind=text]:not([data-streaming])')].some((li) => li.textContent.trim() === %q)`, strings.TrimSpace(answer)))
	tb.until("idle", `document.getElementById('s-state').textContent === 'idle'`)
	// The session list reconnected too: it follows the Session to idle.
	tb.until("the list live again", fmt.Sprintf(`document.querySelector('#sessions li[data-session-id=%q]')?.dataset.state === 'idle'`, sid))
	got := tb.transcript()
	n := 0
	for _, it := range got {
		if it.Kind == "text" && strings.TrimSpace(it.Text) == strings.TrimSpace(answer) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the complete answer appears %d times: %+v", n, got)
	}
	noDuplicates(t, got)
	t.Logf("transcript after the restart: %v", kinds(got))
	fresh := newTab(t)
	fresh.open(s.url(), sid)
	fresh.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	if f := fresh.transcript(); !slices.Equal(f, got) {
		t.Fatalf("a fresh page shows %+v\nthe live page %+v", f, got)
	}
}

// Stop while a tool runs: the card shows its elapsed time while running,
// then interrupted; the abort notice follows; the Session is idle.
func TestStopMidToolShowsInterrupted(t *testing.T) {
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{execCall("call_sleep", "Wait a long time", "echo started; sleep 30")}},
		obj{"steps": []any{obj{"text": "never"}}},
	}})
	sid := s.session(t, "", client.CreateSession{})
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.send("Sleep.")
	card := cardSel("call_sleep")
	tb.has("the tool running", card+`[data-status=running]`)
	tb.until("its elapsed time", `/running \d+s/.test(document.querySelector('`+card+` .status').textContent)`)
	tb.until("its live output", `document.querySelector('`+card+` pre.output')?.textContent.includes('started')`)
	tb.click("#composer", "Stop")
	tb.has("the interrupted card", card+`[data-status=interrupted]`)
	tb.until("the abort notice", `document.querySelector('#transcript li[data-kind=notice][data-notice=abort]')`)
	tb.until("idle", `document.getElementById('s-state').textContent === 'idle'`)
	// The card is interrupted from the stream: by the tool's own aborted
	// output when the engine publishes one before abort (protocol.md §6 case A),
	// else by the abort itself.
	if out := eval[string](tb, `document.querySelector('`+card+` pre.output')?.textContent || ''`); !strings.Contains(out, "started") {
		t.Fatalf("the live output before the stop is gone: %q", out)
	}
}

// Steering typed while the Task runs appears in the transcript where the
// engine delivered it: after the tool, before the answer that used it.
func TestSteeringWhileRunningAppearsInOrder(t *testing.T) {
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{execCall("call_slow", "Slow step", "sleep 2; echo slow-done")}},
		obj{"expect_last_user": "also mention the weather", "steps": []any{obj{"text": "Noted: the weather is fine."}}},
	}})
	sid := s.session(t, "", client.CreateSession{})
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.send("Do the slow thing.")
	tb.has("the tool running", cardSel("call_slow")+`[data-status=running]`)
	tb.send("also mention the weather")
	tb.until("the answer", `[...document.querySelectorAll('#transcript li[data-kind=text]')].some((li) => li.innerText.includes('weather is fine'))`)
	tb.until("idle", `document.getElementById('s-state').textContent === 'idle'`)
	got := tb.transcript()
	if k := kinds(got); !slices.Equal(k, []string{"user", "tool", "user", "text"}) {
		t.Fatalf("transcript %v (%+v), want user, tool, steering, answer", k, got)
	}
	if !eval[bool](tb, `document.querySelectorAll('#transcript > li')[2].dataset.steering === 'true'`) || !strings.Contains(got[2].Text, "also mention the weather") {
		t.Fatalf("steering item %+v", got[2])
	}
}

// A subagent's messages land in its nested card, on the run_subagent tool
// card, and not in the parent's transcript.
func TestSubagentInNestedCard(t *testing.T) {
	// The scripted model counts requests per Session: the child plays the
	// same entries (its run_subagent attempt is refused: depth limit).
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{obj{"thinking": "Delegate."}, obj{"tool_call": obj{"name": "run_subagent", "id": "sub",
			"arguments": obj{"description": "helper", "prompt": "count the files"}}}}},
		obj{"steps": []any{obj{"text": "There are three files.", "chunks": 3}}},
	}})
	sid := s.session(t, "", client.CreateSession{})
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.send("How many files? Ask a helper.")
	tb.until("idle after the answer", `document.getElementById('s-state').textContent === 'idle' && document.querySelectorAll('#transcript > li[data-kind=text]').length === 1`)
	top := tb.transcript()
	if k := kinds(top); !slices.Equal(k, []string{"user", "thinking", "tool", "text"}) {
		t.Fatalf("parent transcript %v (%+v)", k, top)
	}
	for _, it := range top {
		if strings.Contains(it.Text, "count the files") && it.Kind == "user" {
			t.Fatalf("the child's prompt is in the parent's transcript: %+v", top)
		}
	}
	nested := eval[[]item](tb, `transcript(document.querySelector('`+cardSel("sub")+` li[data-kind=subagent] ol'))`)
	if k := kinds(nested); !slices.Equal(k, []string{"user", "thinking", "tool", "text"}) {
		t.Fatalf("child card %v (%+v)", k, nested)
	}
	if !strings.Contains(nested[0].Text, "count the files") || nested[2].Status != "failed" || !strings.Contains(nested[3].Text, "There are three files.") {
		t.Fatalf("child card %+v", nested)
	}
	if n := eval[int](tb, `document.querySelectorAll('#transcript > li[data-kind=subagent]').length`); n != 0 {
		t.Fatalf("%d subagent cards loose in the parent transcript", n)
	}
	// Collapsible.
	if !eval[bool](tb, `document.querySelector('`+cardSel("sub")+` li[data-kind=subagent] > details > summary') !== null`) {
		t.Fatal("the subagent card is not collapsible")
	}
}

// "Allow for this Session" allows the call and stores its tool with the
// Session: the tool's next call (in a later Task too) runs without
// asking, and GET shows it in allowedTools.
func TestAllowForThisSession(t *testing.T) {
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{execCall("call_one", "First", "echo one-ran")}},
		obj{"steps": []any{execCall("call_two", "Second", "echo two-ran")}},
		obj{"steps": []any{obj{"text": "Both ran."}}},
	}})
	sid := s.session(t, "", client.CreateSession{ApprovalMode: omni.ApproveAlwaysAsk, Title: "Allow for session"})
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("the transcript ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.send("Run two commands.")
	one, two := cardSel("call_one"), cardSel("call_two")
	tb.has("the approval buttons", one+`[data-status=waiting] .approval button`)
	tb.click(one, "Allow for this Session")
	tb.until("the second call's output", `document.querySelector('`+two+` pre.output')?.textContent.includes('two-ran')`)
	tb.until("the answer", `[...document.querySelectorAll('#transcript li[data-kind=text]')].some((li) => li.innerText.includes('Both ran.'))`)
	if eval[bool](tb, `!!document.querySelector('`+two+` .approval')`) {
		t.Fatal("the second call was asked about")
	}
	if got := eval[string](tb, `document.querySelector('`+two+`').dataset.decision || ''`); got != "allow" {
		t.Fatalf("second call decision %q", got)
	}
	got, err := s.api("").GetSession(ctxT(t), sid)
	if err != nil || !slices.Equal(got.AllowedTools, []string{"exec_command"}) {
		t.Fatalf("allowedTools %v (%v)", got.AllowedTools, err)
	}
}

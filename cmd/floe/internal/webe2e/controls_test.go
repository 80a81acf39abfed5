package webe2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// A failed request shows a retry row with the countdown from retry_in_ms;
// Retry now skips the wait (ten minutes here, so only the button can bring
// the answer within the test's wait).
func TestRetryRowAndRetryNow(t *testing.T) {
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{obj{"text": "Half an ans", "end": false}, obj{"error": obj{"status": "timeout", "message": "upstream reset"}}}},
		obj{"steps": []any{obj{"text": "Recovered answer."}}},
	}}, "FLOE_RETRY_BASE_MS=600000", "FLOE_RETRY_CAP_MS=600000")
	sid := s.session(t, "", client.CreateSession{})
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.send("Answer, even if the upstream resets.")
	tb.has("the retry row", `#transcript li[data-kind=retry][data-active=true]`)
	tb.until("its countdown", `/Retrying in \d+s\./.test(document.querySelector('#transcript li[data-kind=retry] .countdown').textContent)`)
	if txt := eval[string](tb, `document.querySelector('#transcript li[data-kind=retry]').textContent`); !strings.Contains(txt, "timeout") || !strings.Contains(txt, "upstream reset") {
		t.Fatalf("retry row %q", txt)
	}
	tb.click("#transcript li[data-kind=retry]", "Retry now")
	tb.until("the recovered answer", `[...document.querySelectorAll('#transcript li[data-kind=text]')].some((li) => li.textContent.includes('Recovered answer.'))`)
	tb.has("the retry row retired", `#transcript li[data-kind=retry][data-active=false]`)
	tb.until("idle", `document.getElementById('s-state').textContent === 'idle'`)
	noDuplicates(t, tb.transcript())
}

// Compact on an idle Session adds a compaction row that completes; a
// reload shows the same row (the compaction's own request, in the Trace,
// stays folded inside it).
func TestCompactShowsCompactionRow(t *testing.T) {
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{obj{"text": "Answer one."}}},
		obj{"steps": []any{obj{"text": "[summary]\nWe talked about answer one.\n[/summary]"}}},
	}})
	sid := s.session(t, "", client.CreateSession{})
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.send("Say answer one.")
	tb.until("idle after the answer", `document.getElementById('s-state').textContent === 'idle' && document.querySelector('#transcript li[data-kind=text]')`)
	tb.click("#composer", "Compact")
	tb.has("the compaction done", `#transcript li[data-kind=compaction][data-status=completed]`)
	tb.until("idle", `document.getElementById('s-state').textContent === 'idle'`)
	live := tb.transcript()
	if k := kinds(live); !slices.Equal(k, []string{"user", "text", "compaction"}) {
		t.Fatalf("transcript %v (%+v)", k, live)
	}
	if !strings.Contains(live[2].Text, "manual") {
		t.Fatalf("compaction row %q does not say why", live[2].Text)
	}
	// The Trace may lag the stream by a moment: wait for the tracer.
	deadline := time.Now().Add(waitLimit)
	for {
		fresh := newTab(t)
		fresh.open(s.url(), sid)
		fresh.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
		got := fresh.transcript()
		if slices.Equal(kinds(got), kinds(live)) && got[0] == live[0] && got[1] == live[1] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a reload %+v, live %+v", got, live)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Under always-ask a subagent's tool call asks on its own card, inside the
// subagent's nested card; Allow there runs it.
func TestSubagentApprovalOnItsCard(t *testing.T) {
	// Parent and child play the same entries (per-Session counters).
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{execCall("c0", "Look", "echo looked")}},
		obj{"steps": []any{obj{"tool_call": obj{"name": "run_subagent", "id": "sub",
			"arguments": obj{"description": "helper", "prompt": "inner job"}}}}},
		obj{"steps": []any{obj{"text": "All done."}}},
	}, "after_last": "repeat_last"})
	sid := s.session(t, "", client.CreateSession{ApprovalMode: omni.ApproveAlwaysAsk})
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.send("Look, then delegate.")
	nested := 0
	deadline := time.Now().Add(2 * waitLimit)
	for {
		if eval[bool](tb, `document.getElementById('s-state').textContent === 'idle' && document.querySelectorAll('#transcript > li[data-kind=text]').length > 0`) {
			break
		}
		where := eval[string](tb, `(() => {
		  const b = [...document.querySelectorAll('#transcript .approval button')].find((b) => b.textContent === 'Allow' && !b.disabled);
		  if (!b) return '';
		  const inner = b.closest('li[data-kind=subagent]') ? 'nested' : 'top';
		  b.click();
		  return inner;
		})()`)
		if where == "nested" {
			nested++
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Task did not finish\n%s", tb.dump())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if nested == 0 {
		t.Fatalf("no approval was asked on a card inside the subagent's card\n%s", tb.dump())
	}
	inner := eval[[]item](tb, `transcript(document.querySelector('`+cardSel("sub")+` li[data-kind=subagent] ol'))`)
	ok := false
	for _, it := range inner {
		if it.Kind == "tool" && it.ID == "c0" && it.Status == "done" && strings.Contains(it.Text, "looked") {
			ok = true
		}
	}
	if !ok {
		t.Fatalf("the child's allowed tool did not run on its card: %+v", inner)
	}
	if n := eval[int](tb, `document.querySelectorAll('#transcript .approval').length`); n != 0 {
		t.Fatalf("%d approval prompts left", n)
	}
}

// A Session made with max turns 1 stops after its first turn with the
// max-turns notice as a notice row.
func TestMaxTurnsNotice(t *testing.T) {
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{execCall("c1", "One", "echo one")}},
		obj{"steps": []any{obj{"text": "never reached"}}},
	}})
	tb := newTab(t)
	tb.open(s.url(), "")
	tb.click("", "New session")
	tb.do(setValue(`#new-form input[name=maxTurns]`, "1"))
	tb.click("#new-form", "Create")
	tb.until("the new Session's view", `location.hash.startsWith('#/s/session-') && document.getElementById('transcript').dataset.ready === 'true'`)
	sid := eval[string](tb, `decodeURIComponent(location.hash.slice(4))`)
	if got, err := s.api("").GetSession(ctxT(t), sid); err != nil || got.MaxTurns != 1 {
		t.Fatalf("session max turns %v, %v", got, err)
	}
	tb.send("Run two turns.")
	tb.has("the max-turns notice", `#transcript li[data-kind=notice]`)
	tb.until("idle", `document.getElementById('s-state').textContent === 'idle'`)
	got := tb.transcript()
	last := got[len(got)-1]
	if last.Kind != "notice" || !strings.Contains(last.Text, "[reached max turns (1); stopping]") {
		t.Fatalf("transcript %+v, want the max-turns notice last", got)
	}
	if slices.ContainsFunc(got, func(it item) bool { return strings.Contains(it.Text, "never reached") }) {
		t.Fatalf("a second turn ran: %+v", got)
	}
}

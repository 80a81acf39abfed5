package webe2e

import (
	"fmt"
	"strings"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// longAnswer is several screens of Markdown.
func longAnswer(tag string) string {
	var b strings.Builder
	for i := range 40 {
		fmt.Fprintf(&b, "Paragraph %d of %s: the transcript must follow this text as it streams, one line after another, until the end.\n\n", i+1, tag)
	}
	return b.String()
}

const (
	atBottomJS = `((l) => l.scrollHeight - l.scrollTop - l.clientHeight < 40)(document.getElementById('transcript'))`
	overflowJS = `((l) => l.scrollHeight > l.clientHeight * 2)(document.getElementById('transcript'))`
)

// inView is JavaScript that is true when the element css selects lies
// inside the transcript's visible box.
func inView(css string) string {
	return fmt.Sprintf(`((el, l) => { if (!el) return false; const r = el.getBoundingClientRect(), v = l.getBoundingClientRect(); return r.height > 0 && r.top >= v.top - 1 && r.bottom <= v.bottom + 1; })(document.querySelector(%q), document.getElementById('transcript'))`, css)
}

// The transcript follows the output: at the bottom while an answer
// streams, after a second Task, on open; when the person scrolls up it
// stays put and offers "Jump to latest", which follows again.
func TestTranscriptFollowsTheBottom(t *testing.T) {
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{obj{"text": longAnswer("the first answer"), "chunks": 60, "delay_ms": 50}}},
	}, "after_last": "repeat_last"})
	sid := s.session(t, "", client.CreateSession{})
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)

	tb.send("Write a lot.")
	tb.until("the answer taller than two screens", `document.querySelector('#transcript li[data-kind=text][data-streaming=true]') && `+overflowJS)
	for range 5 { // while it streams, every look finds the bottom
		if !eval[bool](tb, atBottomJS) {
			t.Fatalf("streaming below the fold: the transcript is not at its bottom")
		}
		eval[bool](tb, `new Promise((r) => setTimeout(() => r(true), 150))`)
	}
	if eval[bool](tb, `!document.getElementById('jump-latest').hidden`) {
		t.Fatal(`"Jump to latest" shown while following`)
	}

	// The person scrolls up: the view stays where they put it.
	eval[bool](tb, `(document.getElementById('transcript').scrollTop = 0) === 0`)
	tb.until(`"Jump to latest"`, `!document.getElementById('jump-latest').hidden`)
	grow := eval[int](tb, `document.getElementById('transcript').scrollHeight`)
	tb.until("more text below", fmt.Sprintf(`document.getElementById('transcript').scrollHeight > %d + 200 || !document.querySelector('#transcript li[data-kind=text][data-streaming=true]')`, grow))
	if top := eval[float64](tb, `document.getElementById('transcript').scrollTop`); top != 0 {
		t.Fatalf("the view moved to %v while the person read the top", top)
	}
	tb.click("", "Jump to latest ↓")
	tb.until("at the bottom again", atBottomJS)
	tb.until(`"Jump to latest" gone`, `document.getElementById('jump-latest').hidden`)
	tb.until("idle", `document.getElementById('s-state').textContent === 'idle'`)
	if !eval[bool](tb, atBottomJS) {
		t.Fatal("not at the bottom when the answer ended")
	}

	// Scrolled up, the person sends a second Task: its answer is followed.
	eval[bool](tb, `(document.getElementById('transcript').scrollTop = 0) === 0`)
	tb.until(`"Jump to latest"`, `!document.getElementById('jump-latest').hidden`)
	tb.send("And again.")
	tb.until("the second answer streaming long", `[...document.querySelectorAll('#transcript li[data-kind=text]')].length === 2 && document.querySelector('#transcript li[data-kind=text][data-streaming=true]')?.innerText.length > 2000`)
	if !eval[bool](tb, atBottomJS) {
		t.Fatal("the second Task's answer streams below the fold")
	}
	tb.until("idle", `document.getElementById('s-state').textContent === 'idle'`)

	// A Session opens at its bottom.
	fresh := newTab(t)
	fresh.open(s.url(), sid)
	fresh.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	fresh.until("opened at the bottom", atBottomJS+` && `+overflowJS)
	if !eval[bool](fresh, `((el, l) => { const r = el.getBoundingClientRect(), v = l.getBoundingClientRect(); return r.bottom <= v.bottom + 1 && r.bottom > v.top; })(document.querySelector('#transcript > li:last-child'), document.getElementById('transcript'))`) {
		t.Fatal("the last item's end is not in view on open")
	}
}

// A pending approval is in view: when the view follows, the card's Allow
// button is on screen without a scroll; when the person has scrolled up,
// a bar announces it and its Show button brings it into view.
func TestApprovalComesIntoView(t *testing.T) {
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{obj{"text": longAnswer("the plan"), "chunks": 30, "delay_ms": 30}, execCall("call_one", "First", "echo one")}},
		obj{"steps": []any{obj{"text": "Ran it."}}},
		obj{"steps": []any{obj{"text": longAnswer("the second plan"), "chunks": 60, "delay_ms": 50}, execCall("call_two", "Second", "echo two")}},
		obj{"steps": []any{obj{"text": "Ran that too."}}},
	}})
	sid := s.session(t, "", client.CreateSession{ApprovalMode: omni.ApproveAlwaysAsk})
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.send("Plan, then run one.")
	one := cardSel("call_one")
	tb.has("the approval", one+` .approval button`)
	tb.until("the Allow button in view", inView(one+` .approval button`))
	if !eval[bool](tb, `document.getElementById('approval-bar').hidden`) {
		t.Fatal("the approval bar is shown although the approval is in view")
	}
	tb.click(one, "Allow")
	tb.until("idle", `document.getElementById('s-state').textContent === 'idle'`)

	tb.send("Plan again, then run another.")
	tb.until("the second plan streaming", `[...document.querySelectorAll('#transcript li[data-kind=text][data-streaming=true]')].some((li) => li.innerText.includes('second plan'))`)
	eval[bool](tb, `(document.getElementById('transcript').scrollTop = 0) === 0`)
	two := cardSel("call_two")
	tb.has("the second approval", two+` .approval button`)
	tb.until("the approval bar", `!document.getElementById('approval-bar').hidden`)
	if eval[bool](tb, inView(two+` .approval button`)) {
		t.Fatal("the view moved although the person scrolled up")
	}
	if got := eval[string](tb, `document.getElementById('approval-bar-text').textContent`); !strings.Contains(got, "exec_command") || !strings.Contains(got, "echo two") {
		t.Fatalf("the bar says %q, want the tool and its command", got)
	}
	tb.click("#approval-bar", "Show")
	tb.until("the Allow button in view", inView(two+` .approval button`))
	tb.until("the bar gone", `document.getElementById('approval-bar').hidden`)
	tb.click(two, "Allow")
	tb.has("the second tool done", two+`[data-status=done]`)
	tb.until("idle", `document.getElementById('s-state').textContent === 'idle'`)
}

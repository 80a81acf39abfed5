package webe2e

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"floe.dev/services/gateway/client"
)

// The header's Fork opens a new Session with the history so far, whose
// header links back to the Session it was forked from.
func TestForkFromTheHeader(t *testing.T) {
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{obj{"text": "Answer one."}}},
	}})
	sid := s.session(t, "", client.CreateSession{})
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.until("no forked-from link on a Session that is not a fork", `document.getElementById('s-forked').hidden`)
	tb.send("Say answer one.")
	tb.until("idle after the answer", `document.getElementById('s-state').textContent === 'idle' && document.querySelector('#transcript li[data-kind=text]')`)
	tb.click(".session-title", "Fork")
	tb.until("the fork opened", `location.hash.startsWith('#/s/') && !location.hash.endsWith('`+sid+`') && document.getElementById('transcript').dataset.ready === 'true'`)
	tb.until("the forked-from link", `(() => { const a = document.querySelector('#s-forked a'); return a && a.textContent === '`+sid+`' && a.getAttribute('href') === '#/s/`+sid+`'; })()`)
	tb.until("the fork's history", `document.querySelectorAll('#transcript li[data-kind=text]').length === 1`)
	if k := kinds(tb.transcript()); !slices.Equal(k, []string{"user", "text"}) {
		t.Fatalf("the fork's transcript %v", k)
	}
	list, err := s.api("").ListSessions(ctxT(t))
	if err != nil || len(list) != 2 {
		t.Fatalf("sessions after the fork: %d, %v", len(list), err)
	}
}

// "Fork from here" on a message in the middle of the history (loaded from
// /messages after a reload, so the cut is the message's position) opens a
// fork whose transcript ends with that message; on a message that came in
// live (its cut is its SSE id) it does the same.
func TestForkFromHereOnAMidHistoryMessage(t *testing.T) {
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{obj{"text": "Answer one."}}},
		obj{"steps": []any{obj{"text": "Answer two."}}},
		obj{"steps": []any{obj{"text": "Answer three."}}},
	}})
	sid := s.session(t, "", client.CreateSession{})
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	for i, p := range []string{"one", "two", "three"} {
		tb.send("Say answer " + p + ".")
		tb.until("answer "+p, fmt.Sprintf(`document.getElementById('s-state').textContent === 'idle' && document.querySelectorAll('#transcript li[data-kind=text]').length === %d`, i+1))
	}
	forkAt := func(answer string) string {
		t.Helper()
		mark := fmt.Sprintf(`(() => { const li = [...document.querySelectorAll('#transcript > li[data-kind=text]')].find((e) => e.textContent.includes(%q));
			if (!li || !li.querySelector(':scope > .fork-here')) return false; li.dataset.target = 'fork'; return true; })()`, answer)
		tb.until("the message "+answer+" with its fork action", mark)
		from := eval[string](tb, `location.hash`)
		tb.do(chromedp.Click(`#transcript > li[data-target=fork] > .fork-here`))
		tb.until("the fork opened", `location.hash.startsWith('#/s/') && location.hash !== `+strconv.Quote(from)+` && document.getElementById('transcript').dataset.ready === 'true'`)
		return strings.TrimPrefix(eval[string](tb, `location.hash`), "#/s/")
	}
	// From the live transcript: the cut is the message's SSE id.
	live := forkAt("Answer three.")
	tb.until("the live fork's history", `document.querySelectorAll('#transcript li[data-kind=text]').length === 3`)
	// From the history after a reload: the cut is its /messages position.
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true' && document.querySelectorAll('#transcript li[data-kind=text]').length === 3`)
	fork := forkAt("Answer two.")
	tb.until("the fork's history", `document.querySelectorAll('#transcript li[data-kind=text]').length === 2`)
	items := tb.transcript()
	if k := kinds(items); !slices.Equal(k, []string{"user", "text", "user", "text"}) || !strings.Contains(items[3].Text, "Answer two.") {
		t.Fatalf("the fork's transcript %+v, want it to end with Answer two.", items)
	}
	tb.until("the forked-from link", `(() => { const a = document.querySelector('#s-forked a'); return a && a.textContent === '`+sid+`' && /after record \d+/.test(document.getElementById('s-forked').textContent); })()`)
	api := s.api("")
	for _, id := range []string{live, fork} {
		f, err := api.GetSession(ctxT(t), id)
		if err != nil || f.ForkedFrom == nil || f.ForkedFrom.SessionID != sid {
			t.Fatalf("fork %s: %+v, %v", id, f, err)
		}
	}
	// The parent is unchanged: its three Tasks.
	h, err := api.Messages(ctxT(t), sid)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range h.Messages {
		n += strings.Count(string(m), `"Answer `)
	}
	if n != 3 {
		t.Errorf("the parent holds %d answers after its forks, want 3", n)
	}
}

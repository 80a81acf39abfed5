package webe2e

import (
	"slices"
	"testing"

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

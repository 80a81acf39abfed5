package webe2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

const markdownAnswer = "Here is **bold** and `code`.\n\n<img src=x onerror=\"window.pwned=1\"> <script>window.pwned=2</script> [link](javascript:window.pwned=3)\n\n- one\n- two"

// A prompt typed into the composer streams its answer into the transcript:
// thinking (collapsible), then the Markdown text, rendered and sanitized;
// the Session is made with the New session form and the list follows its
// state through /api/events.
func TestPromptStreamsAnswer(t *testing.T) {
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{
			obj{"thinking": "Let me think about it.", "chunks": 3},
			obj{"text": markdownAnswer, "chunks": 30, "delay_ms": 40},
		}},
	}, "after_last": "repeat_last"})
	// Two older Sessions for the list.
	s.session(t, "", client.CreateSession{Title: "Refactor the tracer"})
	s.session(t, "", client.CreateSession{Title: "Why is CI slow?"})

	tb := newTab(t)
	tb.open(s.url(), "")
	tb.until("the session list", `document.querySelectorAll('#sessions li').length === 2`)
	tb.click("", "New session")
	tb.until("the new-session form", `!document.getElementById('new-form').hidden`)
	tb.click("#new-form", "Create")
	tb.until("the new Session's view", `location.hash.startsWith('#/s/session-') && !document.getElementById('session-view').hidden`)
	sid := eval[string](tb, `decodeURIComponent(location.hash.slice(4))`)
	tb.until("the new Session in the list", fmt.Sprintf(`document.querySelector('#sessions li[data-session-id=%q]')`, sid))
	tb.until("the empty transcript ready", `document.getElementById('transcript').dataset.ready === 'true'`)

	tb.send("Show me some **Markdown**")
	tb.until("the answer streaming", `document.querySelector('#transcript li[data-kind=text][data-streaming=true]')`)
	tb.until("the list to say running", fmt.Sprintf(`document.querySelector('#sessions li[data-session-id=%q]').dataset.state === 'running'`, sid))
	tb.until("the answer complete", `document.querySelector('#transcript li[data-kind=text]:not([data-streaming])')`)
	tb.until("the list to say idle", fmt.Sprintf(`document.querySelector('#sessions li[data-session-id=%q]').dataset.state === 'idle'`, sid))
	tb.until("the Session idle", `document.getElementById('s-state').textContent === 'idle'`)

	items := tb.transcript()
	if got := kinds(items); !slices.Equal(got, []string{"user", "thinking", "text"}) {
		t.Fatalf("transcript kinds %v, want user, thinking, text", got)
	}
	if !strings.Contains(items[0].Text, "Show me some **Markdown**") {
		t.Fatalf("user item %q", items[0].Text)
	}
	// Markdown rendered; HTML from the model shown as text, never run.
	if got := eval[string](tb, `document.querySelector('#transcript li[data-kind=text] strong').textContent`); got != "bold" {
		t.Fatalf("<strong> = %q", got)
	}
	if n := eval[int](tb, `document.querySelectorAll('#transcript li[data-kind=text] li').length`); n != 2 {
		t.Fatalf("list items = %d, want 2", n)
	}
	if !strings.Contains(items[2].Text, `<img src=x onerror="window.pwned=1">`) || !strings.Contains(items[2].Text, "<script>") {
		t.Fatalf("the raw HTML is not shown as text: %q", items[2].Text)
	}
	if eval[bool](tb, `window.pwned !== undefined || !!document.querySelector('#transcript img, #transcript script, #transcript a[href^="javascript"]')`) {
		t.Fatal("model HTML became live elements")
	}
	if !eval[bool](tb, `document.querySelector('#transcript li[data-kind=thinking] details summary') !== null`) {
		t.Fatal("thinking is not collapsible")
	}
	if !strings.Contains(eval[string](tb, `document.getElementById('s-usage').textContent`), "tokens:") {
		t.Fatal("no token usage shown")
	}
	tb.until("the Trace download link", fmt.Sprintf(`document.querySelector('#s-traces a[href="/api/sessions/%s/traces/1"][download]')`, sid))
	noDuplicates(t, items)

	// Rename through the list; the title comes back through /api/events.
	tb.click(fmt.Sprintf(`#sessions li[data-session-id=%q]`, sid), "Rename")
	tb.do(setValue(`#sessions form.rename input`, "Markdown demo"))
	tb.click(`#sessions form.rename`, "Save")
	tb.until("the new title", fmt.Sprintf(`document.querySelector('#sessions li[data-session-id=%q] .title').textContent === 'Markdown demo'`, sid))
	if got, _ := s.api("").GetSession(ctxT(t), sid); got.Title != "Markdown demo" {
		t.Fatalf("title on the server %q", got.Title)
	}
	tb.screenshot("webapp-session-list.png")

	// Delete (two clicks) removes it from the list.
	other := s.session(t, "", client.CreateSession{Title: "Scratch"})
	tb.until("the other Session listed", fmt.Sprintf(`document.querySelector('#sessions li[data-session-id=%q]')`, other))
	tb.click(fmt.Sprintf(`#sessions li[data-session-id=%q]`, other), "Delete")
	tb.click(fmt.Sprintf(`#sessions li[data-session-id=%q]`, other), "Confirm delete")
	tb.until("the Session gone from the list", fmt.Sprintf(`!document.querySelector('#sessions li[data-session-id=%q]')`, other))
	if _, err := s.api("").GetSession(ctxT(t), other); err == nil {
		t.Fatal("the deleted Session still exists")
	}
	_ = omni.StateIdle
}

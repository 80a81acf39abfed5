package webe2e

import (
	"testing"

	"github.com/chromedp/chromedp"
)

// With a token configured the app asks for it: a wrong token is refused,
// the right one signs in with an HttpOnly cookie (not readable by the
// page) that survives a reload and carries writes; Sign out ends it.
func TestSignInRequiredWithTokens(t *testing.T) {
	const token = "tok-web-1"
	s := newServer(t, nil, "FLOE_API_TOKEN="+token)
	tb := newTab(t)
	tb.open(s.url(), "")
	tb.until("the sign-in form", `!document.getElementById('signin-view').hidden && document.getElementById('app-view').hidden`)
	if st := eval[int](tb, `fetch('/api/sessions').then((r) => r.status)`); st != 0 && st != 401 {
		t.Fatalf("GET /api/sessions without the cookie = %d", st)
	}
	tb.do(chromedp.SendKeys(`#token`, "wrong-token"))
	tb.click("#signin", "Sign in")
	tb.until("the refusal", `document.getElementById('signin-error').textContent === 'Wrong token.'`)
	if !eval[bool](tb, `document.getElementById('app-view').hidden`) {
		t.Fatal("a wrong token opened the app")
	}
	tb.do(setValue(`#token`, token))
	tb.click("#signin", "Sign in")
	tb.until("the app", `!document.getElementById('app-view').hidden && document.getElementById('signin-view').hidden`)
	if eval[bool](tb, `document.cookie.includes('floe_session')`) {
		t.Fatal("the sign-in cookie is readable by the page")
	}
	tb.until("Sign out offered", `!document.getElementById('signout').hidden`)
	tb.reload()
	tb.until("still signed in after a reload", `!document.getElementById('app-view').hidden`)
	// A write with the cookie (same origin): create a Session.
	tb.click("", "New session")
	tb.click("#new-form", "Create")
	tb.until("the new Session", `location.hash.startsWith('#/s/session-') && document.querySelectorAll('#sessions li').length === 1`)
	tb.click("", "Sign out")
	tb.until("the sign-in form again", `!document.getElementById('signin-view').hidden`)
	tb.until("the API closed again", `fetch('/api/sessions').then((r) => r.status === 401)`)
}

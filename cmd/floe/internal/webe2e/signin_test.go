package webe2e

import (
	"testing"
)

// With a token configured the app asks for it: a wrong token is refused,
// the right one signs in with an HttpOnly cookie (not readable by the
// page) that survives a reload and carries writes; Sign out ends it.
func TestSignInRequiredWithTokens(t *testing.T) {
	const token = "tok-web-1"
	s := newServer(t, nil, "FLOE_API_TOKEN=alice:"+token+",bob:tok-web-2")
	tb := newTab(t)
	tb.open(s.url(), "")
	tb.until("the sign-in form", `!document.getElementById('signin-view').hidden && document.getElementById('app-view').hidden`)
	if st := eval[int](tb, `fetch('/api/sessions').then((r) => r.status)`); st != 0 && st != 401 {
		t.Fatalf("GET /api/sessions without the cookie = %d", st)
	}
	for _, wrong := range []string{"wrong-token", "alice:" + token} { // the entry is not the token
		tb.do(setValue(`#token`, wrong))
		eval[bool](tb, `(document.getElementById('signin-error').textContent = '') === ''`)
		tb.click("#signin", "Sign in")
		tb.until("the refusal of "+wrong, `document.getElementById('signin-error').textContent === 'Wrong token.'`)
		if !eval[bool](tb, `document.getElementById('app-view').hidden`) {
			t.Fatalf("the wrong token %q opened the app", wrong)
		}
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
	// It is alice's: the cookie carries her token's principal.
	if l, err := s.api(token).ListSessions(ctxT(t)); err != nil || len(l) != 1 {
		t.Fatalf("alice's sessions %v, %v", l, err)
	}
	if l, err := s.api("tok-web-2").ListSessions(ctxT(t)); err != nil || len(l) != 0 {
		t.Fatalf("bob sees %v, %v", l, err)
	}
	tb.click("", "Sign out")
	tb.until("the sign-in form again", `!document.getElementById('signin-view').hidden`)
	tb.until("the API closed again", `fetch('/api/sessions').then((r) => r.status === 401)`)
}

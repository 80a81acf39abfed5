package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

// The app is served from the binary at / and /app/… with a strict CSP,
// open (it shows the sign-in form itself); unknown files are 404.
func TestWebAppServedWithStrictCSP(t *testing.T) {
	g := startGateway(t, newBus(t), "", nil)
	for _, tc := range []struct{ path, ctype, contains string }{
		{"/", "text/html", `<script type="module" src="/app/main.js"></script>`},
		{"/app/main.js", "text/javascript", "import { SessionFeed } from './viewmodel.js'"},
		{"/app/viewmodel.js", "text/javascript", "export class SessionFeed"},
		{"/app/style.css", "text/css", "--accent"},
	} {
		resp, err := http.Get(g.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), tc.ctype) || !strings.Contains(string(body), tc.contains) {
			t.Fatalf("GET %s = %d %q, body has %q: %v", tc.path, resp.StatusCode, resp.Header.Get("Content-Type"), tc.contains, strings.Contains(string(body), tc.contains))
		}
		csp := resp.Header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
			t.Fatalf("GET %s CSP = %q", tc.path, csp)
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("GET %s without nosniff", tc.path)
		}
		// Revalidation by ETag.
		req, _ := http.NewRequest("GET", g.URL+tc.path, nil)
		req.Header.Set("If-None-Match", resp.Header.Get("ETag"))
		r2, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r2.Body.Close()
		if r2.StatusCode != http.StatusNotModified {
			t.Fatalf("GET %s with its ETag = %d, want 304", tc.path, r2.StatusCode)
		}
	}
	for _, p := range []string{"/app/nope.js", "/app/../embed.go", "/app/", "/nope"} {
		resp, err := http.Get(g.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("GET %s = %d, want 404", p, resp.StatusCode)
		}
	}
	// No inline script anywhere in the page.
	resp, _ := http.Get(g.URL + "/")
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Count(string(page), "<script") != 1 || strings.Contains(string(page), " on") && strings.Contains(string(page), "onclick") {
		t.Fatalf("index.html has inline scripts:\n%s", page)
	}
}

func postJSON(t *testing.T, c *http.Client, url, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// POST /api/login checks the token and sets an HttpOnly, SameSite=Strict
// cookie; the cookie then authenticates reads, and writes from the same
// origin only; a wrong token is refused; logout clears the cookie.
func TestCookieSignIn(t *testing.T) {
	g := startGateway(t, newBus(t), "", nil)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: 10 * time.Second}

	get := func(path string) int {
		resp, err := c.Get(g.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := get("/api/sessions"); st != http.StatusUnauthorized {
		t.Fatalf("GET /api/sessions before sign-in = %d, want 401", st)
	}
	if r := postJSON(t, c, g.URL+"/api/login", `{"token":"wrong"}`, nil); r.StatusCode != http.StatusUnauthorized || len(r.Cookies()) != 0 {
		t.Fatalf("login with a wrong token = %d, cookies %v", r.StatusCode, r.Cookies())
	}
	if r := postJSON(t, c, g.URL+"/api/login", `{"token":""}`, nil); r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("login with an empty token = %d", r.StatusCode)
	}
	if r := postJSON(t, c, g.URL+"/api/login", "token=tok-alice", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}); r.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("form login = %d, want 415", r.StatusCode)
	}
	r := postJSON(t, c, g.URL+"/api/login", `{"token":"`+aliceToken+`"}`, nil)
	if r.StatusCode != http.StatusNoContent {
		t.Fatalf("login = %d", r.StatusCode)
	}
	var ck *http.Cookie
	for _, x := range r.Cookies() {
		if x.Name == "floe_session" {
			ck = x
		}
	}
	if ck == nil || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || strings.Contains(ck.Value, aliceToken) {
		t.Fatalf("sign-in cookie = %+v, want HttpOnly, SameSite=Strict, Path=/, token not in clear", ck)
	}
	if st := get("/api/sessions"); st != http.StatusOK {
		t.Fatalf("GET /api/sessions with the cookie = %d", st)
	}
	// Writes with the cookie: same origin only.
	if r := postJSON(t, c, g.URL+"/api/sessions", `{}`, nil); r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("cookie write without Origin = %d, want 401", r.StatusCode)
	}
	if r := postJSON(t, c, g.URL+"/api/sessions", `{}`, map[string]string{"Origin": "http://evil.example"}); r.StatusCode != http.StatusForbidden {
		t.Fatalf("cookie write from another origin = %d, want 403", r.StatusCode)
	}
	if r := postJSON(t, c, g.URL+"/api/sessions", `{}`, map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": g.URL}); r.StatusCode != http.StatusForbidden {
		t.Fatalf("cookie write with Sec-Fetch-Site cross-site = %d, want 403", r.StatusCode)
	}
	if r := postJSON(t, c, g.URL+"/api/sessions", `{}`, map[string]string{"Origin": g.URL}); r.StatusCode != http.StatusCreated {
		t.Fatalf("cookie write from the same origin = %d, want 201", r.StatusCode)
	}
	if r := postJSON(t, c, g.URL+"/api/sessions", `{}`, map[string]string{"Sec-Fetch-Site": "same-origin"}); r.StatusCode != http.StatusCreated {
		t.Fatalf("cookie write with Sec-Fetch-Site same-origin = %d, want 201", r.StatusCode)
	}
	// The cookie's principal is the token's: alice sees her two Sessions, bob none.
	list, err := g.Alice.ListSessions(ctxT(t))
	if err != nil || len(list) != 2 {
		t.Fatalf("alice's sessions = %v, %v; want the two made with her cookie", list, err)
	}
	if l, _ := g.Bob.ListSessions(ctxT(t)); len(l) != 0 {
		t.Fatalf("bob sees %d sessions", len(l))
	}
	// A forged cookie is refused.
	fc := &http.Client{Timeout: 5 * time.Second}
	req, _ := http.NewRequest("GET", g.URL+"/api/sessions", nil)
	req.AddCookie(&http.Cookie{Name: "floe_session", Value: "bm90LWEtdG9rZW4"})
	resp, err := fc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("forged cookie = %d", resp.StatusCode)
	}
	// Logout clears it.
	if r := postJSON(t, c, g.URL+"/api/logout", ``, map[string]string{"Origin": g.URL}); r.StatusCode != http.StatusNoContent {
		t.Fatalf("logout = %d", r.StatusCode)
	}
	if st := get("/api/sessions"); st != http.StatusUnauthorized {
		t.Fatalf("GET /api/sessions after logout = %d, want 401", st)
	}
}

// Without tokens (loopback) no sign-in is needed: login answers 204 and
// sets no cookie.
func TestLoginWithoutTokens(t *testing.T) {
	g := startGateway(t, newBus(t), "", func(c *gateway.Config) { c.Tokens = nil })
	r := postJSON(t, http.DefaultClient, g.URL+"/api/login", `{"token":""}`, nil)
	if r.StatusCode != http.StatusNoContent || len(r.Cookies()) != 0 {
		t.Fatalf("login without tokens = %d, cookies %v", r.StatusCode, r.Cookies())
	}
}

type listEv struct {
	Type             string          `json:"type"`
	ID               string          `json:"id"`
	Session          *client.Session `json:"session"`
	State            string          `json:"state"`
	Status           string          `json:"status"`
	Title            *string         `json:"title"`
	PendingApprovals *int            `json:"pendingApprovals"`
}

// eventsReader reads /api/events.
type eventsReader struct {
	t  *testing.T
	ch chan listEv
}

func openEvents(t *testing.T, url, token string) *eventsReader {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/api/events", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		cancel()
		t.Fatalf("GET /api/events = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	er := &eventsReader{t: t, ch: make(chan listEv, 256)}
	go func() {
		defer close(er.ch)
		sc := bufio.NewScanner(resp.Body)
		event := ""
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				var ev listEv
				if event == "server_event" && json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev) == nil {
					er.ch <- ev
				}
			case line == "":
				event = ""
			}
		}
	}()
	t.Cleanup(func() { cancel(); resp.Body.Close() })
	return er
}

func (er *eventsReader) next(what string) listEv {
	er.t.Helper()
	select {
	case ev, ok := <-er.ch:
		if !ok {
			er.t.Fatalf("events closed waiting for %s", what)
		}
		return ev
	case <-time.After(waitLimit):
		er.t.Fatalf("no event for %s", what)
	}
	return listEv{}
}

// until skips events until pred holds.
func (er *eventsReader) until(what string, pred func(listEv) bool) listEv {
	er.t.Helper()
	for {
		if ev := er.next(what); pred(ev) {
			return ev
		}
	}
}

// GET /api/events: a snapshot of the caller's Sessions, then created,
// state (with pending approvals), title and deleted events — only for the
// caller's own Sessions.
func TestEventsKeepSessionListLive(t *testing.T) {
	env := newBus(t)
	g := startGateway(t, env, "", nil)
	startTracer(t, env, g.Home) // deletes (and purges) a Session
	startEngine(t, env, func(e *fakeEngine) { e.Tool = true })
	old := createSession(t, g.Alice, client.CreateSession{Title: "old"})
	createSession(t, g.Bob, client.CreateSession{Title: "bob's"})

	ev := openEvents(t, g.URL, aliceToken)
	first := ev.next("the snapshot")
	if first.Type != "session_created" || first.Session == nil || first.Session.ID != old.ID || first.Session.Title != "old" || first.PendingApprovals == nil || *first.PendingApprovals != 0 {
		t.Fatalf("snapshot starts with %+v, want alice's session", first)
	}
	if e := ev.next("the end of the snapshot"); e.Type != "sessions_synced" {
		t.Fatalf("after alice's one session came %+v, want sessions_synced (bob's is not hers)", e)
	}
	bobs := openEvents(t, g.URL, bobToken)
	bobs.until("bob's snapshot", func(e listEv) bool { return e.Type == "sessions_synced" })

	s := createSession(t, g.Alice, client.CreateSession{})
	if e := ev.next("session_created"); e.Type != "session_created" || e.ID != s.ID || e.Session.State != omni.StateIdle {
		t.Fatalf("got %+v, want session_created of %s", e, s.ID)
	}
	title := "renamed"
	if _, err := g.Alice.PatchSession(ctxT(t), s.ID, client.SessionPatch{Title: &title}); err != nil {
		t.Fatal(err)
	}
	if e := ev.next("session_title"); e.Type != "session_title" || e.ID != s.ID || e.Title == nil || *e.Title != title {
		t.Fatalf("got %+v, want session_title", e)
	}
	submit(t, g.Alice, s.ID, "hello")
	if e := ev.until("running", func(e listEv) bool { return e.Type == "session_state" && e.ID == s.ID }); e.State != omni.StateRunning {
		t.Fatalf("got %+v, want running", e)
	}
	if e := ev.until("idle", func(e listEv) bool { return e.Type == "session_state" && e.ID == s.ID && e.State == omni.StateIdle }); e.Status != omni.StatusCompleted {
		t.Fatalf("got %+v, want idle completed", e)
	}
	if err := g.Alice.DeleteSession(ctxT(t), s.ID); err != nil {
		t.Fatal(err)
	}
	if e := ev.until("deleted", func(e listEv) bool { return e.Type == "session_deleted" }); e.ID != s.ID {
		t.Fatalf("got %+v", e)
	}
	// Waiting for approval: the pending count rises with the request and
	// falls with the decision; a client connecting meanwhile gets it in
	// its snapshot (asked from the engine).
	a := createSession(t, g.Alice, client.CreateSession{ApprovalMode: omni.ApproveAlwaysAsk})
	ev.until("created", func(e listEv) bool { return e.Type == "session_created" && e.ID == a.ID })
	submit(t, g.Alice, a.ID, "hello")
	ev.until("waiting for approval", func(e listEv) bool {
		return e.Type == "session_state" && e.ID == a.ID && e.State == omni.StateRunning && *e.PendingApprovals == 1
	})
	late := openEvents(t, g.URL, aliceToken)
	snap := late.until("the snapshot of "+a.ID, func(e listEv) bool { return e.Type == "session_created" && e.ID == a.ID })
	if snap.Session.State != omni.StateRunning || *snap.PendingApprovals != 1 {
		t.Fatalf("late snapshot %+v, want running with one pending approval", snap)
	}
	if err := g.Alice.Approve(ctxT(t), a.ID, "call-1", omni.DecisionAllow); err != nil {
		t.Fatal(err)
	}
	// The decision (a stream message) and the record going idle (a record
	// change) reach the hub by two independent feeds: when the record comes
	// first, the idle state event is the one that clears the count.
	decided := ev.until("approval decided", func(e listEv) bool {
		return e.Type == "session_state" && e.ID == a.ID && *e.PendingApprovals == 0
	})
	if decided.State != omni.StateIdle {
		ev.until("idle", func(e listEv) bool { return e.Type == "session_state" && e.ID == a.ID && e.State == omni.StateIdle })
	}

	// Bob heard nothing of alice's Sessions.
	select {
	case e := <-bobs.ch:
		t.Fatalf("bob got %+v", e)
	case <-time.After(200 * time.Millisecond):
	}
}

// An untitled Session takes the title of its first Task's text at once
// (session_title on /api/events); a second Task does not change it, and a
// person's title is never replaced.
func TestFirstPromptTitlesSession(t *testing.T) {
	env := newBus(t)
	g := startGateway(t, env, "", nil)
	startEngine(t, env, nil)
	s := createSession(t, g.Alice, client.CreateSession{})
	ev := openEvents(t, g.URL, aliceToken)
	ev.until("the snapshot", func(e listEv) bool { return e.Type == "sessions_synced" })

	submit(t, g.Alice, s.ID, "\n  Why is   the CI slow on main?\nIt takes 20 minutes.")
	want := "Why is the CI slow on main?"
	if e := ev.until("session_title", func(e listEv) bool { return e.Type == "session_title" && e.ID == s.ID }); e.Title == nil || *e.Title != want {
		t.Fatalf("got %+v, want the title %q", e, want)
	}
	if got, err := g.Alice.GetSession(ctxT(t), s.ID); err != nil || got.Title != want {
		t.Fatalf("GET title %q (%v), want %q", got.Title, err, want)
	}
	waitIdle(t, env, s.ID)
	submit(t, g.Alice, s.ID, "Another question")
	waitIdle(t, env, s.ID)
	if got, _ := g.Alice.GetSession(ctxT(t), s.ID); got.Title != want {
		t.Fatalf("the second Task changed the title to %q", got.Title)
	}

	titled := createSession(t, g.Alice, client.CreateSession{Title: "Mine"})
	submit(t, g.Alice, titled.ID, "Something else entirely")
	waitIdle(t, env, titled.ID)
	if got, _ := g.Alice.GetSession(ctxT(t), titled.ID); got.Title != "Mine" {
		t.Fatalf("a given title became %q", got.Title)
	}
}

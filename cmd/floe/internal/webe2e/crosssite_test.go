package webe2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"

	"floe.dev/services/gateway/client"
)

// attackerPage is a page of another site that tries every write a page
// can send to the gateway without a CORS preflight, then says it is done.
const attackerPage = `<!doctype html><title>attacker</title><script>
const target = %q, sid = %q;
const tries = [
  fetch(target + '/api/sessions', {method: 'POST', mode: 'no-cors'}),
  fetch(target + '/api/sessions', {method: 'POST', mode: 'no-cors', headers: {'Content-Type': 'text/plain'}, body: '{}'}),
  fetch(target + '/api/sessions/' + sid + '/abort', {method: 'POST', mode: 'no-cors'}),
  fetch(target + '/api/sessions/' + sid + '/compact', {method: 'POST', mode: 'no-cors'}),
  fetch(target + '/api/sessions/' + sid + '/tasks', {method: 'POST', mode: 'no-cors', headers: {'Content-Type': 'text/plain'},
    body: JSON.stringify({input: [{type: 'text', text: 'run exec_command'}]})}),
];
Promise.allSettled(tries).then(() => { document.title = 'done'; });
</script>`

// A real browser on another site sends the POSTs a page can send without
// a preflight (no body, or a text/plain one) to a token-less floe serve:
// none creates a Session, starts a Task, aborts or compacts.
func TestCrossSitePageCannotWrite(t *testing.T) {
	s := newServer(t, nil)
	c := s.api("")
	sid := s.session(t, "", client.CreateSession{})
	att := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, attackerPage, s.url(), sid)
	}))
	t.Cleanup(att.Close)
	_, port, _ := net.SplitHostPort(att.Listener.Addr().String())
	tb := newTab(t)
	// localhost is another site than 127.0.0.1: the fetches are cross-site.
	tb.do(chromedp.Navigate("http://localhost:" + port + "/"))
	tb.until("the attacker's fetches settled", `document.title === 'done'`)
	l, err := c.ListSessions(ctxT(t))
	if err != nil || len(l) != 1 || l[0].ID != sid {
		t.Fatalf("after the cross-site page the sessions are %+v, %v; want only %s", l, err, sid)
	}
	msgs, err := c.Messages(ctxT(t), sid)
	if err != nil || len(msgs.Messages) != 0 || msgs.Live != nil {
		t.Fatalf("the cross-site page started a Task: %+v, %v", msgs, err)
	}
}

// DNS rebinding: a page on a name that re-resolves to 127.0.0.1 (here by
// the browser's resolver rules) is same-origin with itself, so the browser
// lets it read and write; the gateway refuses its Host.
func TestRebindingHostIsRefusedInBrowser(t *testing.T) {
	s := newServer(t, nil)
	_, port, _ := net.SplitHostPort(s.httpAddr)
	actx, acancel := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(filepath.Join(t.TempDir(), "profile")),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("host-resolver-rules", "MAP rebind.attacker.test 127.0.0.1"),
	)
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(bcancel)
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	tb := &tab{t: t, ctx: bctx}
	tb.do(chromedp.Navigate("http://rebind.attacker.test:" + port + "/"))
	tb.until("the page loaded", `document.readyState === 'complete'`)
	got := eval[string](tb, `Promise.all([
	  fetch('/api/sessions').then((r) => r.status),
	  fetch('/api/sessions', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: '{}'}).then((r) => r.status),
	  fetch('/api/sessions', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: '{}'}).then((r) => r.json()).then((b) => b.error.code),
	]).then((a) => a.join(' '))`)
	if got != "403 403 forbidden" {
		t.Fatalf("the rebinding page got %q, want 403 403 forbidden", got)
	}
	if l, err := s.api("").ListSessions(ctxT(t)); err != nil || len(l) != 0 {
		t.Fatalf("the rebinding page created %+v, %v", l, err)
	}
	// The same browser on the loopback name is served.
	ctx, cancel := context.WithTimeout(bctx, waitLimit)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(s.url()+"/")); err != nil {
		t.Fatal(err)
	}
	tb.until("the app on 127.0.0.1", `fetch('/api/sessions', {method: 'POST', headers: {'Content-Type': 'application/json'}, body: '{}'}).then((r) => r.status === 201)`)
}

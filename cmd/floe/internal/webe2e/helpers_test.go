package webe2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"floe.dev/cmd/floe/internal/proctest"
	"floe.dev/services/gateway/client"
)

// waitLimit bounds every wait of a test step: generous, since the machine
// is shared, and never an assertion about speed.
const waitLimit = 45 * time.Second

type obj = map[string]any

// server is a `floe serve` home: its process can be stopped and started
// again on the same addresses.
type server struct {
	t        *testing.T
	dir      string
	httpAddr string
	env      []string
	cmd      *exec.Cmd
	errs     *proctest.Buffer
	done     chan struct{}
}

// newServer writes the scripted model's script and starts `floe serve`
// with it; extra are more environment variables (they win).
func newServer(t *testing.T, script obj, extra ...string) *server {
	t.Helper()
	dir := t.TempDir()
	model := "scripted:demo"
	if script != nil {
		file := filepath.Join(dir, "script.json")
		b, _ := json.Marshal(script)
		if err := os.WriteFile(file, b, 0o644); err != nil {
			t.Fatal(err)
		}
		model = "scripted:" + file
	}
	s := &server{t: t, dir: dir, httpAddr: proctest.FreeAddr(t)}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "FLOE_") || strings.HasPrefix(k, "OPENAI_") || strings.HasPrefix(k, "ANTHROPIC_") || k == "HOME" {
			continue
		}
		s.env = append(s.env, kv)
	}
	s.env = append(s.env, "HOME="+dir, "FLOE_HOME="+filepath.Join(dir, "floe"), "FLOE_HTTP_ADDR="+s.httpAddr,
		"FLOE_NATS_LISTEN=off", "FLOE_MODEL="+model, "FLOE_RETRY_BASE_MS=20", "FLOE_RETRY_CAP_MS=100")
	s.env = append(s.env, extra...)
	s.start()
	return s
}

func (s *server) url() string  { return "http://" + s.httpAddr }
func (s *server) home() string { return filepath.Join(s.dir, "floe") }

func (s *server) start() {
	s.t.Helper()
	s.errs = &proctest.Buffer{}
	s.done = make(chan struct{})
	s.cmd = exec.Command(floeBin, "serve")
	s.cmd.Env = s.env
	s.cmd.Dir = s.dir
	s.cmd.Stderr = s.errs
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	done, cmd := s.done, s.cmd
	go func() {
		cmd.Wait()
		close(done)
	}()
	s.t.Cleanup(func() { s.kill(cmd, done) })
	c := client.New(s.url(), client.WithHTTPClient(&http.Client{Timeout: 2 * time.Second}))
	deadline := time.Now().Add(waitLimit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := c.Health(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-done:
			s.t.Fatalf("floe serve exited: %s", s.errs.String())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("floe serve not healthy after %v: %v\n%s", waitLimit, err, s.errs.String())
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// stop ends the process with SIGTERM and waits for it.
func (s *server) stop() {
	s.t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(waitLimit):
		s.t.Fatalf("floe serve did not stop\n%s", s.errs.String())
	}
}

func (s *server) kill(cmd *exec.Cmd, done chan struct{}) {
	select {
	case <-done:
		return
	default:
	}
	cmd.Process.Kill()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	if s.t.Failed() {
		s.t.Logf("floe serve stderr:\n%s", s.errs.String())
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

// api is a Go client of the server (the token, when set).
func (s *server) api(token string) *client.Client {
	if token != "" {
		return client.New(s.url(), client.WithToken(token))
	}
	return client.New(s.url())
}

// runnerUp waits until a tool runner answers for Session sid (GET shows
// its sandbox). The engine publishes a Task's prompt only once it has the
// runner's tool list, and a fresh server's runner may take a while to
// start under load (it probes its sandbox first): a test timing what
// follows a key press waits for it first. Bounded by two minutes.
func (s *server) runnerUp(t *testing.T, sid string) {
	t.Helper()
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		got, err := s.api("").GetSession(ctx, sid)
		cancel()
		if err == nil && got.Sandbox != nil {
			t.Logf("a tool runner answered after %v", time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(start) > 2*time.Minute {
			t.Fatalf("no tool runner answered within 2 min (last: %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *server) session(t *testing.T, token string, req client.CreateSession) string {
	t.Helper()
	if req.Workspace == "" {
		req.Workspace = s.dir
	}
	sess, err := s.api(token).CreateSession(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	return sess.ID
}

// tab is one browser tab of a test.
type tab struct {
	t   *testing.T
	ctx context.Context
}

// newTab opens a tab in its own browser context (cookies, storage), so
// tests never share a sign-in.
func newTab(t *testing.T) *tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	// The first run opens the tab and must not carry a timeout: the tab
	// lives as long as that run's context.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1200, 760)); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	return &tab{t: t, ctx: ctx}
}

// do runs actions, bounded by waitLimit.
func (tb *tab) do(actions ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, waitLimit)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		tb.t.Fatalf("browser: %v\npage:\n%s", err, tb.dump())
	}
}

// eval evaluates a JavaScript expression into T.
func eval[T any](tb *tab, js string) T {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, waitLimit)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		tb.t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// until polls a JavaScript condition (every 25 ms) until it is true.
func (tb *tab) until(what, js string) {
	tb.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		ctx, cancel := context.WithTimeout(tb.ctx, 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("Promise.resolve("+js+").then((v) => !!v)", chromedp.EvalAwaitPromise))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			tb.t.Fatalf("timed out after %v waiting for %s (%s, last error %v)\npage:\n%s", waitLimit, what, js, err, tb.dump())
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// dump describes the page for a failure message.
func (tb *tab) dump() string {
	ctx, cancel := context.WithTimeout(tb.ctx, 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify(transcript(), null, 1) + "\n" + document.body.innerText.slice(0, 3000)`))
	if err != nil {
		s, _ = chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText.slice(0, 3000) : ""`))
	}
	return s
}

// The page-side helpers the tests evaluate, installed after each load.
const pageHelpers = `
window.transcript = (root) => [...(root || document.getElementById('transcript')).children].map((li) => ({
  kind: li.dataset.kind, status: li.dataset.status || '', id: li.dataset.toolCallId || li.dataset.sessionId || '',
  text: li.dataset.kind === 'tool' ? (li.querySelector(':scope > details > pre.output')?.textContent || '') :
        li.dataset.kind === 'subagent' ? '' : li.textContent.trim(),
}));
window.clickButton = (scope, label) => {
  const root = typeof scope === 'string' ? document.querySelector(scope) : (scope || document);
  if (!root) return false;
  const b = [...root.querySelectorAll('button')].find((b) => b.textContent.trim() === label && !b.disabled && b.offsetParent !== null);
  if (!b) return false;
  b.click();
  return true;
};
true`

// open navigates to the app (a Session's hash when sid is set) and
// installs the helpers.
func (tb *tab) open(url, sid string) {
	tb.t.Helper()
	target := url + "/"
	if sid != "" {
		target += "#/s/" + sid
	}
	tb.do(chromedp.Navigate(target))
	tb.helpers()
}

func (tb *tab) helpers() {
	tb.t.Helper()
	tb.until("the app's modules", `document.readyState === 'complete'`)
	eval[bool](tb, pageHelpers)
}

// reload reloads the page and reinstalls the helpers.
func (tb *tab) reload() {
	tb.t.Helper()
	tb.do(chromedp.Reload())
	tb.helpers()
}

// item is one transcript item as the page shows it.
type item struct {
	Kind   string `json:"kind"`
	Status string `json:"status"`
	ID     string `json:"id"`
	Text   string `json:"text"`
}

func (tb *tab) transcript() []item {
	tb.t.Helper()
	return eval[[]item](tb, `transcript()`)
}

// click clicks the enabled, visible button labelled label inside scope (a
// CSS selector; "" for the whole page), waiting until there is one.
func (tb *tab) click(scope, label string) {
	tb.t.Helper()
	sc := "null"
	if scope != "" {
		b, _ := json.Marshal(scope)
		sc = string(b)
	}
	lb, _ := json.Marshal(label)
	tb.until(fmt.Sprintf("button %q in %q", label, scope), fmt.Sprintf(`clickButton(%s, %s)`, sc, lb))
}

// send types text into the composer (labelled Message) and presses Send.
func (tb *tab) send(text string) {
	tb.t.Helper()
	tb.until("the composer", `document.querySelector('textarea#message') && document.querySelector('label[for=message]').textContent === 'Message'`)
	eval[bool](tb, `(document.getElementById('message').value = '') === ''`)
	tb.do(chromedp.SendKeys(`#message`, text), chromedp.Click(`#send`))
	tb.until("the composer to clear", `document.getElementById('message').value === '' || document.getElementById('composer-error').textContent !== ''`)
	if e := eval[string](tb, `document.getElementById('composer-error').textContent`); e != "" {
		tb.t.Fatalf("sending %q: %s", text, e)
	}
}

// screenshot saves a PNG of the viewport: into docs/ when
// FLOE_UPDATE_SCREENSHOTS=1, else into the test's temp dir.
func (tb *tab) screenshot(name string) string {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, waitLimit)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		tb.t.Fatal(err)
	}
	dir := tb.t.TempDir()
	if os.Getenv("FLOE_UPDATE_SCREENSHOTS") == "1" {
		dir = filepath.Join("..", "..", "..", "..", "docs")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			tb.t.Fatal(err)
		}
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		tb.t.Fatal(err)
	}
	return path
}

func kinds(items []item) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.Kind
	}
	return out
}

// noDuplicates fails when two transcript items say the same thing.
func noDuplicates(t *testing.T, items []item) {
	t.Helper()
	seen := map[item]bool{}
	for _, it := range items {
		if seen[it] {
			t.Fatalf("duplicate transcript item %+v in %+v", it, items)
		}
		seen[it] = true
	}
}

// setValue replaces an input's value as typing would.
func setValue(sel, v string) chromedp.Action[chromedp.Void] {
	clear := fmt.Sprintf(`(document.querySelector(%q).value = '') === ''`, sel)
	return chromedp.Steps(
		func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
			_, err := chromedp.Evaluate[bool](clear)(ctx, t)
			return chromedp.Void{}, err
		},
		chromedp.SendKeys(sel, v))
}

// has waits until an element matches the CSS selector.
func (tb *tab) has(what, css string) {
	tb.t.Helper()
	b, _ := json.Marshal(css)
	tb.until(what, "document.querySelector("+string(b)+")")
}

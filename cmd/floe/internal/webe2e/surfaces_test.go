package webe2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway/client"
)

// writeTrace makes sid's first Trace file out of msgs (a recorded
// Session, as if it had run).
func writeTrace(t *testing.T, s *server, sid string, msgs ...omni.Message) {
	t.Helper()
	sess, err := s.api("").GetSession(ctxT(t), sid)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for _, m := range msgs {
		buf.Write(omni.MustMarshal(&m))
		buf.WriteByte('\n')
	}
	file := trace.File(s.home(), time.UnixMilli(sess.CreatedUnixMs), sid, 1)
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func args(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// A 2×2 red PNG.
const redPNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAEklEQVR4nGP4z8DAwMDAwMDAAAAt8AT9QmcVHAAAAABJRU5ErkJggg=="

// Code is highlighted with a Copy button; answers have one too; edit_file
// and write_file cards show a diff; collapsed cards say the command or the
// path; images from tools are shown; outputs have a line count and Copy.
func TestRichToolCardsAndCopy(t *testing.T) {
	s := newServer(t, nil)
	sid := s.session(t, "", client.CreateSession{Title: "Rich cards"})
	code := "package main\n\nfunc main() {\n\tprintln(\"hi\")\n}"
	answer := "Here is the program:\n\n```go\n" + code + "\n```\n\nRun it with `go run`."
	writeTrace(t, s, sid,
		omni.SessionMeta(omni.Meta{SessionID: sid, Provider: "scripted", ModelID: "demo", ModelContextWindow: 128000, Workspace: s.dir}),
		omni.UserText("Fix the greeting and show me."),
		omni.RequestBegin(),
		omni.ToolCall("exec_command", args(obj{"description": "List", "cmd": "ls -la src"}), "call_ls"),
		omni.ToolCallOutput("call_ls", "total 2\nmain.go\nREADME.md\n", ""),
		omni.ToolCall("edit_file", args(obj{"file_path": "src/main.go", "old_string": "println(\"hello\")\n", "new_string": "println(\"hi\")\n"}), "call_edit"),
		omni.ToolCallOutput("call_edit", "Edited src/main.go (1 replacement).", ""),
		omni.ToolCall("write_file", args(obj{"file_path": "NOTES.md", "content": "# Notes\nGreeting fixed.\n"}), "call_write"),
		omni.ToolCallOutput("call_write", "Wrote NOTES.md (2 lines).", ""),
		omni.ToolCall("mcp__shot__screenshot", args(obj{"url": "http://localhost:8080"}), "call_shot"),
		omni.ToolCallOutputImages("call_shot", "A screenshot.", "", []string{redPNG}),
		omni.Text(omni.RoleAssistant, answer),
		omni.RequestEnd(omni.StatusCompleted, "", 0, 0),
	)
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)

	// Collapsed cards carry a summary line.
	for id, want := range map[string]string{"call_ls": "$ ls -la src", "call_edit": "src/main.go", "call_write": "NOTES.md", "call_shot": "http://localhost:8080"} {
		got := eval[string](tb, `document.querySelector('`+cardSel(id)+` summary .tool-summary')?.textContent || ''`)
		if got != want {
			t.Errorf("%s: summary %q, want %q", id, got, want)
		}
		if eval[bool](tb, `document.querySelector('`+cardSel(id)+` > details').open`) {
			t.Errorf("%s: a finished card is open", id)
		}
	}
	// The diff of edit_file, write_file's content as added lines.
	diff := func(id string) string {
		return eval[string](tb, `[...document.querySelectorAll('`+cardSel(id)+` .diff .diff-line')].map((l) => l.dataset.op + l.textContent).join('|')`)
	}
	if got := diff("call_edit"); got != `-println("hello")|+println("hi")` {
		t.Errorf("edit_file diff %q", got)
	}
	if got := diff("call_write"); got != "+# Notes|+Greeting fixed." {
		t.Errorf("write_file diff %q", got)
	}
	if eval[bool](tb, `document.querySelector('`+cardSel("call_edit")+` .diff').textContent.includes('\\n')`) {
		t.Error("escaped newlines in the diff")
	}
	// The tool's image, decoded.
	eval[bool](tb, `(document.querySelector('`+cardSel("call_shot")+` > details').open = true)`)
	tb.until("the image decoded", `document.querySelector('`+cardSel("call_shot")+` .tool-images img')?.naturalWidth === 2`)
	// Output line count.
	if got := eval[string](tb, `document.querySelector('`+cardSel("call_ls")+` .line-count').textContent`); got != "3 lines" {
		t.Errorf("line count %q", got)
	}
	// Highlighted code.
	if n := eval[int](tb, `document.querySelectorAll('#transcript li[data-kind=text] pre code.hljs span[class^=hljs-]').length`); n < 2 {
		t.Errorf("%d highlighted tokens in the code block", n)
	}
	if txt := eval[string](tb, `document.querySelector('#transcript li[data-kind=text]').textContent`); strings.Contains(txt, "Copy") {
		t.Errorf("button labels in the answer's text: %q", txt)
	}
	// Copy buttons: the code block, the whole answer, a tool output.
	eval[bool](tb, `(window.copied = [], navigator.clipboard.writeText = (t) => { window.copied.push(t); return Promise.resolve(); }, true)`)
	eval[bool](tb, `(document.querySelector('#transcript li[data-kind=text] .code-block button.copy').click(), true)`)
	tb.until("Copied", `document.querySelector('#transcript li[data-kind=text] .code-block button.copy').dataset.label === 'Copied'`)
	eval[bool](tb, `(document.querySelector('#transcript li[data-kind=text] > .msg-tools button.copy').click(), true)`)
	eval[bool](tb, `(document.querySelector('`+cardSel("call_ls")+` .output-head button.copy').click(), true)`)
	tb.until("three copies", `window.copied.length === 3`)
	got := eval[[]string](tb, `window.copied`)
	if got[0] != code || got[1] != answer || got[2] != "total 2\nmain.go\nREADME.md\n" {
		t.Fatalf("copied %q", got)
	}
}

// A running tool's output box follows its tail (the newest lines in
// view) unless the person scrolls it up.
func TestToolOutputFollowsItsTail(t *testing.T) {
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{execCall("call_loop", "Count", "for i in $(seq 1 80); do echo line $i; sleep 0.04; done")}},
		obj{"steps": []any{obj{"text": "Counted."}}},
	}})
	sid := s.session(t, "", client.CreateSession{})
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.send("Count to 80.")
	pre := cardSel("call_loop") + ` pre.output`
	tb.until("the output overflowing its box", `((p) => p && p.scrollHeight > p.clientHeight + 100)(document.querySelector('`+pre+`'))`)
	for range 3 {
		if !eval[bool](tb, `((p) => p.scrollHeight - p.scrollTop - p.clientHeight < 20)(document.querySelector('`+pre+`'))`) {
			t.Fatal("the running output does not show its tail")
		}
		eval[bool](tb, `new Promise((r) => setTimeout(() => r(true), 120))`)
	}
	tb.has("done", cardSel("call_loop")+`[data-status=done]`)
	if got := eval[string](tb, `document.querySelector('`+cardSel("call_loop")+` .line-count').textContent`); got != "80 lines" {
		t.Fatalf("line count %q", got)
	}
}

// Titles: a new Session reads "New session" (never its id), takes its
// first prompt as title at once, in the list and the header, and the
// header's Rename changes it for every view.
func TestSessionTitles(t *testing.T) {
	s := newServer(t, obj{"requests": []any{obj{"steps": []any{obj{"text": "Sure."}}}}, "after_last": "repeat_last"})
	sid := s.session(t, "", client.CreateSession{})
	tb := newTab(t)
	tb.open(s.url(), sid)
	row := fmt.Sprintf(`#sessions li[data-session-id=%q] .title`, sid)
	tb.until("the untitled row", `document.querySelector('`+row+`')?.textContent === 'New session'`)
	if got := eval[string](tb, `document.getElementById('s-title').textContent`); got != "New session" {
		t.Fatalf("header title %q", got)
	}
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.send("Explain the tracer's JSONL format\nwith examples")
	want := "Explain the tracer's JSONL format"
	tb.until("the prompt as title in the list", `document.querySelector('`+row+`').textContent === `+jsString(want))
	tb.until("and in the header", `document.getElementById('s-title').textContent === `+jsString(want))

	tb.click(".session-title", "Rename")
	tb.do(setValue(`#title-input`, "Tracer format"))
	tb.click("#title-form", "Save")
	tb.until("the new title in the list", `document.querySelector('`+row+`').textContent === 'Tracer format'`)
	if got := eval[string](tb, `document.getElementById('s-title').textContent`); got != "Tracer format" {
		t.Fatalf("header after rename %q", got)
	}
	if got, _ := s.api("").GetSession(ctxT(t), sid); got.Title != "Tracer format" {
		t.Fatalf("server title %q", got.Title)
	}
	other := newTab(t)
	other.open(s.url(), "")
	other.until("the title in another tab", `document.querySelector('`+row+`')?.textContent === 'Tracer format'`)
}

// After the first Task the model's title replaces the prompt's, in the
// list and the header, live through session_title.
func TestModelTitleAfterTheFirstTask(t *testing.T) {
	s := newServer(t, obj{"title": "Tracer JSONL format", "requests": []any{obj{"steps": []any{obj{"text": "Sure."}}}}, "after_last": "repeat_last"})
	sid := s.session(t, "", client.CreateSession{})
	tb := newTab(t)
	tb.open(s.url(), sid)
	row := fmt.Sprintf(`#sessions li[data-session-id=%q] .title`, sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.send("Explain the tracer's JSONL format\nwith examples")
	tb.until("the model's title in the list", `document.querySelector('`+row+`').textContent === 'Tracer JSONL format'`)
	tb.until("and in the header", `document.getElementById('s-title').textContent === 'Tracer JSONL format'`)
	if got, _ := s.api("").GetSession(ctxT(t), sid); got.Title != "Tracer JSONL format" {
		t.Fatalf("server title %q", got.Title)
	}
	other := newTab(t)
	other.open(s.url(), "")
	other.until("the title in another tab", `document.querySelector('`+row+`')?.textContent === 'Tracer JSONL format'`)
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// Until the list arrives the sidebar says it is loading, never "No
// Sessions yet."; an empty list then says so.
func TestListLoadingState(t *testing.T) {
	s := newServer(t, nil)
	for _, title := range []string{"One", "Two"} {
		s.session(t, "", client.CreateSession{Title: title})
	}
	tb := newTab(t)
	// Watch from the first script on: was the empty state ever shown,
	// and the loading one?
	tb.do(chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: `
window.seen = {empty: false, loading: false};
const look = () => {
  const e = document.getElementById('sessions-empty'), l = document.getElementById('sessions-loading');
  if (e && !e.hidden) window.seen.empty = true;
  if (l && !l.hidden && document.getElementById('app-view') && !document.getElementById('app-view').hidden) window.seen.loading = true;
};
new MutationObserver(look).observe(document, {subtree: true, childList: true, attributes: true});`})
		return err
	}))
	tb.open(s.url(), "")
	tb.until("the list", `document.querySelectorAll('#sessions li').length === 2`)
	if seen := eval[map[string]bool](tb, `window.seen`); seen["empty"] || !seen["loading"] {
		t.Fatalf("while loading: %v, want the loading state and never the empty one", seen)
	}
	empty := newServer(t, nil)
	tb.open(empty.url(), "")
	tb.until("the empty state", `!document.getElementById('sessions-empty').hidden && document.getElementById('sessions-loading').hidden`)
}

// At 390 px the list is a drawer: closed, the transcript takes the
// height; the Sessions button opens it over the page, choosing a Session
// closes it. Dark mode follows the system.
func TestNarrowLayoutAndDarkMode(t *testing.T) {
	s := newServer(t, obj{"requests": []any{obj{"steps": []any{obj{"text": "Here is `code`:\n\n```sh\necho hi\n```"}}}}, "after_last": "repeat_last"})
	first := s.session(t, "", client.CreateSession{Title: "Phone session"})
	second := s.session(t, "", client.CreateSession{Title: "Another one"})
	tb := newTab(t)
	tb.do(chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulateTouch))
	tb.open(s.url(), first)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.send("Show me code")
	tb.until("idle", `document.getElementById('s-state').textContent === 'idle' && document.querySelector('#transcript li[data-kind=text]')`)
	if r := eval[float64](tb, `document.getElementById('sidebar').getBoundingClientRect().right`); r > 0 {
		t.Fatalf("the closed drawer shows (right edge at %v px)", r)
	}
	if h := eval[float64](tb, `document.getElementById('transcript').getBoundingClientRect().height / window.innerHeight`); h < 0.55 {
		t.Fatalf("the transcript takes %.0f%% of the height", h*100)
	}
	if w := eval[float64](tb, `document.documentElement.scrollWidth`); w > 390 {
		wide := eval[string](tb, `[...document.querySelectorAll('body *')].filter((e) => e.getBoundingClientRect().right > 391).slice(0, 8).map((e) => e.tagName + '#' + e.id + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right)).join(', ')`)
		t.Fatalf("the page is %v px wide at 390: %s", w, wide)
	}
	tb.screenshot("webapp-390.png")
	tb.click(".top", "Sessions")
	tb.until("the drawer open", `((r) => r.left >= 0 && r.right > 200)(document.getElementById('sidebar').getBoundingClientRect())`)
	tb.do(chromedp.Click(fmt.Sprintf(`#sessions li[data-session-id=%q] a`, second)))
	tb.until("the other Session, drawer closed", fmt.Sprintf(`location.hash === '#/s/%s' && !document.body.classList.contains('drawer-open')`, second))
	tb.until("the drawer slid away", `document.getElementById('sidebar').getBoundingClientRect().right <= 0`)

	bg := func() string { return eval[string](tb, `getComputedStyle(document.documentElement).backgroundColor`) }
	light := bg()
	scheme := func(v string) {
		tb.do(chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: v}}})
			return err
		}))
	}
	scheme("dark")
	tb.open(s.url(), first)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	dark := bg()
	if lum(t, dark) > 0.2 || lum(t, light) < 0.8 {
		t.Fatalf("background light %s, dark %s", light, dark)
	}
	if c := eval[string](tb, `getComputedStyle(document.querySelector('#transcript li[data-kind=text]')).color`); lum(t, c) < 0.6 {
		t.Fatalf("dark mode text colour %s", c)
	}
	tb.screenshot("webapp-390-dark.png")
	scheme("light")
}

// lum is the rough lightness (0..1) of a CSS rgb() colour.
func lum(t *testing.T, css string) float64 {
	var r, g, b float64
	if _, err := fmt.Sscanf(strings.ReplaceAll(css, " ", ""), "rgb(%f,%f,%f)", &r, &g, &b); err != nil {
		t.Fatalf("colour %q: %v", css, err)
	}
	return (0.2126*r + 0.7152*g + 0.0722*b) / 255
}

// Keys: Enter sends, Shift+Enter makes a new line, Esc stops the Task.
func TestComposerKeys(t *testing.T) {
	s := newServer(t, obj{"requests": []any{
		obj{"steps": []any{execCall("call_sleep", "Wait", "sleep 30")}},
		obj{"steps": []any{obj{"text": "Stopped, as asked."}}},
	}, "after_last": "repeat_last"})
	sid := s.session(t, "", client.CreateSession{})
	// The prompt shows once the engine has the runner's tools: a slow
	// runner start under load made "sent" wait out its 45 s once.
	s.runnerUp(t, sid)
	tb := newTab(t)
	tb.open(s.url(), sid)
	tb.until("ready", `document.getElementById('transcript').dataset.ready === 'true'`)
	tb.do(chromedp.Click(`#message`), chromedp.SendKeys(`#message`, "first line"))
	tb.do(chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)))
	tb.do(chromedp.SendKeys(`#message`, "second line"))
	if v := eval[string](tb, `document.getElementById('message').value`); v != "first line\nsecond line" {
		t.Fatalf("after Shift+Enter the composer holds %q", v)
	}
	tb.do(chromedp.KeyEvent(kb.Enter))
	tb.until("sent", `document.getElementById('message').value === '' && [...document.querySelectorAll('#transcript li[data-kind=user]')].some((li) => li.innerText.includes('first line\nsecond line'))`)
	tb.has("the tool running", cardSel("call_sleep")+`[data-status=running]`)
	tb.do(chromedp.KeyEvent(kb.Escape))
	tb.has("the tool interrupted", cardSel("call_sleep")+`[data-status=interrupted]`)
	tb.until("idle", `document.getElementById('s-state').textContent === 'idle'`)
}

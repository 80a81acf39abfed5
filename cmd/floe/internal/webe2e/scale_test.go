package webe2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway/client"
)

// A 5,000-message Session opens quickly and stays responsive: the page
// folds every message but draws only the latest items, with "Show
// earlier" for the rest. The load time is measured and logged (no speed
// assertion): navigation start → transcript drawn.
func TestLargeSessionLoads(t *testing.T) {
	s := newServer(t, nil)
	c := s.api("")
	sess, err := c.CreateSession(ctxT(t), client.CreateSession{Workspace: s.dir, Title: "5,000 messages"})
	if err != nil {
		t.Fatal(err)
	}
	created := time.UnixMilli(sess.CreatedUnixMs)
	const turns = 625 // 8 messages each
	var buf bytes.Buffer
	add := func(m omni.Message) {
		buf.Write(omni.MustMarshal(&m))
		buf.WriteByte('\n')
	}
	add(omni.SessionMeta(omni.Meta{SessionID: sess.ID, Provider: "scripted", ModelID: "demo", ModelContextWindow: 128000, Workspace: s.dir}))
	for i := range turns - 1 {
		id := fmt.Sprintf("call_%d", i)
		add(omni.UserText(fmt.Sprintf("Question %d: what does file %d say?", i, i)))
		add(omni.RequestBegin())
		add(omni.ToolCall("read_file", fmt.Sprintf(`{"file_path":"notes/%d.md"}`, i), id))
		add(omni.ApprovalDecision(omni.DecisionAllow, id))
		add(omni.ToolCallOutput(id, fmt.Sprintf("1: # Note %d\n2: Some lines of text to read back.\n3: And a little more.", i), ""))
		add(omni.Text(omni.RoleAssistant, fmt.Sprintf("File %d says **Note %d**, then two lines:\n\n- some lines of text\n- a little more", i, i)))
		add(omni.TokenUsage(omni.Usage{Output: int64(20 * i), Total: int64(100 * i)}, omni.Usage{Output: 20, Total: 100}))
		add(omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
	}
	add(omni.UserText("The last question"))
	add(omni.RequestBegin())
	add(omni.Text(omni.RoleAssistant, "The last answer."))
	add(omni.TokenUsage(omni.Usage{Total: 1}, omni.Usage{Total: 1}))
	add(omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
	add(omni.Event(omni.Payload{Type: omni.TypeToolListReady}))
	add(omni.Event(omni.Payload{Type: omni.TypeRequestBegin}))
	add(omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
	records := bytes.Count(buf.Bytes(), []byte{'\n'})
	file := trace.File(s.home(), created, sess.ID, 1)
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	hist, err := c.Messages(ctxT(t), sess.ID)
	if err != nil || len(hist.Messages) != records {
		t.Fatalf("/messages has %d messages (%v), want the Trace's %d", len(hist.Messages), err, records)
	}

	tb := newTab(t)
	tb.open(s.url(), "")
	tb.until("the list", `document.querySelectorAll('#sessions li').length === 1`)
	var loads []time.Duration
	for range 3 {
		start := time.Now()
		tb.do(chromedp.Navigate(s.url() + "/#/s/" + sess.ID))
		tb.helpers()
		tb.until("the transcript drawn", `document.getElementById('transcript').dataset.ready === 'true'`)
		loads = append(loads, time.Since(start))
		took := time.Since(start)
		inPage := eval[string](tb, `(({loadMs, fetchMs, foldMs}) => loadMs + ' ms: /messages ' + fetchMs + ' ms, fold ' + foldMs + ' ms, draw the rest')(document.getElementById('transcript').dataset)`)
		t.Logf("%d-message Session: navigation → transcript drawn %v (in the page: open → drawn %s)", records, took.Round(time.Millisecond), inPage)
		tb.do(chromedp.Navigate("about:blank"))
	}
	tb.do(chromedp.Navigate(s.url() + "/#/s/" + sess.ID))
	tb.helpers()
	tb.until("the transcript drawn", `document.getElementById('transcript').dataset.ready === 'true'`)
	drawn := eval[int](tb, `document.querySelectorAll('#transcript > li').length`)
	if drawn == 0 || drawn > 200 {
		t.Fatalf("%d items drawn, want at most 200 of the %d", drawn, 3*(turns-1)+2)
	}
	last := eval[string](tb, `document.querySelector('#transcript > li:last-child').textContent`)
	if last != "The last answer." {
		t.Fatalf("last item %q", last)
	}
	// Responsive: "Show earlier" draws 200 more at once.
	tb.until("Show earlier", `!document.getElementById('show-earlier').hidden`)
	start := time.Now()
	tb.click("", fmt.Sprintf("Show earlier (%d)", 3*(turns-1)+2-drawn))
	tb.until("200 more items", fmt.Sprintf(`document.querySelectorAll('#transcript > li').length === %d`, drawn+200))
	t.Logf("Show earlier: 200 more items drawn in %v", time.Since(start).Round(time.Millisecond))
	// The composer still works on it (the demo model answers).
	heap := eval[float64](tb, `performance.memory ? performance.memory.usedJSHeapSize / 1048576 : 0`)
	t.Logf("JS heap after loading: %.1f MiB; loads %v", heap, loads)
}

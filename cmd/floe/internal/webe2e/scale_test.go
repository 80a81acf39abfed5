package webe2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway/client"
)

// A 5,000-message Session opens quickly and stays responsive: the page
// fetches the newest 50 Tasks (GET /messages?tailTasks=50) and draws them,
// and fetches the Tasks before them on "Show earlier Tasks" or a scroll to
// the top, keeping the whole history in order. The load time is measured
// and logged (no speed assertion): navigation start → transcript drawn.
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
	// The newest 50 Tasks: 49 of 3 items, the last of 2.
	if drawn != 3*49+2 {
		t.Fatalf("%d items drawn, want the newest 50 Tasks' %d", drawn, 3*49+2)
	}
	// "Show earlier Tasks" fetches the 50 before them, a scroll to the top
	// the 50 before those; the first item drawn is then Question 475.
	tb.until("Show earlier", `!document.getElementById('show-earlier').hidden`)
	start := time.Now()
	tb.click("", "Show earlier Tasks")
	tb.until("50 Tasks more", fmt.Sprintf(`document.querySelectorAll('#transcript > li').length === %d`, drawn+150))
	t.Logf("Show earlier Tasks: 50 Tasks fetched and drawn in %v", time.Since(start).Round(time.Millisecond))
	eval[int](tb, `document.getElementById("transcript").scrollTop = 0`)
	tb.until("50 Tasks more on scrolling to the top", fmt.Sprintf(`document.querySelectorAll('#transcript > li').length === %d`, drawn+300))
	first := eval[string](tb, `document.querySelector('#transcript > li').textContent`)
	if want := fmt.Sprintf("Question %d: what does file %d say?", turns-150, turns-150); !strings.Contains(first, want) {
		t.Fatalf("first item after two earlier pages %q, want %q", first, want)
	}
	if last := eval[string](tb, `document.querySelector('#transcript > li:last-child').textContent`); last != "The last answer." {
		t.Fatalf("last item after two earlier pages %q", last)
	}
	// The composer still works on it (the demo model answers).
	heap := eval[float64](tb, `performance.memory ? performance.memory.usedJSHeapSize / 1048576 : 0`)
	t.Logf("JS heap after loading: %.1f MiB; loads %v", heap, loads)
}

package trace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"floe.dev/pkg/omni"
)

// task publishes one Task's records: its Prompt (of parts texts), a
// steering text, an answer, and request brackets.
func (f *fixture) task(n int, parts int) {
	f.t.Helper()
	for p := range parts {
		if p == 0 {
			f.publish(omni.UserText(fmt.Sprintf("prompt %d", n)))
		} else {
			f.publish(omni.Model(omni.Payload{Type: omni.TypeImageURL, Role: omni.RoleUser, ImageURL: "data:image/png;base64,AA=="}))
		}
	}
	f.publish(omni.RequestBegin())
	f.publish(omni.Text(omni.RoleAssistant, fmt.Sprintf("answer %d", n)))
	f.publish(omni.UserText(omni.Block(omni.TagUserSteering, "and also")))
	f.publish(omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
}

// compaction publishes a completed compaction and the next context's head.
func (f *fixture) compaction() {
	f.publish(omni.CompactionBegin(omni.CompactManual, omni.ModeSummarize, 10, 1))
	f.publish(omni.UserText("Summarize the conversation."))
	f.publish(omni.Text(omni.RoleAssistant, "[summary]s[/summary]"))
	f.publish(omni.CompactionEnd(omni.CompactManual, omni.ModeSummarize, omni.StatusCompleted))
	f.publish(meta())
	f.publish(omni.UserText(omni.Block(omni.TagContextSummary, "s")))
}

// trace writes records [0, n) as Trace file 1 and records the position, as
// a tracer caught up to record n-1 would.
func (f *fixture) trace(n int, extra string) {
	f.t.Helper()
	path := f.writeFile(1, 0, n, extra)
	fi, err := os.Stat(path)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := WritePos(f.home, sid, Pos{Seq: f.seqs[n-1], File: path, Size: fi.Size(), Index: 1}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) window(w Window) *Page {
	f.t.Helper()
	_, p, err := LoadWindow(context.Background(), f.env.JS, f.home, sid, w, Options{})
	if err != nil {
		f.t.Fatalf("LoadWindow(%+v): %v", w, err)
	}
	return p
}

func texts(recs []Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, string(r.Data))
	}
	return out
}

// pages reads the history newest page first until the first page, and
// returns the records in history order.
func (f *fixture) pages(tasks int, from *Page) (all []string, n int) {
	f.t.Helper()
	p := from
	if p == nil {
		p = f.window(Window{Tasks: tasks})
	}
	for {
		n++
		all = append(texts(p.Records), all...)
		if !p.More {
			return all, n
		}
		if n > 1000 {
			f.t.Fatal("paging does not end")
		}
		p = f.window(Window{Tasks: tasks, Before: p.Start, HaveBefore: true})
	}
}

func TestWindowStartsAtAPromptAndPagesWithoutGapOrRepeat(t *testing.T) {
	f := newFixture(t)
	f.publish(meta())
	for n := range 7 {
		if n == 3 {
			f.compaction()
		}
		f.task(n, 1+n%2) // odd Tasks have a Prompt of two parts
	}
	f.trace(20, "")
	whole := texts(f.load(Options{}).Records)

	p := f.window(Window{Tasks: 2})
	if got := string(p.Records[0].Data); got != string(f.dataOf("prompt 5")) {
		t.Fatalf("newest 2 Tasks start with %s, want prompt 5", got)
	}
	if want := whole[len(whole)-len(p.Records):]; !slices.Equal(texts(p.Records), want) || p.End != len(whole) || p.Total != len(whole) || !p.More {
		t.Fatalf("newest 2 Tasks = %d records [%d,%d) of %d, more %v; want the last %d", len(p.Records), p.Start, p.End, p.Total, p.More, len(want))
	}
	for _, tasks := range []int{1, 2, 3, 50} {
		got, n := f.pages(tasks, nil)
		if !slices.Equal(got, whole) {
			t.Fatalf("pages of %d Tasks (%d pages) =\n%v\nwant\n%v", tasks, n, got, whole)
		}
		if want := max(1, (7+tasks-1)/tasks); n != want {
			t.Errorf("%d pages of %d Tasks, want %d", n, tasks, want)
		}
	}
	// The first page starts with the head (session_meta), the compaction
	// prompt and the steering texts start no Task.
	if _, n := f.pages(1, nil); n != 7 {
		t.Fatalf("%d pages of one Task, want 7", n)
	}
}

func (f *fixture) dataOf(text string) []byte {
	for _, d := range f.data {
		var m omni.Message
		if omni.Unmarshal(d, &m) == nil && m.Payload.Text == text {
			return d
		}
	}
	f.t.Fatalf("no record %q", text)
	return nil
}

// Tasks that run (and a tracer that catches up) while a client pages do
// not move the cursors it holds: the pages still join without gap or
// repeat.
func TestWindowCursorsAreStableWhileTasksRun(t *testing.T) {
	f := newFixture(t)
	f.publish(meta())
	for n := range 6 {
		f.task(n, 1)
	}
	f.trace(12, "")
	first := f.window(Window{Tasks: 2})
	for n := 6; n < 9; n++ {
		f.task(n, 1)
	}
	f.trace(len(f.data)-3, "") // the tracer caught up with part of it
	older, _ := f.pages(2, f.window(Window{Tasks: 2, Before: first.Start, HaveBefore: true}))
	got := append(older, texts(first.Records)...)
	whole := texts(f.load(Options{}).Records)
	if !slices.Equal(got, whole[:first.End]) {
		t.Fatalf("pages after Tasks ran =\n%v\nwant\n%v", got, whole[:first.End])
	}
	if _, err := func() (*Page, error) {
		_, p, err := LoadWindow(context.Background(), f.env.JS, f.home, sid, Window{Tasks: 1, Before: len(whole) + 1, HaveBefore: true}, Options{})
		return p, err
	}(); !errors.Is(err, ErrCursor) {
		t.Fatalf("a cursor past the end: %v, want ErrCursor", err)
	}
}

// A malformed Trace line inside the window is skipped (and counted), and
// keeps its ordinal: the page before still ends where the window starts.
func TestWindowSkipsMalformedLinesKeepingOrdinals(t *testing.T) {
	f := newFixture(t)
	f.publish(meta())
	for n := range 4 {
		f.task(n, 1)
	}
	// A garbage line after Task 2's Prompt.
	path := File(f.home, created, sid, 1)
	f.writeFile(1, 0, len(f.data), "")
	var out []byte
	for i, d := range f.data {
		out = append(append(out, d...), '\n')
		if i == 11 {
			out = append(out, "{garbage\n"...)
		}
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WritePos(f.home, sid, Pos{Seq: f.seqs[len(f.seqs)-1], File: path, Size: int64(len(out)), Index: 1}); err != nil {
		t.Fatal(err)
	}
	p := f.window(Window{Tasks: 2})
	if p.Skipped != 1 || p.Total != len(f.data)+1 || len(p.Records) != p.End-p.Start-1 {
		t.Fatalf("window = %d records [%d,%d) of %d, skipped %d; want the garbage line skipped", len(p.Records), p.Start, p.End, p.Total, p.Skipped)
	}
	var want []string
	for _, d := range f.data {
		want = append(want, string(d))
	}
	if got, _ := f.pages(2, p); !slices.Equal(got, want) {
		t.Fatalf("pages =\n%v\nwant every record but the garbage line\n%v", got, want)
	}
}

// A background completion the original delivered mid-run (delivery:
// steering) is inside its Task; one delivered while idle starts a Task.
func TestSteeredBackgroundNoticeIsNotAPrompt(t *testing.T) {
	const steered = "[background_task_done]\nkind: command\nid: bg_1\nstatus: completed\ndelivery: steering\n[/background_task_done]\n\nbuilt"
	const idle = "[background_task_done]\nkind: command\nid: bg_1\nstatus: completed\n[/background_task_done]\n\nbuilt"
	for _, tc := range []struct {
		text string
		want bool
	}{{steered, false}, {idle, true}, {"delivery: steering", true}} {
		m := omni.UserText(tc.text)
		if got := isPrompt(&m); got != tc.want {
			t.Errorf("isPrompt(%q) = %v, want %v", tc.text, got, tc.want)
		}
	}
}

// FuzzWindowPages: any history (lines of anything, valid records or not)
// paged with any window size joins into the whole history, without gap or
// repeat, and every page starts at 0 or where a window may start.
func FuzzWindowPages(f *testing.F) {
	prompt := string(omni.MustMarshal(ptr(omni.UserText("go"))))
	answer := string(omni.MustMarshal(ptr(omni.Text(omni.RoleAssistant, "ok"))))
	begin := string(omni.MustMarshal(ptr(omni.CompactionBegin(omni.CompactManual, omni.ModeSummarize, 1, 1))))
	end := string(omni.MustMarshal(ptr(omni.CompactionEnd(omni.CompactManual, omni.ModeSummarize, omni.StatusCompleted))))
	f.Add(strings.Join([]string{prompt, answer, prompt, answer}, "\n"), 1)
	f.Add(strings.Join([]string{begin, prompt, end, prompt, "{garbage", answer}, "\n"), 2)
	f.Add("", 3)
	f.Fuzz(func(t *testing.T, history string, tasks int) {
		tasks = 1 + abs(tasks)%5
		var recs []Record
		for _, l := range strings.Split(history, "\n") {
			recs = append(recs, Record{Data: []byte(l)})
		}
		end := len(recs)
		var got []Record
		for pages := 0; ; pages++ {
			start, more := windowStart(recs[:end], tasks)
			if start < 0 || start > end || (start == 0 && more) {
				t.Fatalf("windowStart(%d records, %d) = %d, more %v", end, tasks, start, more)
			}
			got = append(append([]Record(nil), recs[start:end]...), got...)
			if !more {
				break
			}
			if start == end || pages > len(recs) {
				t.Fatalf("paging does not advance: start %d, end %d", start, end)
			}
			end = start
		}
		if len(got) != len(recs) {
			t.Fatalf("pages hold %d records, want %d", len(got), len(recs))
		}
	})
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// A page's records are its own: LoadWindow reads the history into memory
// it reuses, and a page read earlier keeps its bytes after later reads
// (another Session's between them).
func TestWindowPagesKeepTheirBytesAcrossReads(t *testing.T) {
	f, other := newFixture(t), newFixture(t)
	for i, x := range []*fixture{f, other} {
		x.publish(meta())
		for n := range 6 {
			x.task(n+100*i, 1)
		}
		x.trace(len(x.seqs), "")
	}
	whole := texts(f.load(Options{}).Records)
	var held [][]Record // pages as returned, newest first
	p := f.window(Window{Tasks: 1})
	for {
		held = append(held, p.Records)
		other.window(Window{Tasks: 3})
		if !p.More || len(held) > 100 {
			break
		}
		p = f.window(Window{Tasks: 1, Before: p.Start, HaveBefore: true})
	}
	var got []string
	for _, recs := range slices.Backward(held) {
		got = append(got, texts(recs)...)
	}
	if !slices.Equal(got, whole) {
		t.Fatalf("pages held across reads =\n%v\nwant\n%v", got, whole)
	}
}

package trace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"

	"floe.dev/pkg/omni"
)

// conversation publishes a Session with two Tasks: a committed call whose
// output lands after its request_end, then a request left open with a
// committed call. It returns the indexes (into f.data/f.seqs) of notable
// records, and the sequence of a partial (a stream position that is not
// a record).
func conversation(f *fixture) (idx map[string]int, partial uint64) {
	idx = make(map[string]int)
	mark := func(name string, m omni.Message) { f.publish(m); idx[name] = len(f.data) - 1 }
	mark("meta", meta())
	mark("tools", omni.ToolListReady(nil))
	mark("prompt", omni.UserText("hi"))
	mark("begin1", omni.RequestBegin())
	partial = f.publishRaw(omni.Partial("text", "delta", "t", "", ""))
	mark("text1", omni.Text(omni.RoleAssistant, "looking"))
	tc := omni.ToolCall("exec_command", `{"cmd":"ls"}`, "call_A")
	tc.Payload.StopReason = omni.StatusCompleted
	mark("callA", tc)
	mark("allowA", omni.ApprovalDecision("allow", "call_A"))
	mark("end1", omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
	mark("outA", omni.ToolCallOutput("call_A", "a b", omni.StatusCompleted))
	mark("begin2", omni.RequestBegin())
	mark("text2", omni.Text(omni.RoleAssistant, "done"))
	mark("end2", omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
	mark("prompt2", omni.UserText("again"))
	mark("begin3", omni.RequestBegin())
	tcB := omni.ToolCall("exec_command", `{"cmd":"pwd"}`, "call_B")
	tcB.Payload.StopReason = omni.StatusCompleted
	mark("callB", tcB)
	return idx, partial
}

// publishRaw publishes a message that is not a record (a partial): its
// sequence, not kept in f.data.
func (f *fixture) publishRaw(m omni.Message) uint64 {
	f.t.Helper()
	ack, err := f.env.JS.Publish(context.Background(), omni.SessionSubject(sid, omni.ClassOf(&m)), omni.MustMarshal(&m))
	if err != nil {
		f.t.Fatal(err)
	}
	return ack.Sequence
}

func (f *fixture) cut(at uint64) *Cut {
	f.t.Helper()
	c, err := CutAt(context.Background(), f.env.JS, f.home, sid, at, true)
	if err != nil {
		f.t.Fatalf("CutAt(%d): %v", at, err)
	}
	return c
}

// types lists the payload types of the closing records.
func types(msgs []omni.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.Payload.Type+"/"+m.Payload.Status)
	}
	return out
}

// wantCarried checks that c carries records first..last of f.data (after
// the head, which is record head).
func (f *fixture) wantCarried(c *Cut, head, last int) {
	f.t.Helper()
	if string(omni.MustMarshal(&c.Head)) != string(f.data[head]) {
		f.t.Errorf("Head = %s, want %s", omni.MustMarshal(&c.Head), f.data[head])
	}
	want := f.data[head+1 : last+1]
	if len(c.Records) != len(want) {
		f.t.Fatalf("cut carries %d records, want %d", len(c.Records), len(want))
	}
	for i := range want {
		if string(c.Records[i]) != string(want[i]) {
			f.t.Errorf("record %d = %s, want %s", i, c.Records[i], want[i])
		}
	}
}

func TestCutClosesWhatIsOpenAtTheCut(t *testing.T) {
	f := newFixture(t)
	idx, partial := conversation(f)
	abort := "abort/"
	aborted := "request_end/" + omni.StatusAborted
	usage := "token_usage/"
	for _, tc := range []struct {
		name  string
		at    uint64
		last  int
		close []string
	}{
		{"at the end", 0, idx["callB"], []string{usage, aborted, abort}},
		{"mid-history request_end, its call's output later", f.seqs[idx["end1"]], idx["end1"], []string{abort}},
		{"right after the committed call", f.seqs[idx["callA"]], idx["callA"], []string{usage, aborted, abort}},
		{"on a partial inside the request", partial, idx["begin1"], []string{usage, aborted, abort}},
		{"after the output: nothing open", f.seqs[idx["outA"]], idx["outA"], nil},
		{"at a Task's end", f.seqs[idx["end2"]], idx["end2"], nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.t = t
			c := f.cut(tc.at)
			f.wantCarried(c, 0, tc.last)
			if got := types(c.Close); !slices.Equal(got, tc.close) {
				t.Errorf("Close = %v, want %v", got, tc.close)
			}
			want := tc.at
			if want == 0 {
				want = f.seqs[len(f.seqs)-1]
			}
			if c.Seq != want {
				t.Errorf("Seq = %d, want %d", c.Seq, want)
			}
		})
	}
}

func TestCutRejectsSequencesThatAreNotTheSessionsPositions(t *testing.T) {
	f := newFixture(t)
	conversation(f)
	other := omni.UserText("elsewhere")
	ack, err := f.env.JS.Publish(context.Background(), omni.SessionSubject("session-other", omni.ClassModel), omni.MustMarshal(&other))
	if err != nil {
		t.Fatal(err)
	}
	for _, at := range []uint64{ack.Sequence, ack.Sequence + 100} {
		if _, err := CutAt(context.Background(), f.env.JS, f.home, sid, at, true); !errors.Is(err, ErrNotPosition) {
			t.Errorf("CutAt(%d) = %v, want ErrNotPosition", at, err)
		}
	}
}

// The same cut gives the same records whether they come from the stream or
// from Trace files the tracer wrote up to its position.
func TestCutInsideTraceFilesMatchesTheStream(t *testing.T) {
	f := newFixture(t)
	idx, _ := conversation(f)
	var fromStream []*Cut
	for i := range f.seqs {
		fromStream = append(fromStream, f.cut(f.seqs[i]))
	}
	// The tracer has written everything up to text2.
	upto := idx["text2"]
	path := f.writeFile(1, 0, upto+1, "")
	fi, _ := os.Stat(path)
	if err := WritePos(f.home, sid, Pos{Seq: f.seqs[upto], File: path, Size: fi.Size(), Index: 1}); err != nil {
		t.Fatal(err)
	}
	for i := range f.seqs {
		c := f.cut(f.seqs[i])
		if !slices.EqualFunc(c.Records, fromStream[i].Records, func(a, b []byte) bool { return string(a) == string(b) }) ||
			!slices.Equal(types(c.Close), types(fromStream[i].Close)) {
			t.Errorf("cut at record %d from files: %d records, close %v; from the stream: %d, %v",
				i, len(c.Records), types(c.Close), len(fromStream[i].Records), types(fromStream[i].Close))
		}
	}
}

// An imported Trace (files without a position, nothing on the stream) is
// carried whole; its records have no stream position.
func TestCutOfAnImportedTraceCarriesItWhole(t *testing.T) {
	f := newFixture(t)
	idx, _ := conversation(f)
	// Another stream: the records are only in the file.
	g := newFixture(t)
	g.data = f.data
	g.writeFile(1, 0, len(f.data), "")
	c, err := CutAt(context.Background(), g.env.JS, g.home, sid, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	g.wantCarried(c, 0, idx["callB"])
	if c.Seq != 0 || !slices.Equal(types(c.Close), []string{"token_usage/", "request_end/aborted", "abort/"}) {
		t.Errorf("Seq = %d, Close = %v; want 0 and the open request closed", c.Seq, types(c.Close))
	}
}

func TestCutInsideCompactionForksFromTheOlderFile(t *testing.T) {
	f := newFixture(t)
	idx := map[string]int{}
	mark := func(name string, m omni.Message) { f.publish(m); idx[name] = len(f.data) - 1 }
	mark("meta1", meta())
	mark("tools1", omni.ToolListReady(nil))
	mark("prompt", omni.UserText("hi"))
	mark("begin", omni.RequestBegin())
	mark("text", omni.Text(omni.RoleAssistant, "hello"))
	mark("end", omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
	mark("cbegin", omni.CompactionBegin(omni.CompactManual, omni.ModeSummarize, 10, 1))
	cp := omni.UserText("summarize")
	f.publishOn(cp, omni.ClassTrace)
	idx["cprompt"] = len(f.data) - 1
	mark("cbegin_req", omni.RequestBegin())
	sum := omni.Text(omni.RoleAssistant, "[summary]\nhi and hello\n[/summary]")
	f.publishOn(sum, omni.ClassTrace)
	idx["summary"] = len(f.data) - 1
	mark("cend_req", omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
	mark("cend", omni.CompactionEnd(omni.CompactManual, omni.ModeSummarize, omni.StatusCompleted))
	mark("meta2", meta())
	mark("tools2", omni.ToolListReady(nil))
	f.publishOn(omni.UserText(omni.Block(omni.TagContextSummary, "hi and hello")), omni.ClassTrace)
	idx["ctx"] = len(f.data) - 1
	mark("prompt2", omni.UserText("next"))
	// The tracer rotated at meta2 and is caught up.
	f.writeFile(1, 0, idx["meta2"], "")
	path := f.writeFile(2, idx["meta2"], len(f.data), "")
	fi, _ := os.Stat(path)
	if err := WritePos(f.home, sid, Pos{Seq: f.seqs[len(f.seqs)-1], File: path, Size: fi.Size(), Index: 2}); err != nil {
		t.Fatal(err)
	}

	c := f.cut(f.seqs[idx["summary"]])
	f.wantCarried(c, idx["meta1"], idx["summary"])
	if got, want := types(c.Close), []string{"request_end/aborted", "compaction_end/aborted", "abort/"}; !slices.Equal(got, want) {
		t.Errorf("Close = %v, want %v", got, want)
	}
	c = f.cut(f.seqs[idx["cend"]])
	f.wantCarried(c, idx["meta1"], idx["cend"])
	if len(c.Close) != 0 {
		t.Errorf("Close after a completed compaction = %v, want none", types(c.Close))
	}
	c = f.cut(0)
	f.wantCarried(c, idx["meta2"], idx["prompt2"])
}

func (f *fixture) publishOn(m omni.Message, class string) {
	f.t.Helper()
	b := omni.MustMarshal(&m)
	ack, err := f.env.JS.Publish(context.Background(), omni.SessionSubject(sid, class), b)
	if err != nil {
		f.t.Fatal(err)
	}
	f.seqs = append(f.seqs, ack.Sequence)
	f.data = append(f.data, b)
}

func TestCutFindsTheOpenSubagentRuns(t *testing.T) {
	f := newFixture(t)
	f.publish(meta())
	f.publish(omni.UserText("delegate"))
	f.publish(omni.RequestBegin())
	for _, id := range []string{"call_1", "call_2"} {
		tc := omni.ToolCall("run_subagent", `{"description":"d","prompt":"p"}`, id)
		tc.Payload.StopReason = omni.StatusCompleted
		f.publish(tc)
	}
	f.publish(omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
	f.publish(omni.Subagent("session-child-1"))
	f.publish(omni.Subagent("session-child-2"))
	f.publish(omni.ToolCallOutput("call_1", "child one's answer", omni.StatusCompleted))
	c := f.cut(0)
	if len(c.Children) != 1 || c.Children[0].ID != "session-child-2" || c.Children[0].Index != 6 {
		t.Errorf("Children = %+v, want session-child-2 at record 6", c.Children)
	}
	if got := types(c.Close); !slices.Equal(got, []string{"abort/"}) {
		t.Errorf("Close = %v, want abort", got)
	}
}

// A cut by record ordinal is the cut by that record's stream sequence,
// whether the records come from the stream or from Trace files; it also
// reaches inside an imported Trace, which has no sequences; the ordinals
// are those LoadWindow gives.
func TestCutAtRecordIsTheCutAtItsSequence(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	idx, _ := conversation(f)
	same := func(t *testing.T, what string, got, want *Cut) {
		t.Helper()
		if !slices.EqualFunc(got.Records, want.Records, func(a, b []byte) bool { return string(a) == string(b) }) ||
			!slices.Equal(types(got.Close), types(want.Close)) || got.Seq != want.Seq {
			t.Errorf("%s: %d records, close %v, seq %d; want %d, %v, %d", what,
				len(got.Records), types(got.Close), got.Seq, len(want.Records), types(want.Close), want.Seq)
		}
	}
	check := func(t *testing.T, home string, fromFiles int) {
		_, page, err := LoadWindow(ctx, f.env.JS, home, sid, Window{Tasks: 100}, Options{})
		if err != nil || len(page.Ordinals) != len(f.data) {
			t.Fatalf("LoadWindow: %v, ordinals %v", err, page.Ordinals)
		}
		for i := range f.data {
			c, err := CutAtRecord(ctx, f.env.JS, home, sid, page.Ordinals[i])
			if err != nil {
				t.Fatalf("CutAtRecord(%d): %v", i, err)
			}
			want := f.cut(f.seqs[i])
			if i < fromFiles {
				want.Seq = 0 // read from a file: no sequence
			}
			same(t, fmt.Sprintf("record %d", i), c, want)
		}
		for _, n := range []int{-1, len(f.data), len(f.data) + 5} {
			if _, err := CutAtRecord(ctx, f.env.JS, home, sid, n); !errors.Is(err, ErrNotPosition) {
				t.Errorf("CutAtRecord(%d) = %v, want ErrNotPosition", n, err)
			}
		}
	}
	t.Run("stream", func(t *testing.T) { f.t = t; check(t, f.home, 0) })
	t.Run("files", func(t *testing.T) {
		f.t = t
		upto := idx["text2"]
		path := f.writeFile(1, 0, upto+1, "")
		fi, _ := os.Stat(path)
		if err := WritePos(f.home, sid, Pos{Seq: f.seqs[upto], File: path, Size: fi.Size(), Index: 1}); err != nil {
			t.Fatal(err)
		}
		check(t, f.home, upto+1)
	})
	t.Run("imported", func(t *testing.T) {
		g := newFixture(t)
		g.data = f.data
		g.writeFile(1, 0, len(f.data), "")
		c, err := CutAtRecord(ctx, g.env.JS, g.home, sid, idx["end1"])
		if err != nil {
			t.Fatal(err)
		}
		g.wantCarried(c, 0, idx["end1"])
		if c.Seq != 0 || !slices.Equal(types(c.Close), []string{"abort/"}) {
			t.Errorf("Seq = %d, Close = %v; want 0 and the call waiting for its output interrupted", c.Seq, types(c.Close))
		}
	})
}

// An open request is closed as the engine closes one a user aborts:
// token_usage with the Session's usage so far (the last token_usage's,
// the fold's) and nothing for the request, then request_end{aborted}
// with the attempt the engine numbered it (a retry after a failed
// attempt is attempt 2), then abort. A fork's Trace is then one the
// engine could have written: floe replay --execute replays it.
func TestCloseOfAnOpenRequestIsTheEnginesAbort(t *testing.T) {
	u := omni.Usage{Output: 7, Total: 120}
	recs := []omni.Message{
		meta(), omni.UserText("hi"),
		omni.RequestBegin(), omni.Text(omni.RoleAssistant, "half"),
		omni.TokenUsage(u, u), omni.RequestEnd(omni.StatusTimeout, "reset", 1, 2000),
		omni.RequestBegin(), omni.Text(omni.RoleAssistant, "again"),
	}
	var rs []Record
	for i := range recs {
		rs = append(rs, Record{Data: omni.MustMarshal(&recs[i])})
	}
	for _, tc := range []struct {
		name    string
		n       int
		attempt int64
		usage   omni.Usage
	}{
		{"the first attempt", 4, 1, omni.Usage{}},
		{"the retry", len(rs), 2, u},
	} {
		c, err := Close(rs[:tc.n], 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := types(c.Close); !slices.Equal(got, []string{"token_usage/", "request_end/aborted", "abort/"}) {
			t.Fatalf("%s: Close = %v", tc.name, got)
		}
		if p := c.Close[0].Payload; p.Session == nil || *p.Session != tc.usage || p.Request == nil || *p.Request != (omni.Usage{}) {
			t.Errorf("%s: token_usage %s, want session %+v and nothing for the request", tc.name, omni.MustMarshal(&c.Close[0]), tc.usage)
		}
		if p := c.Close[1].Payload; p.Attempt != tc.attempt {
			t.Errorf("%s: request_end attempt %d, want %d", tc.name, p.Attempt, tc.attempt)
		}
	}
}

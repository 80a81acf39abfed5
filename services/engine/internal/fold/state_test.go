package fold

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"testing"

	"floe.dev/pkg/omni"
)

// stateCorpus is every shape of history the fold knows: committed and
// failed requests, outputs before and after request_end, an open request,
// aborts, compactions (completed with attempts, failed, pending), the
// recorded Trace of the task package.
func stateCorpus(t *testing.T) map[string][]omni.Message {
	t.Helper()
	corpus := map[string][]omni.Message{"calls": callsRecords()}

	var open []omni.Message
	open = append(open, omni.UserText("go"))
	open = append(open, request(omni.StatusCompleted, omni.ToolCall("exec_command", "{}", "a"), omni.ToolCall("exec_command", "{}", "b"))...)
	open = append(open, omni.ToolCallOutput("b", "B", ""), omni.RequestBegin(), omni.Text(omni.RoleAssistant, "cut"),
		omni.ToolCall("exec_command", "{}", "c"), omni.ToolCallOutput("c", "C", ""))
	corpus["open request"] = open

	var abort []omni.Message
	abort = append(abort, omni.UserText("go"))
	abort = append(abort, request(omni.StatusCompleted, omni.ToolCall("exec_command", "{}", "slow"), omni.ToolCall("exec_command", "{}", "fast"))...)
	abort = append(abort, omni.ToolCallOutput("fast", "F", ""), omni.Abort(""), omni.UserText("again"))
	abort = append(abort, request(omni.StatusCompleted, omni.ToolCall("exec_command", "{}", "next"))...)
	corpus["abort"] = abort

	var comp []omni.Message
	comp = append(comp, omni.SessionMeta(omni.Meta{SessionID: "s"}), omni.ToolListReady(nil), omni.UserText("old"))
	comp = append(comp, request(omni.StatusCompleted, omni.Text(omni.RoleAssistant, "old answer"))...)
	comp = append(comp, compactionSpan(
		request(omni.StatusTimeout, omni.Text(omni.RoleAssistant, "[summary]half of it")),
		request(omni.StatusCompleted, omni.Text(omni.RoleAssistant, "[summary]\nall of it\n[/summary]")),
	)...)
	comp = append(comp, omni.SessionMeta(omni.Meta{SessionID: "s"}), omni.ToolListReady(nil),
		omni.UserText(omni.Block(omni.TagContextSummary, "all of it")), omni.UserText("next"))
	comp = append(comp, request(omni.StatusCompleted, omni.Text(omni.RoleAssistant, "ok"))...)
	comp = append(comp, omni.CompactionBegin(omni.CompactContext, omni.ModeSummarize, 10, 1),
		omni.CompactionEnd(omni.CompactContext, omni.ModeSummarize, omni.StatusFailed))
	comp = append(comp, omni.CompactionBegin(omni.CompactManual, omni.ModeDiscard, 10, 1), omni.UserText("Summarize."))
	corpus["compactions"] = comp

	// Outputs and an abort reaching turns of earlier Tasks, and a call id
	// committed twice (an imported history): the copy-on-write paths.
	var late []omni.Message
	late = append(late, omni.UserText("one"))
	late = append(late, request(omni.StatusCompleted, omni.ToolCall("exec_command", "{}", "x"), omni.ToolCall("exec_command", "{}", "y"))...)
	late = append(late, omni.UserText("two"))
	late = append(late, request(omni.StatusCompleted, omni.Text(omni.RoleAssistant, "meanwhile"))...)
	late = append(late, omni.ToolCallOutput("y", "Y", ""), omni.UserText("three"))
	late = append(late, request(omni.StatusCompleted, omni.ToolCall("exec_command", "{}", "x"))...)
	late = append(late, omni.ToolCallOutput("x", "X2", ""), omni.ToolCallOutput("x", "X3", ""), omni.Abort(""))
	late = append(late, omni.UserText("four"), omni.RequestBegin(), omni.ToolCall("exec_command", "{}", "z"))
	late = append(late, omni.ToolCallOutput("z", "Z", ""))
	corpus["late outputs"] = late

	data, err := os.ReadFile("../task/testdata/replay_trace.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	var recorded []omni.Message
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var m omni.Message
		if err := omni.Unmarshal(line, &m); err != nil {
			t.Fatalf("recorded trace: %v", err)
		}
		recorded = append(recorded, m)
	}
	corpus["recorded"] = recorded

	// The fold only ever sees decoded records (the Trace, the stream).
	for name, recs := range corpus {
		for i := range recs {
			b, err := omni.Marshal(&recs[i])
			if err != nil {
				t.Fatal(err)
			}
			recs[i] = omni.Message{}
			if err := omni.Unmarshal(b, &recs[i]); err != nil {
				t.Fatal(err)
			}
		}
		corpus[name] = recs
	}
	return corpus
}

// observe is everything the engine reads of a Context, as text.
func observe(t *testing.T, c *Context) string {
	t.Helper()
	var b bytes.Buffer
	for _, m := range c.Messages() {
		if _, summary := omni.ParseBlock(m.Payload.Text, omni.TagContextSummary); summary || m.Payload.Output == omni.InterruptedOutput {
			// The messages Messages makes are stamped with the clock.
			mm := *m
			mm.Timestamp = ""
			m = &mm
		}
		j, err := omni.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(j)
		b.WriteByte('\n')
	}
	if c.Meta != nil {
		j, _ := omni.Marshal(c.Meta)
		fmt.Fprintf(&b, "meta %s\n", j)
	}
	reason, mode, pending := c.PendingCompaction()
	fmt.Fprintf(&b, "tools %v\nusage %+v last %d turns %d/%d compacting %v pending %q %q %v\n",
		c.Tools, c.Usage, c.LastRequestTotal, c.Turns, c.TotalTurns, c.Compacting, reason, mode, pending)
	fmt.Fprintf(&b, "summary %q compactions %d closed %v records %d open %v empty %v\nunpaired %v last %v\n",
		c.Summary, c.Compactions, c.Closed, c.Records, c.OpenRequest(), c.Empty(), c.Unpaired(), c.LastCalls())
	fmt.Fprintf(&b, "compaction text %q attempt %q %v\n", c.compactionText, c.attemptText.String(), c.attemptOpen)
	fmt.Fprintf(&b, "call ids %v\n", slices.Collect(c.CallIDs()))
	return b.String()
}

// A Context restored from its State at any record, then folding the rest,
// ends where the fold of the whole history ends; so does a Clone, and
// folding into the clone leaves the original as it was.
func TestStateAndCloneAtEverySplitEqualTheWholeFold(t *testing.T) {
	for name, recs := range stateCorpus(t) {
		whole := New()
		for i := range recs {
			whole.Apply(&recs[i])
		}
		want := observe(t, whole)
		for k := 0; k <= len(recs); k++ {
			head := New()
			for i := range recs[:k] {
				head.Apply(&recs[i])
			}
			before := observe(t, head)
			st, err := head.State()
			if err != nil {
				t.Fatalf("%s at %d: State: %v", name, k, err)
			}
			b, err := omni.Pack(st)
			if err != nil {
				t.Fatalf("%s at %d: pack: %v", name, k, err)
			}
			var back State
			if err := omni.Unpack(b, &back); err != nil {
				t.Fatalf("%s at %d: unpack: %v", name, k, err)
			}
			restored, err := Restore(&back)
			if err != nil {
				t.Fatalf("%s at %d: Restore: %v", name, k, err)
			}
			clone := head.Clone()
			for i := range recs[k:] {
				restored.Apply(&recs[k+i])
				clone.Apply(&recs[k+i])
			}
			if got := observe(t, restored); got != want {
				t.Errorf("%s: restored at %d then folded =\n%s\nwant\n%s", name, k, got, want)
			}
			if got := observe(t, clone); got != want {
				t.Errorf("%s: cloned at %d then folded =\n%s\nwant\n%s", name, k, got, want)
			}
			if got := observe(t, head); got != before {
				t.Errorf("%s: folding into the clone at %d changed the original:\n%s\nwas\n%s", name, k, got, before)
			}
		}
	}
}

func TestRestoreRejectsWhatNoContextWrites(t *testing.T) {
	for name, s := range map[string]*State{
		"bad meta":            {Meta: []byte("{")},
		"bad entry":           {Entries: []StateEntry{{Msg: []byte(`{"type":`)}}},
		"empty entry":         {Entries: []StateEntry{{}}},
		"both":                {Entries: []StateEntry{{Msg: []byte("{}"), Turn: &StateTurn{}}}},
		"outputs for no call": {Entries: []StateEntry{{Turn: &StateTurn{Outputs: [][]byte{nil}}}}},
		"bad output":          {Open: &StateTurn{Calls: []string{"a"}, Outputs: [][]byte{[]byte("x")}}},
	} {
		if _, err := Restore(s); err == nil {
			t.Errorf("Restore(%s) = nil error, want one", name)
		}
	}
	if c, err := Restore(&State{}); err != nil || !c.Empty() || !slices.Equal(c.Unpaired(), nil) {
		t.Fatalf("Restore(empty) = %v, %v; want an empty Context", c, err)
	}
}

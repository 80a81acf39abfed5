package fold

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"floe.dev/pkg/omni"
)

// A Clone and its original both fold on, in any order, and each ends
// where the fold of the whole history ends; neither ever sees the other's
// records (the snapshot cache folds the next Task's records while the
// Task's clone folds its own; protocol.md §5 replay equivalence).
func TestCloneAndOriginalFoldOnApart(t *testing.T) {
	for name, recs := range stateCorpus(t) {
		whole := Load(recs)
		want := observe(t, whole)
		for k := 0; k <= len(recs); k++ {
			for _, j := range []int{k, k + 1, (k + len(recs) + 1) / 2, len(recs)} {
				j = min(j, len(recs))
				head := Load(recs[:k])
				first := head.Clone()
				for i := k; i < j; i++ {
					head.Apply(&recs[i])
				}
				second := head.Clone()
				third := second.Clone() // a clone's clone
				// The clone folds a record the original never gets: a
				// request of its own that failed, leaving the context as
				// it was.
				stray := append([]omni.Message{omni.UserText("only in the clone")}, request(omni.StatusFailed, omni.ToolCall("x", "{}", "stray"))...)
				if k == len(recs) {
					probe := Load(recs[:k]).Clone()
					for i := range stray {
						probe.Apply(&stray[i])
					}
					if observe(t, probe) == want {
						t.Fatalf("%s: the stray records change nothing: the check below cannot fail", name)
					}
				}
				for i := k; i < len(recs); i++ {
					first.Apply(&recs[i])
				}
				for i := j; i < len(recs); i++ {
					head.Apply(&recs[i])
					third.Apply(&recs[i])
				}
				for i := range stray {
					second.Apply(&stray[i])
				}
				for who, c := range map[string]*Context{"original": head, "first clone": first, "clone's clone": third} {
					if got := observe(t, c); got != want {
						t.Errorf("%s: split at %d/%d, %s =\n%s\nwant\n%s", name, k, j, who, got, want)
					}
				}
				wantSecond := Load(append(append([]omni.Message(nil), recs[:j]...), stray...))
				if got, w := observe(t, second), observe(t, wantSecond); got != w {
					t.Errorf("%s: split at %d/%d, second clone =\n%s\nwant\n%s", name, k, j, got, w)
				}
			}
		}
	}
}

// Clone costs the same whatever the history's length: it shares the
// entries instead of copying each turn (a Task clones the cached context
// at its start; issue 27's CPU ratio).
func TestCloneDoesNotCopyTheHistory(t *testing.T) {
	allocs := func(tasks int) float64 {
		c := New()
		for i := range tasks {
			m := omni.UserText(fmt.Sprintf("step %d", i))
			c.Apply(&m)
			for _, r := range request(omni.StatusCompleted, omni.ToolCall("x", "{}", fmt.Sprint("c", i))) {
				c.Apply(&r)
			}
			out := omni.ToolCallOutput(fmt.Sprint("c", i), "ok", "")
			c.Apply(&out)
		}
		return testing.AllocsPerRun(20, func() {
			n := c.Clone()
			m := omni.UserText("next")
			n.Apply(&m)
			c.Apply(&m) // the original folds on, as the cache does
		})
	}
	small, large := allocs(10), allocs(2000)
	if large > small+2 {
		t.Fatalf("Clone + one record: %.0f allocations at 2,000 Tasks, %.0f at 10: it copies the history", large, small)
	}
}

// The original folds in one goroutine while its clones fold and read in
// others (the snapshot cache and the Tasks that started from it): -race
// finds any write either makes to what the other reads.
func TestCloneAndOriginalInDifferentGoroutines(t *testing.T) {
	recs := stateCorpus(t)["late outputs"]
	half := len(recs) / 2
	head := Load(recs[:half])
	want := observe(t, Load(recs))
	var wg sync.WaitGroup
	clones := make([]*Context, 4)
	for i := range clones {
		clones[i] = head.Clone()
		wg.Add(1)
		go func(c *Context) {
			defer wg.Done()
			for j := half; j < len(recs); j++ {
				c.Apply(&recs[j])
				_ = c.Messages()
				_ = c.Unpaired()
			}
		}(clones[i])
	}
	for j := half; j < len(recs); j++ {
		head.Apply(&recs[j])
		_ = head.Clone().Messages()
	}
	wg.Wait()
	for i, c := range append(clones, head) {
		if got := observe(t, c); got != want {
			t.Errorf("context %d =\n%s\nwant\n%s", i, got, want)
		}
	}
}

// Backward is Messages newest first, and CallIDs the ids of Messages's
// tool calls, at every point of every history.
func TestBackwardAndCallIDsAgreeWithMessages(t *testing.T) {
	for name, recs := range stateCorpus(t) {
		c := New()
		for k := 0; k <= len(recs); k++ {
			if k > 0 {
				c.Apply(&recs[k-1])
			}
			msgs := c.Messages()
			var ids []string
			for _, m := range msgs {
				if m.Payload.Type == omni.TypeToolCall {
					ids = append(ids, m.Payload.ToolCallID)
				}
			}
			var back []*omni.Message
			for m := range c.Backward() {
				back = append(back, m)
			}
			slices.Reverse(back)
			if got, want := summary(back), summary(msgs); !slices.Equal(got, want) {
				t.Fatalf("%s at %d: Backward reversed =\n%v\nwant\n%v", name, k, got, want)
			}
			if got := slices.Collect(c.CallIDs()); !slices.Equal(got, ids) {
				t.Fatalf("%s at %d: CallIDs = %v, want %v", name, k, got, ids)
			}
			clone := c.Clone()
			for _, id := range ids {
				if !c.HasCall(id) || !clone.HasCall(id) {
					t.Fatalf("%s at %d: HasCall(%q) = %v, in a clone %v, want true", name, k, id, c.HasCall(id), clone.HasCall(id))
				}
			}
			if c.HasCall("no such call") {
				t.Fatalf("%s at %d: HasCall of an id not in the context = true", name, k)
			}
			for range c.Backward() {
				break // stopping early is fine
			}
		}
	}
}

// Messages hands out the same pointers request after request and in every
// clone, the context summary and the interrupted placeholders included:
// the providers encode only what a request does not share with the last
// (wirecache).
func TestMessagesArePointerStable(t *testing.T) {
	var rec []omni.Message
	rec = append(rec, omni.UserText("old"))
	rec = append(rec, request(omni.StatusCompleted, omni.Text(omni.RoleAssistant, "old answer"))...)
	rec = append(rec, omni.CompactionBegin(omni.CompactManual, omni.ModeSummarize, 10, 1),
		omni.Text(omni.RoleAssistant, "[summary]we talked[/summary]"),
		omni.CompactionEnd(omni.CompactManual, omni.ModeSummarize, omni.StatusCompleted),
		omni.SessionMeta(omni.Meta{SessionID: "s"}), omni.UserText("go"))
	rec = append(rec, request(omni.StatusCompleted, omni.ToolCall("exec_command", "{}", "slow"))...)
	rec = append(rec, omni.Abort(""), omni.UserText("next"))
	c := Load(rec)
	first := c.Messages()
	if got := summary(first); len(got) != 5 || got[3] != "tool_call_output:user:slow:"+omni.InterruptedOutput {
		t.Fatalf("Messages() = %v, want a summary, go, the call, its placeholder, next", got)
	}
	st, err := c.State()
	if err != nil {
		t.Fatal(err)
	}
	restored, err := Restore(st)
	if err != nil {
		t.Fatal(err)
	}
	for name, again := range map[string][]*omni.Message{"again": c.Messages(), "a clone's": c.Clone().Messages()} {
		if !slices.Equal(again, first) {
			t.Errorf("%s Messages() = %v, want the same pointers %v", name, again, first)
		}
	}
	r1, r2 := restored.Messages(), restored.Messages()
	if !slices.Equal(r1, r2) || !slices.Equal(summary(r1), summary(first)) {
		t.Errorf("a restored Context's Messages() twice = %v, %v, want the same pointers with %v", summary(r1), summary(r2), summary(first))
	}
}

// HasCall knows every tool_call of a committed turn, an incomplete one
// too, and a clone knows only the calls of its own part.
func TestHasCallOfCompleteAndIncompleteCalls(t *testing.T) {
	cut := omni.ToolCall("exec_command", `{"cmd":`, "cut")
	cut.Payload.StopReason = omni.StatusAborted
	rec := []omni.Message{omni.UserText("go")}
	rec = append(rec, request(omni.StatusCompleted, omni.ToolCall("exec_command", "{}", "done"), cut)...)
	c := Load(rec)
	for _, id := range []string{"done", "cut"} {
		if !c.HasCall(id) {
			t.Errorf("HasCall(%q) = false, want true", id)
		}
	}
	clone := c.Clone()
	later := append([]omni.Message{omni.UserText("more")}, request(omni.StatusCompleted, omni.ToolCall("exec_command", "{}", "later"), cut)...)
	for i := range later {
		c.Apply(&later[i])
	}
	if !c.HasCall("later") || clone.HasCall("later") {
		t.Errorf("HasCall(later) = %v, in the earlier clone %v, want true and false", c.HasCall("later"), clone.HasCall("later"))
	}
	if !clone.HasCall("cut") || !clone.HasCall("done") {
		t.Errorf("the clone lost its own calls")
	}
	for i := range later {
		clone.Apply(&later[i])
	}
	if !clone.HasCall("later") {
		t.Errorf("HasCall(later) in the clone after folding it = false, want true")
	}
}

package fold

import (
	"fmt"
	"slices"
	"testing"

	"floe.dev/pkg/omni"
)

// unpairedWalk is Unpaired as it was: a walk over every entry.
func unpairedWalk(c *Context) []string {
	var ids []string
	c.log.each(func(_ int, e entry) {
		if e.turn == nil {
			return
		}
		for i, id := range e.turn.calls {
			if e.turn.outputs[i] == nil && e.turn.interrupted[id] == nil {
				ids = append(ids, id)
			}
		}
	})
	return ids
}

// Unpaired, read from the index the fold keeps, equals the walk over the
// whole context after every record of every recorded Session, in the
// Context that folded them, in a clone taken at any point that folds on,
// and in a Context restored from its State.
func TestUnpairedEqualsTheWalk(t *testing.T) {
	open := 0 // points with an unpaired call: the check can fail
	for name, recs := range stateCorpus(t) {
		for k := 0; k <= len(recs); k++ {
			c := Load(recs[:k])
			clone := c.Clone()
			for i := k; i <= len(recs); i++ {
				if i > k {
					c.Apply(&recs[i-1])
					clone.Apply(&recs[i-1])
				}
				for who, x := range map[string]*Context{"original": c, "clone": clone} {
					if got, want := x.Unpaired(), unpairedWalk(x); !slices.Equal(got, want) {
						t.Fatalf("%s: cloned at %d, %s after %d records: Unpaired() = %v, the walk %v", name, k, who, i, got, want)
					} else if len(got) > 0 {
						open++
					}
				}
			}
			st, err := c.State()
			if err != nil {
				t.Fatal(err)
			}
			r, err := Restore(st)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := r.Unpaired(), unpairedWalk(c); !slices.Equal(got, want) {
				t.Fatalf("%s: restored: Unpaired() = %v, want %v", name, got, want)
			}
		}
	}
	if open == 0 {
		t.Fatal("no recorded Session has an unpaired call at any point")
	}
	t.Logf("%d points with an unpaired call", open)
}

// A long context with one call still open at its end, as at a Task start.
func longContext(tasks int) *Context {
	c := New()
	for i := range tasks {
		m := omni.UserText(fmt.Sprintf("step %d", i))
		c.Apply(&m)
		for _, r := range request(omni.StatusCompleted, omni.ToolCall("x", "{}", fmt.Sprint("c", i))) {
			c.Apply(&r)
		}
		if i < tasks-1 {
			out := omni.ToolCallOutput(fmt.Sprint("c", i), "ok", "")
			c.Apply(&out)
		}
	}
	return c
}

// Unpaired at a Task start of a 2,000-Task Session: the index against the
// walk it replaced (go test -run x -bench Unpaired ./internal/fold).
func BenchmarkUnpaired(b *testing.B) {
	for _, tasks := range []int{10, 2000} {
		c := longContext(tasks).Clone()
		b.Run(fmt.Sprintf("index/tasks=%d", tasks), func(b *testing.B) {
			for b.Loop() {
				_ = c.Unpaired()
			}
		})
		b.Run(fmt.Sprintf("walk/tasks=%d", tasks), func(b *testing.B) {
			for b.Loop() {
				_ = unpairedWalk(c)
			}
		})
	}
}

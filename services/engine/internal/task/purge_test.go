package task

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine/internal/fold"
	"floe.dev/services/engine/internal/purge"
)

// seqsOf returns the sequences of the Session's messages of class.
func (h *harness) seqsOf(sid, class string) []uint64 {
	h.t.Helper()
	out, err := h.trySeqsOf(sid, class)
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

// trySeqsOf is seqsOf that may fail: a read that a purge overtakes waits
// for messages that are gone (its consumer counted them pending), until
// its deadline.
func (h *harness) trySeqsOf(sid, class string) ([]uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var out []uint64
	err := bus.FollowUntil(ctx, h.env.JS, sid, []string{class}, 0, true, func(sm bus.StreamMsg) error {
		out = append(out, sm.Seq)
		return nil
	})
	return out, err
}

// resumeText is what an engine resuming the Session starts from.
func (h *harness) resumeText(sid string) string {
	h.t.Helper()
	fc := fold.New()
	if _, _, err := trace.Replay(context.Background(), h.env.JS, "", sid, fc.Apply, fc.Reset); err != nil {
		h.t.Fatal(err)
	}
	var b strings.Builder
	for _, m := range fc.Messages() {
		b.Write(omni.MustMarshal(m))
		b.WriteByte('\n')
	}
	return b.String()
}

// An ended Task's partials are purged after the grace period while the
// next Task streams: none of the running Task's partials goes, the
// complete messages all stay, and a resume after the purges starts from
// the same context as before them.
func TestPurgeRemovesEndedTasksPartialsNeverARunningOnes(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"expect_last_user": "one", "steps": [{"text": "The first answer, in pieces.", "chunks": 6}]},
	  {"expect_last_user": "two", "steps": [{"text": "The second answer, slowly, in many small pieces.", "chunks": 20, "delay_ms": 100}]}
	]}`, nil)
	sid := "purge1"
	h.session(sid, omni.ApproveAllowAll)
	const keep = 700 * time.Millisecond
	p := purge.New(h.env.JS, keep, zerolog.Nop())
	var (
		mu    sync.Mutex
		upTos []uint64
	)
	h.deps.PartialsEnded = func(s string, upTo uint64) {
		mu.Lock()
		upTos = append(upTos, upTo)
		mu.Unlock()
		p.Ended(s, upTo)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	h.complete(sid, "t1", "one")
	first := h.seqsOf(sid, omni.ClassPartial)
	if len(first) < 6 {
		t.Fatalf("Task 1 left %d partials, want its 6 deltas and more", len(first))
	}
	mu.Lock()
	end1 := upTos[0]
	mu.Unlock()
	if end1 != first[len(first)-1]+1 {
		t.Fatalf("Task 1 ended with purge bound %d, want its last partial %d + 1", end1, first[len(first)-1])
	}
	complete := len(h.seqsOf(sid, omni.ClassModel)) + len(h.seqsOf(sid, omni.ClassEvent))

	running := h.run(sid, "t2", "two")
	bustest.Eventually(t, 10*time.Second, "Task 1's partials purged while Task 2 streams", func() bool {
		left, err := h.trySeqsOf(sid, omni.ClassPartial)
		return err == nil && len(left) > 0 && left[0] > first[len(first)-1]
	})
	select {
	case <-running:
		t.Fatal("Task 2 ended before Task 1's partials were purged: the test shows nothing")
	default:
	}
	streamed := h.seqsOf(sid, omni.ClassPartial)
	if st := h.wait(running); st != Completed {
		t.Fatalf("t2 status %q", st)
	}
	// Every partial Task 2 had streamed when Task 1's went is still there.
	after := h.seqsOf(sid, omni.ClassPartial)
	for _, s := range streamed {
		if s < end1 {
			t.Fatalf("partial %d below Task 1's bound %d left", s, end1)
		}
		if !contains(after, s) {
			t.Fatalf("Task 2's partial %d was purged while it ran", s)
		}
	}
	before := h.resumeText(sid)
	bustest.Eventually(t, 10*time.Second, "Task 2's partials purged", func() bool {
		left, err := h.trySeqsOf(sid, omni.ClassPartial)
		return err == nil && len(left) == 0
	})
	if got := len(h.seqsOf(sid, omni.ClassModel)) + len(h.seqsOf(sid, omni.ClassEvent)); got <= complete {
		t.Fatalf("%d complete messages after both Tasks, want more than Task 1's %d", got, complete)
	}
	if got := h.resumeText(sid); got != before {
		t.Fatalf("resume after the purge =\n%s\nwant (before it)\n%s", got, before)
	}
}

func contains(s []uint64, v uint64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

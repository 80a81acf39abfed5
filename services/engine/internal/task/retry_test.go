package task

import (
	"testing"

	"floe.dev/pkg/omni"
)

type endWant struct {
	status  string
	attempt int64
	retryIn int64
}

func requestEnds(msgs []omni.Message) []endWant {
	var got []endWant
	for _, m := range msgs {
		if m.Payload.Type == omni.TypeRequestEnd {
			got = append(got, endWant{m.Payload.Status, m.Payload.Attempt, m.Payload.RetryInMs})
		}
	}
	return got
}

// A model that fails, then succeeds: every failed attempt ends with its
// status, its attempt number and the wait before the next one (base·2^(n-1),
// capped); the successful retry reports its attempt; an open text segment
// of a failed attempt is closed (stop, then the complete text with the attempt's status as stop_reason)
// before its request_end; request_begin and request_end alternate.
func TestReconnectLadder(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"text": "Half an ans", "end": false}, {"error": {"status": "timeout", "message": "upstream reset"}}]},
	  {"steps": [{"error": {"status": "failed", "message": "bad gateway"}}]},
	  {"steps": [{"error": {"status": "failed", "message": "bad gateway"}}]},
	  {"steps": [{"text": "Done."}]}
	]}`, func(s *Settings) { s.RetryBase, s.RetryCap, s.RetryMax = 20e6, 50e6, 3 })
	sid := "ladder1"
	h.session(sid, omni.ApproveAllowAll)
	if st := h.wait(h.run(sid, "t1", "hi")); st != Completed {
		t.Fatalf("status %q", st)
	}
	msgs := h.messages(sid)
	want := []endWant{
		{omni.StatusTimeout, 1, 20},
		{omni.StatusFailed, 2, 40},
		{omni.StatusFailed, 3, 50},
		{omni.StatusCompleted, 4, 0},
	}
	got := requestEnds(msgs)
	if len(got) != len(want) {
		t.Fatalf("request_ends %v, want %v%s", got, want, dump(msgs))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("request_end %d = %+v, want %+v%s", i, got[i], want[i], dump(msgs))
		}
	}
	// begin/end alternate, and the half text of attempt 1 is closed before its end.
	open := false
	for i, m := range msgs {
		switch m.Payload.Type {
		case omni.TypeRequestBegin:
			if open {
				t.Fatalf("request_begin@%d inside an open request%s", i, dump(msgs))
			}
			open = true
		case omni.TypeRequestEnd:
			if !open {
				t.Fatalf("request_end@%d without begin%s", i, dump(msgs))
			}
			open = false
		}
	}
	firstEnd := index(msgs, isType(omni.TypeRequestEnd, ""))
	stop := index(msgs, func(m *omni.Message) bool {
		return m.Payload.Type == omni.TypePartialText && m.Payload.EventType == omni.EventStop
	})
	text := index(msgs, func(m *omni.Message) bool {
		return m.Payload.Type == omni.TypeText && m.Payload.Role == omni.RoleAssistant
	})
	if stop < 0 || text < 0 || !(stop < text && text < firstEnd) ||
		msgs[text].Payload.Text != "Half an ans" || msgs[text].Payload.StopReason != omni.StatusTimeout {
		t.Fatalf("failed attempt's text not closed properly (stop@%d text@%d end@%d)%s", stop, text, firstEnd, dump(msgs))
	}
	if n := h.prov.Calls(sid); n != 4 {
		t.Fatalf("model called %d times, want 4", n)
	}
}

// When the ladder is exhausted the last failure reports no further wait
// and the Task fails; an auth failure is never retried.
func TestReconnectLadderExhaustedAndAuthNotRetried(t *testing.T) {
	h := newHarness(t, `{"requests": [
	  {"steps": [{"error": {"status": "timeout", "message": "slow"}}]},
	  {"steps": [{"error": {"status": "failed", "message": "down"}}]},
	  {"steps": [{"text": "never"}]}
	]}`, func(s *Settings) { s.RetryBase, s.RetryCap, s.RetryMax = 20e6, 50e6, 1 })
	sid := "ladder2"
	h.session(sid, omni.ApproveAllowAll)
	if st := h.wait(h.run(sid, "t1", "hi")); st != Failed {
		t.Fatalf("status %q, want failed", st)
	}
	msgs := h.messages(sid)
	want := []endWant{{omni.StatusTimeout, 1, 20}, {omni.StatusFailed, 2, 0}}
	got := requestEnds(msgs)
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("request_ends %v, want %v%s", got, want, dump(msgs))
	}

	h2 := newHarness(t, `{"requests": [
	  {"steps": [{"error": {"status": "auth", "message": "bad key"}}]},
	  {"steps": [{"text": "never"}]}
	]}`, nil)
	sid = "ladder3"
	h2.session(sid, omni.ApproveAllowAll)
	if st := h2.wait(h2.run(sid, "t1", "hi")); st != Failed {
		t.Fatalf("status %q, want failed", st)
	}
	msgs = h2.messages(sid)
	if got := requestEnds(msgs); len(got) != 1 || got[0].status != omni.StatusAuth || got[0].retryIn != 0 {
		t.Fatalf("auth request_ends %v%s", got, dump(msgs))
	}
	if n := h2.prov.Calls(sid); n != 1 {
		t.Fatalf("model called %d times after auth, want 1", n)
	}
}

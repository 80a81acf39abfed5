package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine"
)

// The reconnect ladder against a fake OpenAI-compatible endpoint: which
// failures are retried, how the attempts and waits show on the stream,
// and when the turn gives up.

// rcRun runs one Task against f and returns its stream and status.
func rcRun(t *testing.T, f *rcFake, tweak func(*engine.Config)) ([]rec, string) {
	t.Helper()
	e := rcEnv(t, f, tweak)
	sid := e.session(rcModel, omni.ApproveAllowAll, nil)
	return e.wait(sid, e.submit(sid, "say hello"))
}

// rcCheckRetriedOnce asserts a first attempt failed with wantStatus (its
// error mentioning wantInError), a retry after RetryBase (30 ms), and a
// completed second attempt.
func rcCheckRetriedOnce(t *testing.T, rs []rec, status, wantStatus, wantInError string) {
	t.Helper()
	if status != omni.StatusCompleted {
		t.Fatalf("task status = %q, want completed; stream:\n%v", status, labels(rs, nil))
	}
	checkDiscipline(t, rs)
	got := rcFromFirstBegin(labels(rs, noPartials))
	want := []string{
		"request_begin", "token_usage", "request_end:" + wantStatus,
		"request_begin", "text", "token_usage", "request_end:completed",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("stream =\n%v\nwant\n%v", got, want)
	}
	ends := rcPayloads(rs, omni.TypeRequestEnd)
	first, second := ends[0], ends[1]
	if first.Attempt != 1 || first.RetryInMs != 30 || !strings.Contains(first.ErrorMessage, wantInError) {
		t.Errorf("first request_end = attempt %d, retry_in_ms %d, error %q; want attempt 1, retry_in_ms 30, error containing %q",
			first.Attempt, first.RetryInMs, first.ErrorMessage, wantInError)
	}
	if second.Attempt != 2 || second.RetryInMs != 0 || second.ErrorMessage != "" {
		t.Errorf("second request_end = %+v, want completed with attempt 2 and no retry", second)
	}
	if texts := rcPayloads(rs, omni.TypeText); texts[len(texts)-1].Text != "Hello there!" {
		t.Errorf("answer = %q", texts[len(texts)-1].Text)
	}
}

func TestReconnectAfter500ThenSucceeds(t *testing.T) {
	f := rcNewFake(t, rcReject(500, rcBody500), rcAnswer("Hello there!"))
	rs, status := rcRun(t, f, nil)
	rcCheckRetriedOnce(t, rs, status, omni.StatusTimeout, "HTTP 500")
	if n := f.requests(); n != 2 {
		t.Errorf("fake got %d requests, want 2", n)
	}
	// The retry resends the same context plus one [turn_retried] block.
	b0, b1 := f.body(0), f.body(1)
	if len(b1.Messages) != len(b0.Messages)+1 || len(b1.retriedBlocks()) != 1 {
		t.Errorf("retry body has %d messages (%d [turn_retried]), first had %d", len(b1.Messages), len(b1.retriedBlocks()), len(b0.Messages))
	}
	if b1.Model != "gpt-4o-mini" || !b1.Stream {
		t.Errorf("retry body model %q stream %v", b1.Model, b1.Stream)
	}
}

func TestReconnectAfter429ThenSucceeds(t *testing.T) {
	f := rcNewFake(t, rcReject(429, rcBody429, "Retry-After", "20"), rcAnswer("Hello there!"))
	rs, status := rcRun(t, f, nil)
	rcCheckRetriedOnce(t, rs, status, omni.StatusTimeout, "Rate limit reached")
}

func TestReconnectAfterSlowFirstByte(t *testing.T) {
	// The only test with a short idle timeout: the fake answers the retry
	// at once, so a loaded machine does not trip it.
	f := rcNewFake(t, rcStall(), rcAnswer("Hello there!"))
	rs, status := rcRun(t, f, func(c *engine.Config) { c.RequestTimeout = time.Second })
	rcCheckRetriedOnce(t, rs, status, omni.StatusTimeout, "no data from provider")
}

func TestReconnectSkippedOnAuth(t *testing.T) {
	f := rcNewFake(t, rcReject(401, rcBody401))
	rs, status := rcRun(t, f, nil)
	if status != omni.StatusFailed {
		t.Fatalf("task status = %q, want failed", status)
	}
	got := rcFromFirstBegin(labels(rs, noPartials))
	want := []string{"request_begin", "token_usage", "request_end:auth"}
	if !slices.Equal(got, want) {
		t.Fatalf("stream =\n%v\nwant\n%v", got, want)
	}
	end := rcPayloads(rs, omni.TypeRequestEnd)[0]
	if end.Attempt != 1 || end.RetryInMs != 0 || !strings.Contains(end.ErrorMessage, "Incorrect API key") {
		t.Errorf("request_end = %+v, want auth, attempt 1, no retry_in_ms, the provider's message", end)
	}
	if n := f.requests(); n != 1 {
		t.Errorf("fake got %d requests, want 1", n)
	}
}

// Six failures in a row: attempts 1..6 (RetryMax 5 reconnects), the last
// request_end has no retry_in_ms, and the Task fails.
func TestReconnectGivesUpAfterRetryMax(t *testing.T) {
	var replies []rcReply
	for range 6 {
		replies = append(replies, rcReject(500, rcBody500))
	}
	f := rcNewFake(t, replies...)
	rs, status := rcRun(t, f, nil)
	if status != omni.StatusFailed {
		t.Fatalf("task status = %q, want failed", status)
	}
	ends := rcPayloads(rs, omni.TypeRequestEnd)
	if len(ends) != 6 || len(rcPayloads(rs, omni.TypeRequestBegin)) != 6 {
		t.Fatalf("%d request_begin, %d request_end, want 6 each:%s", len(rcPayloads(rs, omni.TypeRequestBegin)), len(ends), rcDescribeEnds(ends))
	}
	for i, e := range ends {
		if e.Status != omni.StatusTimeout || e.Attempt != int64(i+1) {
			t.Errorf("request_end %d: status %s attempt %d, want timeout attempt %d", i+1, e.Status, e.Attempt, i+1)
		}
		if last := i == len(ends)-1; last != (e.RetryInMs == 0) {
			t.Errorf("request_end %d: retry_in_ms %d (only the last has none)", i+1, e.RetryInMs)
		}
	}
	got := rcFromFirstBegin(labels(rs, noPartials))
	if got[len(got)-1] != "request_end:timeout" {
		t.Errorf("stream does not end with the last request_end: %v", got)
	}
	if n := f.requests(); n != 6 {
		t.Errorf("fake got %d requests, want 6", n)
	}
}

// The waits double from RetryBase and stop at RetryCap; a success on the
// last allowed attempt completes the turn.
func TestReconnectWaitsDoubleUpToCap(t *testing.T) {
	replies := []rcReply{
		rcReject(500, rcBody500), rcReject(503, `{"error":{"message":"overloaded","type":"server_error"}}`),
		rcReject(429, rcBody429), rcReject(502, "<html><body>502 Bad Gateway</body></html>"),
		rcReject(500, rcBody500), rcAnswer("Hello there!"),
	}
	f := rcNewFake(t, replies...)
	rs, status := rcRun(t, f, func(c *engine.Config) { c.RetryBase, c.RetryCap = 20*time.Millisecond, 70*time.Millisecond })
	if status != omni.StatusCompleted {
		t.Fatalf("task status = %q, want completed", status)
	}
	ends := rcPayloads(rs, omni.TypeRequestEnd)
	var waits []int64
	for _, e := range ends {
		waits = append(waits, e.RetryInMs)
	}
	if want := []int64{20, 40, 70, 70, 70, 0}; !slices.Equal(waits, want) {
		t.Fatalf("retry_in_ms = %v, want %v:%s", waits, want, rcDescribeEnds(ends))
	}
	if last := ends[len(ends)-1]; last.Status != omni.StatusCompleted || last.Attempt != 6 {
		t.Errorf("last request_end = %+v, want completed attempt 6", last)
	}
}

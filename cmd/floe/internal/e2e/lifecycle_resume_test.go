package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine"
)

// lcRewriteScript replaces the script behind a scripted model reference. A
// restarted engine reads it afresh, with its per-Session counters at zero.
func lcRewriteScript(t *testing.T, ref string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(strings.TrimPrefix(ref, "scripted:"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// lcUsages returns the payloads of the token_usage events in rs.
func lcUsages(rs []rec) []omni.Payload {
	var out []omni.Payload
	for _, r := range rs {
		if label(r) == "token_usage" {
			out = append(out, r.msg.Payload)
		}
	}
	return out
}

// lcContextQuarter is what the scripted model's usage estimate says about
// a request's context: total - output = ceil(context characters / 4).
func lcContextQuarter(p omni.Payload) int64 { return p.Request.Total - p.Request.Output }

// The acceptance case: a compaction triggered by context, three more turns
// (one with a tool call, one retried after a failed attempt), then the
// whole stack stops and a new one starts on the same home. The Session
// continues from its Trace: the resumed context is the summary plus the
// three turns (completed requests only, pairing intact, no runner awaited),
// the usage and turn counters and the tool-call ids go on, and the Trace
// still has two files.
func TestLifecycleResumeAfterRestartFromTrace(t *testing.T) {
	e := lcStart(t, "", envOpts{})
	const summary = "We said hello twice."
	text := func(s string, total int64) map[string]any {
		return map[string]any{"steps": []any{map[string]any{"text": s}}, "usage": map[string]any{"total": total, "output": 3}}
	}
	ref := e.script(map[string]any{"requests": []any{
		text("answer one", 200000), // over maxContextLength: the next Task compacts first
		map[string]any{"expect_last_user": lcCompactionPrompt, "steps": []any{map[string]any{"text": "[summary]" + summary + "[/summary]"}},
			"usage": map[string]any{"total": 900, "output": 9}},
		map[string]any{"expect_last_user": "second", "steps": []any{map[string]any{"text": "answer two"}}, "usage": map[string]any{"total": 950, "output": 3}},
		map[string]any{"expect_last_user": "third", "steps": []any{call("t3", "echo three")}, "usage": map[string]any{"total": 990, "output": 3}},
		map[string]any{"expect_tool_outputs": []string{"t3"}, "steps": []any{map[string]any{"text": "answer three"}}, "usage": map[string]any{"total": 999, "output": 3}},
		// The fourth turn fails once mid-answer (estimated usage), then completes.
		map[string]any{"expect_last_user": "fourth", "steps": []any{map[string]any{"text": "half an ans", "end": false},
			map[string]any{"error": map[string]any{"status": "timeout", "message": "reset"}}}},
		map[string]any{"expect_last_user": "[turn_retried]", "steps": []any{map[string]any{"text": "answer four"}}, "usage": map[string]any{"total": 1000, "output": 3}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, func(r *omni.SessionRecord) {
		r.Compaction = omni.CompactionConfig{MaxContextLength: 100000}
	})
	var rs []rec
	for _, prompt := range []string{"first", "second", "third", "fourth"} {
		all, status := e.wait(sid, e.submit(sid, prompt))
		lcRequireStatus(t, all[len(rs):], status, omni.StatusCompleted)
		rs = all
	}
	if n := len(labels(rs, func(r rec) bool { return label(r) == "compaction_end:completed" })); n != 1 {
		t.Fatalf("%d completed compactions before the restart, want 1", n)
	}
	before := e.lcTrace(sid)
	if len(before) != 2 {
		t.Fatalf("%d trace files before the restart, want 2", len(before))
	}
	want := []string{
		"user:" + omni.Block(omni.TagContextSummary, summary),
		"user:second", "assistant:answer two",
		"user:third", "tool_call:t3", "out:t3:three", "assistant:answer three",
		"user:fourth", "assistant:answer four",
	}
	lcSameLabels(t, "context in the Trace", lcCtxLabels(engine.ModelContext(lcTraceMsgs(before))), want)
	u := lcUsages(rs)
	failedAttempt := u[len(u)-2] // the fourth turn's failed attempt: context through "fourth"
	lastSession := *u[len(u)-1].Session

	// Restart everything on the same home. The new engine's scripted model
	// starts its count for the Session afresh.
	lcRewriteScript(t, ref, map[string]any{"requests": []any{
		// The Session used t3 already: a resumed engine must give this call
		// a fresh id.
		map[string]any{"expect_last_user": "fifth", "steps": []any{call("t3", "echo five")}},
		map[string]any{"expect_last_user": "five", "steps": []any{map[string]any{"text": "answer five"}}, "usage": map[string]any{"total": 1200, "output": 4}},
		map[string]any{"expect_last_user": lcCompactionPrompt, "steps": []any{map[string]any{"text": "[summary]later[/summary]"}}},
	}})
	e = e.restart()
	all, status := e.wait(sid, e.submit(sid, "fifth"))
	got := all[len(rs):]
	lcRequireStatus(t, got, status, omni.StatusCompleted)
	lcNoFailedRequests(t, got)
	ls := labels(got, noPartials)
	if indexOf(ls, "session_meta") >= 0 || indexOf(ls, "tool_list_ready") >= 0 || indexOf(ls, "tool_call_output:t3") >= 0 {
		t.Fatalf("resumed Task republished the head or awaited an old call: %v", ls)
	}
	var newID string
	for _, r := range got {
		if r.class == omni.ClassModel && r.msg.Payload.Type == omni.TypeToolCall {
			newID = r.msg.Payload.ToolCallID
		}
	}
	if newID == "" || newID == "t3" {
		t.Fatalf("the resumed Session reused tool call id %q", newID)
	}
	// The first request after the restart saw the context the Trace holds
	// plus the new prompt: against the failed attempt's context (which
	// ended at "fourth"), exactly "answer four" and "fifth" more, 16
	// characters, 4 estimated tokens.
	u = lcUsages(got)
	if d := lcContextQuarter(u[0]) - lcContextQuarter(failedAttempt); d != 4 {
		t.Fatalf("the resumed request's context is %d estimated tokens larger than before the restart, want 4 (answer four + fifth)", d)
	}
	// Counters: the Session's usage goes on from where it was.
	if s := u[0].Session; s.Total != lastSession.Total+u[0].Request.Total || s.Output != lastSession.Output+u[0].Request.Output {
		t.Fatalf("session usage after the restart = %+v, want %+v plus %+v", *s, lastSession, *u[0].Request)
	}
	// The turn counter too: a manual compaction reports 4 turns since the
	// last compaction before the restart plus 2 after it.
	ctask := e.submitTask(sid, omni.TaskCompact)
	all2, status := e.wait(sid, ctask)
	lcRequireStatus(t, all2[len(all):], status, omni.StatusCompleted)
	if p := lcPayload(t, all2[len(all):], "compaction_begin"); p.Turns != 6 || p.Context != 1200 {
		t.Fatalf("compaction_begin after the restart: turns %d context %d, want 6 and 1200", p.Turns, p.Context)
	}
	afterFiles := e.lcTrace(sid)
	if len(afterFiles) != 3 {
		t.Fatalf("%d trace files after the restart and a compaction, want 3", len(afterFiles))
	}
	if !bytes.Equal(bytes.Join(before[1].lines, nil), bytes.Join(afterFiles[1].lines[:len(before[1].lines)], nil)) {
		t.Fatalf("the restart rewrote the Trace")
	}
	lcSameGroups(t, "trace _002 after the restart", lcMsgLabels(afterFiles[1].msgs[len(before[1].msgs):]), lcGroups(
		lcSeq("text", "request_begin", "tool_call:"+newID),
		[][]string{{"approval_decision:allow:" + newID, "token_usage", "request_end:completed", "tool_call_output:" + newID}},
		lcSeq("request_begin", "text", "token_usage", "request_end:completed",
			"compaction_begin", "text", "request_begin", "text", "token_usage", "request_end:completed", "compaction_end:completed"),
	)...)
	lcSameLabels(t, "trace _003 after the restart", lcMsgLabels(afterFiles[2].msgs), []string{"session_meta", "tool_list_ready", "text"})
}

// lcPublishAs appends m to the Session's stream as an engine would.
func lcPublishAs(t *testing.T, e *env, sid string, m omni.Message) {
	t.Helper()
	nm, err := bus.SessionMsg(sid, &m, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.JS.PublishMsg(context.Background(), nm); err != nil {
		t.Fatal(err)
	}
}

// A compaction whose engine died between compaction_begin and
// compaction_end is closed with a failed compaction_end before anything
// else is appended; the old context stays.
func TestLifecycleResumeClosesCompactionThatDied(t *testing.T) {
	e := lcStart(t, "", envOpts{})
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"text": "answer one"}}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, nil)
	rs, status := e.wait(sid, e.submit(sid, "first"))
	lcRequireStatus(t, rs, status, omni.StatusCompleted)
	lcPublishAs(t, e.env, sid, omni.CompactionBegin(omni.CompactContext, omni.ModeSummarize, 4242, 1))
	e.lcTrace(sid) // the tracer has it

	lcRewriteScript(t, ref, map[string]any{"requests": []any{
		map[string]any{"expect_last_user": "second", "steps": []any{map[string]any{"text": "answer two"}}},
	}})
	e = e.restart()
	all, status := e.wait(sid, e.submit(sid, "second"))
	got := all[len(rs)+1:]
	lcRequireStatus(t, got, status, omni.StatusCompleted)
	lcNoFailedRequests(t, got)
	lcSameLabels(t, "resumed Task", labels(got, noPartials), []string{
		"compaction_end:failed", "text", "request_begin", "text", "token_usage", "request_end:completed",
	})
	if p := lcPayload(t, got, "compaction_end:failed"); p.Reason != omni.CompactContext || p.Mode != omni.ModeSummarize {
		t.Fatalf("compaction_end = %+v, want the dead compaction's reason and mode", p)
	}
	files := e.lcTrace(sid)
	if len(files) != 1 {
		t.Fatalf("%d trace files, want 1", len(files))
	}
	lcSameLabels(t, "context", lcCtxLabels(engine.ModelContext(files[0].msgs)), []string{
		"user:first", "assistant:answer one", "user:second", "assistant:answer two",
	})
}

// lcDamageAndResume runs one Task, stops the stack, lets damage change the
// Trace file, restarts and runs a second Task that must complete; it
// returns the second Task's stream and the Trace file's records.
func lcDamageAndResume(t *testing.T, damage func(t *testing.T, path string)) ([]rec, []omni.Message, []*trace.LineError) {
	e := lcStart(t, "", envOpts{})
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"thinking": "hm"}, map[string]any{"text": "answer one"}}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, nil)
	rs, status := e.wait(sid, e.submit(sid, "first"))
	lcRequireStatus(t, rs, status, omni.StatusCompleted)
	files := e.lcTrace(sid)
	if len(files) != 1 {
		t.Fatalf("%d trace files", len(files))
	}
	lcRewriteScript(t, ref, map[string]any{"requests": []any{
		map[string]any{"expect_last_user": "second", "steps": []any{map[string]any{"text": "answer two"}}},
	}})
	e.stop()
	damage(t, files[0].path)
	e = e.restart()
	all, status := e.wait(sid, e.submit(sid, "second"))
	got := all[len(rs):]
	lcRequireStatus(t, got, status, omni.StatusCompleted)
	lcNoFailedRequests(t, lcAfter(got, "text")) // the Task's own requests
	e.lcTraced(sid)
	data, err := os.ReadFile(files[0].path)
	if err != nil {
		t.Fatal(err)
	}
	msgs, skipped, err := trace.Read(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return got, msgs, skipped
}

// A Trace cut in the middle of its last line (a crash mid-write) resumes:
// the torn record is skipped in the file, the engine takes the Session
// from the stream (which still holds it whole), so the request the torn
// record ended is not reopened, and the new Task's first request is not
// dressed up as a retry.
func TestLifecycleResumeFromTraceWithTornLastLine(t *testing.T) {
	got, msgs, skipped := lcDamageAndResume(t, func(t *testing.T, path string) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		data = bytes.TrimSuffix(data, []byte("\n"))
		last := bytes.LastIndexByte(data, '\n') + 1
		if !strings.Contains(string(data[last:]), `"request_end"`) {
			t.Fatalf("last line is not the request_end: %s", data[last:])
		}
		if err := os.Truncate(path, int64(last+(len(data)-last)/2)); err != nil {
			t.Fatal(err)
		}
	})
	lcSameLabels(t, "resumed Task", labels(got, noPartials), []string{
		"text", "request_begin", "text", "token_usage", "request_end:completed",
	})
	if len(skipped) != 1 {
		t.Fatalf("skipped lines = %v, want the torn one", skipped)
	}
	lcSameLabels(t, "context", lcCtxLabels(engine.ModelContext(msgs)), []string{
		"user:first", "user:second", "assistant:answer two",
	})
}

// A Trace with a garbage line in the middle resumes without it.
func TestLifecycleResumeFromTraceWithGarbageMiddleLine(t *testing.T) {
	got, msgs, skipped := lcDamageAndResume(t, func(t *testing.T, path string) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := bytes.SplitAfter(data, []byte("\n"))
		for i, l := range lines {
			if bytes.Contains(l, []byte(`"thinking"`)) && !bytes.Contains(l, []byte(`"partial`)) {
				// Same length, so the tracer's recorded size still fits.
				lines[i] = append(bytes.Repeat([]byte("#"), len(l)-1), '\n')
			}
		}
		if err := os.WriteFile(path, bytes.Join(lines, nil), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	lcSameLabels(t, "resumed Task", labels(got, noPartials), []string{
		"text", "request_begin", "text", "token_usage", "request_end:completed",
	})
	if len(skipped) != 1 {
		t.Fatalf("skipped lines = %v, want the garbage one", skipped)
	}
	lcSameLabels(t, "context", lcCtxLabels(engine.ModelContext(msgs)), []string{
		"user:first", "assistant:answer one", "user:second", "assistant:answer two",
	})
}

package e2e

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/omni"
)

// Steering reaches the model at the next input assembly as a
// [user_steering] user text, streamed and traced: after a turn's tool
// outputs it goes in beside them; after a turn without tool calls the Task
// goes on with it instead of ending. Steering sent once the run is over has
// nobody to take it and is discarded.
func TestLifecycleSteering(t *testing.T) {
	e := lcStart(t, "", envOpts{})
	steer1 := omni.Block(omni.TagUserSteering, "use the left door")
	steer2 := omni.Block(omni.TagUserSteering, "and say goodbye")
	ref := e.script(map[string]any{"requests": []any{
		// The tool waits for the test to release it, so the steering
		// surely arrives while the turn's tools run.
		map[string]any{"steps": []any{map[string]any{"tool_call": map[string]any{"name": "exec_command", "id": "gate",
			"arguments": map[string]any{"description": "wait", "cmd": "while [ ! -f release ]; do sleep 0.05; done; echo released"}}}}},
		map[string]any{"expect_last_user": steer1, "expect_tool_outputs": []string{"gate"},
			"steps": []any{map[string]any{"text": "Taking the left door, slowly and carefully.", "chunks": 12, "delay_ms": 250}}},
		map[string]any{"expect_last_user": steer2, "expect_tool_outputs": []string{},
			"steps": []any{map[string]any{"text": "Goodbye."}}},
		map[string]any{"expect_last_user": "next task", "steps": []any{map[string]any{"text": "Fresh start."}}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, nil)
	task := e.submit(sid, "walk through the house")

	e.lcFollow(sid, nil, "the gate tool to run", func(r rec) bool { return label(r) == "approval_decision:allow:gate" })
	e.lcMustControl(sid, omni.CtlSteer, omni.Control{Text: "use the left door"})
	if err := os.WriteFile(filepath.Join(e.ws, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Steer again while the next answer (no tool calls) streams.
	begins := 0
	e.lcFollow(sid, nil, "the second answer to stream", func(r rec) bool {
		if label(r) == "request_begin" {
			begins++
		}
		return begins == 2 && label(r) == "partial_text:delta"
	})
	e.lcMustControl(sid, omni.CtlSteer, omni.Control{Text: "and say goodbye"})
	rs, status := e.wait(sid, task)
	lcRequireStatus(t, rs, status, omni.StatusCompleted)
	lcNoFailedRequests(t, rs)
	checkDiscipline(t, rs)
	want := lcGroups(
		lcSeq("session_meta", "tool_list_ready", "text",
			"request_begin", "tool_call:gate"),
		[][]string{{"approval_decision:allow:gate", "token_usage", "request_end:completed", "tool_call_output:gate"}},
		lcSeq("text", // steer1, after the output
			"request_begin", "text", "token_usage", "request_end:completed",
			"text", // steer2: the Task goes on
			"request_begin", "text", "token_usage", "request_end:completed"),
	)
	lcSameGroups(t, "stream", labels(rs, noPartials), want...)
	var texts []string
	for _, r := range rs {
		if r.class == omni.ClassModel && r.msg.Payload.Type == omni.TypeText && r.msg.Payload.Role == omni.RoleUser {
			texts = append(texts, r.msg.Payload.Text)
		}
	}
	lcSameLabels(t, "user texts on the stream", texts, []string{"walk through the house", steer1, steer2})

	// After the run: nobody serves the control subject; the steering is lost.
	_, err := e.lcControl(sid, omni.CtlSteer, omni.Control{Text: "too late"})
	if !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("steer after the run: err = %v, want no responders", err)
	}
	task2 := e.submit(sid, "next task")
	rs2, status := e.wait(sid, task2)
	lcRequireStatus(t, rs2, status, omni.StatusCompleted)
	lcNoFailedRequests(t, rs2)

	files := e.lcTrace(sid)
	if len(files) != 1 {
		t.Fatalf("%d trace files", len(files))
	}
	lcSameGroups(t, "trace", lcMsgLabels(files[0].msgs), append(want, lcSeq("text", "request_begin", "text", "token_usage", "request_end:completed")...)...)
	lcSameLabels(t, "user texts in the Trace", lcUserTexts(files[0].msgs), []string{"walk through the house", steer1, steer2, "next task"})
	for _, l := range files[0].lines {
		if strings.Contains(string(l), "too late") {
			t.Fatalf("late steering in the Trace: %s", l)
		}
	}
	lcSameLabels(t, "model context", lcCtxLabels(lcContextOf(files[0].msgs)), []string{
		"user:walk through the house", "tool_call:gate", "out:gate:released",
		"user:" + steer1, "assistant:Taking the left door, slowly and carefully.",
		"user:" + steer2, "assistant:Goodbye.",
		"user:next task", "assistant:Fresh start.",
	})
}

// Steering that arrives during the last turn max_turns allows is never
// submitted to a request: the run ends with the notice (no abort) and the
// steering is kept as model-only carry-over for the next run (seed: "unsubmitted input is
// kept as carry-over").
func TestLifecycleSteeringUnsubmittedAtMaxTurnsIsCarriedOver(t *testing.T) {
	e := lcStart(t, "", envOpts{})
	ref := e.script(map[string]any{"requests": []any{
		map[string]any{"steps": []any{map[string]any{"tool_call": map[string]any{"name": "exec_command", "id": "gate",
			"arguments": map[string]any{"description": "wait", "cmd": "while [ ! -f release ]; do sleep 0.05; done; echo released"}}}}},
		// Image-only input: the last user text is then the carry-over.
		map[string]any{"expect_last_user": omni.Block(omni.TagUserSteering, "check the attic too"), "expect_tool_outputs": []string{"gate"},
			"steps": []any{map[string]any{"text": "Checking the attic."}}},
	}})
	sid := e.session(ref, omni.ApproveAllowAll, func(r *omni.SessionRecord) { r.MaxTurns = 1 })
	task := e.submit(sid, "look in the cellar")
	e.lcFollow(sid, nil, "the gate tool to be approved", func(r rec) bool { return label(r) == "approval_decision:allow:gate" })
	e.lcMustControl(sid, omni.CtlSteer, omni.Control{Text: "check the attic too"})
	if err := os.WriteFile(filepath.Join(e.ws, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rs, status := e.wait(sid, task)
	lcRequireStatus(t, rs, status, omni.StatusFailed)
	ls := labels(rs, noPartials)
	if ls[len(ls)-1] != "text" || indexOf(ls, "abort") >= 0 {
		t.Fatalf("want the max-turns notice last and no abort: %v", ls)
	}
	for _, r := range rs {
		if strings.Contains(string(r.raw), "attic") {
			t.Fatalf("unsubmitted steering on the stream: %s", r.raw)
		}
	}
	rec, _, err := e.st.Sessions.Get(t.Context(), sid)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.CarryOver) != 1 || rec.CarryOver[0].Text != omni.Block(omni.TagUserSteering, "check the attic too") {
		t.Fatalf("carry-over = %+v", rec.CarryOver)
	}
	task2 := e.submitTask(sid, omni.TaskRun, omni.InputPart{Type: "image_url", ImageURL: "data:image/png;base64,iVBORw0KGgo="})
	rs2, status := e.wait(sid, task2)
	lcRequireStatus(t, rs2[len(rs):], status, omni.StatusCompleted)
	lcNoFailedRequests(t, rs2)
	for _, l := range lcTraceMsgs(e.lcTrace(sid)) {
		if strings.Contains(l.Payload.Text, "attic") && l.Payload.Role == omni.RoleUser {
			t.Fatalf("unsubmitted steering in the Trace: %+v", l.Payload)
		}
	}
}

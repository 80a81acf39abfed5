package protoe2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"floe.dev/services/gateway/client"
)

// The Go side's own checks of exact resume, without the npm clients: a cut
// AG-UI run and a cut A2A stream resumed on the other replica after it
// restarted, compared event for event with a full replay.

type sseEvent struct {
	ID   string
	Data map[string]any
}

// readSSE reads events from resp until stop(ev) (included) or the end.
func readSSE(t *testing.T, resp *http.Response, stop func(sseEvent) bool) []sseEvent {
	t.Helper()
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("stream answered %d", resp.StatusCode)
	}
	var out []sseEvent
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 8<<20)
	var id string
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if len(data) == 0 {
				continue
			}
			ev := sseEvent{ID: id}
			if err := json.Unmarshal([]byte(strings.Join(data, "\n")), &ev.Data); err != nil {
				t.Fatalf("event %s: %v", id, err)
			}
			id, data = "", nil
			out = append(out, ev)
			if stop != nil && stop(ev) {
				return out
			}
		case strings.HasPrefix(line, "id: "):
			id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			data = append(data, strings.TrimPrefix(line, "data: "))
		}
	}
	return out
}

func request(t *testing.T, ctx context.Context, method, url, lastID string, body any) *http.Response {
	t.Helper()
	var rd *strings.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = strings.NewReader(string(b))
	} else {
		rd = strings.NewReader("")
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return resp
}

// pos orders ids <epoch>-<seq>[:k].
func pos(t *testing.T, id string) [2]int64 {
	t.Helper()
	_, rest, _ := strings.Cut(id, "-")
	seqS, kS, hasK := strings.Cut(rest, ":")
	seq, err := strconv.ParseInt(seqS, 10, 64)
	if err != nil {
		t.Fatalf("id %q: %v", id, err)
	}
	k := int64(-1)
	if hasK {
		if k, err = strconv.ParseInt(kS, 10, 64); err != nil {
			t.Fatalf("id %q: %v", id, err)
		}
	}
	return [2]int64{seq, k}
}

func increasing(t *testing.T, evs []sseEvent) {
	t.Helper()
	for i := 1; i < len(evs); i++ {
		a, b := pos(t, evs[i-1].ID), pos(t, evs[i].ID)
		if !(a[0] < b[0] || (a[0] == b[0] && a[1] < b[1])) {
			t.Fatalf("ids not increasing: %s then %s", evs[i-1].ID, evs[i].ID)
		}
	}
}

func restartB(t *testing.T, e *env) {
	t.Helper()
	resp, err := http.Post(e.ctl+"/restart-b", "", nil)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("restart B: %v %v", resp, err)
	}
	resp.Body.Close()
}

func runEnd(ev sseEvent) bool {
	return ev.Data["type"] == "RUN_FINISHED" || ev.Data["type"] == "RUN_ERROR"
}

func TestAGUICutRunResumesExactlyAfterARestart(t *testing.T) {
	e := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := client.New(e.a, client.WithToken(token)).CreateSession(ctx, client.CreateSession{Model: e.slow})
	if err != nil {
		t.Fatal(err)
	}
	runID := "run-go-1"
	cctx, cut := context.WithCancel(ctx)
	contents := 0
	head := readSSE(t, request(t, cctx, http.MethodPost, e.a+"/api/agui", "", map[string]any{
		"threadId": s.ID, "runId": runID, "messages": []any{map[string]any{"id": "u1", "role": "user", "content": "go"}},
	}), func(ev sseEvent) bool {
		if ev.Data["type"] == "TEXT_MESSAGE_CONTENT" {
			contents++
		}
		return contents == 5
	})
	cut()
	if len(head) == 0 || runEnd(head[len(head)-1]) {
		t.Fatalf("the run was not cut mid-way: %d events", len(head))
	}
	restartB(t, e)
	tail := readSSE(t, request(t, ctx, http.MethodGet, fmt.Sprintf("%s/api/agui/%s/%s", e.b, s.ID, runID), head[len(head)-1].ID, nil), runEnd)
	full := readSSE(t, request(t, ctx, http.MethodGet, fmt.Sprintf("%s/api/agui/%s/%s", e.a, s.ID, runID), "", nil), runEnd)
	joined := append(head, tail...)
	increasing(t, joined)
	if !reflect.DeepEqual(joined, full) {
		t.Fatalf("cut + resumed (%d events) differs from the full replay (%d events)", len(joined), len(full))
	}
	if full[0].Data["type"] != "RUN_STARTED" || full[0].Data["runId"] != runID || !runEnd(full[len(full)-1]) {
		t.Fatalf("the replay runs from %v to %v", full[0].Data, full[len(full)-1].Data)
	}
	// A replay after an id in the middle of a message's events (…:k) starts
	// right after it.
	for i, ev := range full {
		if strings.Contains(ev.ID, ":") && i+1 < len(full) {
			got := readSSE(t, request(t, ctx, http.MethodGet, fmt.Sprintf("%s/api/agui/%s/%s", e.b, s.ID, runID), ev.ID, nil), runEnd)
			if !reflect.DeepEqual(got, full[i+1:]) {
				t.Fatalf("after %s: %d events, want the %d after it", ev.ID, len(got), len(full)-i-1)
			}
			break
		}
	}
}

func TestA2AResumeAfterACutIsExactlyTheGap(t *testing.T) {
	e := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := client.New(e.a, client.WithToken(token)).CreateSession(ctx, client.CreateSession{Model: e.slow})
	if err != nil {
		t.Fatal(err)
	}
	rpc := func(method string, params any) map[string]any {
		return map[string]any{"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
	}
	result := func(ev sseEvent) map[string]any { r, _ := ev.Data["result"].(map[string]any); return r }
	terminal := func(ev sseEvent) bool {
		u, _ := result(ev)["statusUpdate"].(map[string]any)
		st, _ := u["status"].(map[string]any)
		return st["state"] == "TASK_STATE_COMPLETED" || st["state"] == "TASK_STATE_FAILED" || st["state"] == "TASK_STATE_CANCELED"
	}
	cctx, cut := context.WithCancel(ctx)
	chunks := 0
	head := readSSE(t, request(t, cctx, http.MethodPost, e.a+"/a2a", "", rpc("SendStreamingMessage", map[string]any{
		"message": map[string]any{"messageId": "m1", "role": "ROLE_USER", "contextId": s.ID, "parts": []any{map[string]any{"text": "go"}}},
	})), func(ev sseEvent) bool {
		if result(ev)["artifactUpdate"] != nil {
			chunks++
		}
		return chunks == 3
	})
	cut()
	task, _ := result(head[0])["task"].(map[string]any)
	taskID, _ := task["id"].(string)
	if taskID == "" {
		t.Fatalf("the stream's first event is not the Task: %v", head[0].Data)
	}
	restartB(t, e)
	tail := readSSE(t, request(t, ctx, http.MethodPost, e.b+"/a2a", head[len(head)-1].ID, rpc("SubscribeToTask", map[string]any{"id": taskID})), terminal)
	if result(tail[0])["task"] != nil {
		t.Fatalf("with Last-Event-ID the Task came first")
	}
	epoch, _, _ := strings.Cut(head[0].ID, "-")
	full := readSSE(t, request(t, ctx, http.MethodPost, e.a+"/a2a", epoch+"-0", rpc("SubscribeToTask", map[string]any{"id": taskID})), terminal)
	joined := append(head[1:], tail...)
	increasing(t, joined)
	// Every update of the Task, once: the full replay from position 0, from
	// the first update the cut stream had on.
	start := -1
	for i, ev := range full {
		if ev.ID == joined[0].ID {
			start = i
		}
	}
	if start < 0 || !reflect.DeepEqual(joined, full[start:]) {
		t.Fatalf("cut + resumed (%d updates) is not the replay's updates from %s (%d of them)", len(joined), joined[0].ID, len(full)-max(start, 0))
	}
	// Without Last-Event-ID: the Task first, holding the gap, then live.
	snap := readSSE(t, request(t, ctx, http.MethodPost, e.b+"/a2a", "", rpc("SubscribeToTask", map[string]any{"id": taskID})), func(sseEvent) bool { return true })
	st, _ := result(snap[0])["task"].(map[string]any)["status"].(map[string]any)
	if st["state"] != "TASK_STATE_COMPLETED" {
		t.Fatalf("a finished Task's subscription starts with %v", snap[0].Data)
	}
}

package gateway_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"floe.dev/services/gateway/client"
)

// An imported Session of 9 Tasks read through the windowed /messages: the
// newest window starts at a Prompt, pages before it join without gap or
// repeat into the whole history, and each record is passed through as
// stored; bad window parameters answer 400.
func TestMessagesWindowPagesTheHistory(t *testing.T) {
	t.Parallel()
	g, ws := importEnv(t, nil)
	ctx := ctxT(t)
	lines := []string{metaLine(importSID, "openai", ws)}
	for i := range 9 {
		lines = append(lines,
			fmt.Sprintf(`{"timestamp": "2026-07-18T03:10:%02d.000Z", "type": "model_msg", "payload": {"type": "text", "role": "user", "text": "prompt %d <b>", "stop_reason": "completed"}}`, i, i),
			fmt.Sprintf(`{"timestamp":"2026-07-18T03:10:%02d.500Z","type":"model_msg","payload":{"type":"text","role":"assistant","text":"answer %d","stop_reason":"completed"}}`, i, i))
	}
	if _, err := g.Alice.ImportTrace(ctx, client.ImportTrace{DataBase64: b64(strings.Join(lines, "\n") + "\n")}); err != nil {
		t.Fatal(err)
	}
	whole, err := g.Alice.Messages(ctx, importSID)
	if err != nil || whole.Window != nil || len(whole.Messages) != len(lines) {
		t.Fatalf("Messages without a window = %d records, window %v, %v; want all %d, no window", len(whole.Messages), whole.Window, err, len(lines))
	}
	newest, err := g.Alice.MessagesWindow(ctx, importSID, 2, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := rawTexts(newest.Messages); !slices.Equal(got, lines[len(lines)-4:]) || newest.Window == nil || !newest.Window.More || newest.Window.Start != "15" {
		t.Fatalf("newest 2 Tasks = %v, window %+v; want the last 4 lines from cursor 15", got, newest.Window)
	}
	var got []string
	page := newest
	for n := 0; ; n++ {
		got = append(rawTexts(page.Messages), got...)
		if !page.Window.More {
			break
		}
		if n > 10 {
			t.Fatal("paging does not end")
		}
		if page, err = g.Alice.MessagesWindow(ctx, importSID, 2, page.Window.Start); err != nil {
			t.Fatal(err)
		}
		if page.Live != nil {
			t.Fatal("a page before a cursor has a live part")
		}
	}
	if !slices.Equal(got, lines) {
		t.Fatalf("pages joined =\n%v\nwant\n%v", got, lines)
	}
	for _, q := range []string{"tailTasks=0", "tailTasks=-1", "tailTasks=x", "tailTasks=10001", "before=x", "before=-1", "tailTasks=1&before=1000"} {
		req, _ := http.NewRequest(http.MethodGet, g.URL+"/api/sessions/"+importSID+"/messages?"+q, nil)
		req.Header.Set("Authorization", "Bearer "+aliceToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(body, &e) != nil || e.Error.Code != "bad_request" {
			t.Errorf("?%s: %d %s, want 400 bad_request", q, resp.StatusCode, body)
		}
	}
	var apiErr *client.APIError
	if _, err := g.Alice.MessagesWindow(ctx, importSID, 1, "99"); !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest {
		t.Fatalf("a cursor past the end: %v, want a 400", err)
	}
}

func rawTexts(msgs []json.RawMessage) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m)
	}
	return out
}

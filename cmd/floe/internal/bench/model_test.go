package bench

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestModelChild: the model server child answers an OpenAI streaming
// request with the answer's chunks and [DONE], refuses a bad one with a
// 400 and goes on serving, reports its own CPU, and exits when told to
// stop.
func TestModelChild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := startModel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer m.stop()
	post := func(body string) (int, string) {
		t.Helper()
		resp, err := http.Post(m.url+"/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	if code, body := post(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`); code != http.StatusOK ||
		!strings.Contains(body, `"content":"The folder holds a Go module"`) || !strings.Contains(body, `"finish_reason":"stop"`) ||
		!strings.Contains(body, `"usage":`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("answer %d:\n%s", code, body)
	}
	// Floe's order (model, messages, then stream) is answered too.
	if code, body := post(`{"model":"m","messages":[{"role":"user","content":"\"messages\":[] \"stream\":false"}],"stream":true}`); code != http.StatusOK {
		t.Fatalf("answer in Floe's key order %d:\n%s", code, body)
	}
	for _, bad := range []string{`{"messages":`, `{"stream":true,"messages":[]}`, `{"messages":[{}]}`, `{"model":"m","messages":[{"content":"\"stream\":true"}]}`} {
		if code, body := post(bad); code != http.StatusBadRequest {
			t.Errorf("request %s: %d %s, want 400", bad, code, body)
		}
	}
	c1, b1, r1, err := m.cpu()
	if err != nil || c1 <= 0 || b1 <= 0 || r1 <= 0 {
		t.Fatalf("cpu() = %v, %v, %v, %v", c1, b1, r1, err)
	}
	for range 20 {
		post(`{"model":"m","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("x", 1<<16) + `"}]}`)
	}
	if c2, b2, r2, err := m.cpu(); err != nil || c2 < c1 || b2 <= b1 || r2 <= r1 {
		t.Fatalf("cpu() after 20 requests = %v, %v, %v, %v; before %v, %v, %v", c2, b2, r2, err, c1, b1, r1)
	}
	m.stop()
	select {
	case <-m.done:
	default:
		t.Fatal("the child has not exited after stop")
	}
}

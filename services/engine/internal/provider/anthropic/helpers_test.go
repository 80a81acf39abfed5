package anthropic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// bound is the longest any test waits for anything.
const bound = 10 * time.Second

// recorder collects the deltas of one Stream call.
type recorder struct {
	mu     sync.Mutex
	deltas []model.Delta
	// onDelta, if set, runs after each delta is recorded.
	onDelta func(model.Delta) error
}

func (r *recorder) emit(d model.Delta) error {
	r.mu.Lock()
	r.deltas = append(r.deltas, d)
	f := r.onDelta
	r.mu.Unlock()
	if f != nil {
		return f(d)
	}
	return nil
}

func (r *recorder) all() []model.Delta {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]model.Delta(nil), r.deltas...)
}

// blockText concatenates the Text of every delta of block n.
func blockText(ds []model.Delta, n int) string {
	var b strings.Builder
	for _, d := range ds {
		if d.Block == n {
			b.WriteString(d.Text)
		}
	}
	return b.String()
}

// endOf returns block n's End delta.
func endOf(t *testing.T, ds []model.Delta, n int) model.Delta {
	t.Helper()
	for _, d := range ds {
		if d.Block == n && d.End {
			return d
		}
	}
	t.Fatalf("block %d has no End delta; deltas: %+v", n, ds)
	return model.Delta{}
}

// checkDeltas verifies the Delta contract: one type per block, nothing after
// a block's End, End at most once, tool-call blocks carry their id on every
// delta and name and id on End, and — when complete — every block ended.
func checkDeltas(ds []model.Delta, complete bool) error {
	typ := map[int]string{}
	ended := map[int]bool{}
	for i, d := range ds {
		switch d.Type {
		case omni.TypeText, omni.TypeThinking, omni.TypeToolCall:
		default:
			return fmt.Errorf("delta %d: type %q", i, d.Type)
		}
		if t, ok := typ[d.Block]; ok && t != d.Type {
			return fmt.Errorf("delta %d: block %d changed type %s → %s", i, d.Block, t, d.Type)
		}
		typ[d.Block] = d.Type
		if ended[d.Block] {
			return fmt.Errorf("delta %d: block %d has a delta after End", i, d.Block)
		}
		if d.Type == omni.TypeToolCall && d.ToolCallID == "" {
			return fmt.Errorf("delta %d: tool_call block %d without tool_call_id", i, d.Block)
		}
		if d.End {
			if d.Text != "" {
				return fmt.Errorf("delta %d: End carries text", i)
			}
			if d.Type == omni.TypeToolCall && d.Name == "" {
				return fmt.Errorf("delta %d: tool_call block %d ends without name", i, d.Block)
			}
			ended[d.Block] = true
		}
	}
	if complete {
		for n := range typ {
			if !ended[n] {
				return fmt.Errorf("block %d never ended", n)
			}
		}
	}
	return nil
}

// sseServer serves one scripted stream per request: each event is written as
// "event: <its type>\ndata: <event>\n\n" and flushed, as the API does. The
// last request body is kept.
type sseServer struct {
	*httptest.Server
	mu      sync.Mutex
	body    []byte
	headers http.Header
}

func newSSEServer(t *testing.T, events ...string) *sseServer {
	t.Helper()
	s := &sseServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.body, s.headers = body, r.Header.Clone()
		s.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events {
			var typ struct {
				Type string `json:"type"`
			}
			json.Unmarshal([]byte(e), &typ)
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ.Type, e)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *sseServer) lastBody() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.body
}

func serve(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// closedPort returns a 127.0.0.1 address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// stall blocks a handler until the client goes away or the test bound. The
// request body is drained first: only then does the server watch the
// connection and cancel r.Context() when the client leaves.
func stall(r *http.Request) {
	io.Copy(io.Discard, r.Body)
	select {
	case <-r.Context().Done():
	case <-time.After(bound):
	}
}

// hijackClose drops the connection under a handler, mid-response.
func hijackClose(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		conn.Close()
	}
}

// stream runs one request against p with a deadline of bound.
func stream(t *testing.T, p *Provider, req *model.Request) ([]model.Delta, model.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	var rec recorder
	res, err := p.Stream(ctx, req, rec.emit)
	if ctx.Err() != nil {
		t.Fatalf("Stream ran into the test bound of %s", bound)
	}
	return rec.all(), res, err
}

func simpleRequest() *model.Request {
	return &model.Request{SessionID: "s1", Model: "claude-sonnet-4-5", Messages: []omni.Message{omni.UserText("hi")}, IDs: &model.IDAllocator{}}
}

func asModelError(t *testing.T, err error) *model.Error {
	t.Helper()
	var me *model.Error
	if !errors.As(err, &me) {
		t.Fatalf("error %v (%T) is not a *model.Error", err, err)
	}
	return me
}

// Package providertest holds what the provider packages' tests share: a
// delta recorder, the Delta contract check, a scripted SSE server,
// helpers that make a provider's connection fail in the ways protocol.md
// §6 maps and the runner of that failure matrix (Failures), and the
// request body's byte-for-byte tests through the wire cache (Wire).
// It is imported by tests only.
package providertest

import (
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

// Bound is the longest any test waits for anything.
const Bound = 10 * time.Second

// Recorder collects the deltas of one Stream call.
type Recorder struct {
	mu     sync.Mutex
	deltas []model.Delta
	// OnDelta, if set, runs after each delta is recorded.
	OnDelta func(model.Delta) error
}

func (r *Recorder) Emit(d model.Delta) error {
	r.mu.Lock()
	r.deltas = append(r.deltas, d)
	f := r.OnDelta
	r.mu.Unlock()
	if f != nil {
		return f(d)
	}
	return nil
}

func (r *Recorder) All() []model.Delta {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]model.Delta(nil), r.deltas...)
}

// BlockText concatenates the Text of every delta of block n.
func BlockText(ds []model.Delta, n int) string {
	var b strings.Builder
	for _, d := range ds {
		if d.Block == n {
			b.WriteString(d.Text)
		}
	}
	return b.String()
}

// EndOf returns block n's End delta.
func EndOf(t *testing.T, ds []model.Delta, n int) model.Delta {
	t.Helper()
	for _, d := range ds {
		if d.Block == n && d.End {
			return d
		}
	}
	t.Fatalf("block %d has no End delta; deltas: %+v", n, ds)
	return model.Delta{}
}

// CheckDeltas verifies the Delta contract: one type per block, nothing after
// a block's End, End at most once, tool-call blocks carry their id on every
// delta and name and id on End, and — when complete — every block ended.
func CheckDeltas(ds []model.Delta, complete bool) error {
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

// SSEServer serves one scripted stream per request: each event is framed
// by frame (the provider's SSE framing) and flushed. The last request body
// and headers are kept.
type SSEServer struct {
	*httptest.Server
	mu      sync.Mutex
	body    []byte
	headers http.Header
	frame   func(event string) string
}

func NewSSEServer(t *testing.T, frame func(event string) string, events ...string) *SSEServer {
	t.Helper()
	s := &SSEServer{frame: frame}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.body, s.headers = body, r.Header.Clone()
		s.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events {
			io.WriteString(w, s.frame(e))
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// Headers returns the last request's headers.
func (s *SSEServer) Headers() http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.headers
}

// LastBody returns the last request's body.
func (s *SSEServer) LastBody() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.body
}

func Serve(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// ClosedPort returns a 127.0.0.1 address nothing listens on.
func ClosedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// Stall blocks a handler until the client goes away or the test Bound. The
// request body is drained first: only then does the server watch the
// connection and cancel r.Context() when the client leaves.
func Stall(r *http.Request) {
	io.Copy(io.Discard, r.Body)
	select {
	case <-r.Context().Done():
	case <-time.After(Bound):
	}
}

// HijackClose drops the connection under a handler, mid-response.
func HijackClose(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		conn.Close()
	}
}

func AsModelError(t *testing.T, err error) *model.Error {
	t.Helper()
	var me *model.Error
	if !errors.As(err, &me) {
		t.Fatalf("error %v (%T) is not a *model.Error", err, err)
	}
	return me
}

// Refs returns pointers to copies of msgs, as model.Request.Messages holds
// them.
func Refs(msgs ...omni.Message) []*omni.Message {
	out := make([]*omni.Message, len(msgs))
	for i := range msgs {
		out[i] = &msgs[i]
	}
	return out
}

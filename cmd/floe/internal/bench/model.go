package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ModelEnv, set to "openai", makes the benchmark program a model server
// child instead (RunModel): a fake hosted model in a process of its own,
// as a deployment's model is, so the long scenario measures Floe's CPU
// without the model's and the engine's provider path (the wire format,
// wirecache, HTTP, SSE decoding) is the one a deployment runs.
const ModelEnv = "FLOE_BENCH_MODEL"

// modelAnswer is what the model server streams for every request, in
// these pieces: the scripted answer of writeAnswerScript.
var modelAnswer = []string{"The folder holds a Go module", " with a README and two packages;", " nothing else stands out."}

// RunModel serves the child side of a model server: an OpenAI-compatible
// POST /v1/chat/completions on a loopback port of its own that reads and
// decodes the whole request (as a hosted model reads its input) and
// streams modelAnswer. It writes its base URL as the first line of
// stdout, answers each "cpu" line on stdin with its process's CPU time so
// far, the time it spent answering requests once read and the time it
// spent reading them (nanoseconds, "cpu busy read"), and exits when stdin closes. It returns the exit
// code.
func RunModel(format string) int {
	if format != "openai" {
		fmt.Fprintf(os.Stderr, "floebench model: unknown format %q (want openai)\n", format)
		return 1
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintf(os.Stderr, "floebench model: %v\n", err)
		return 1
	}
	srv := &http.Server{Handler: http.HandlerFunc(serveChat), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	defer srv.Close()
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintf(out, "http://%s/v1\n", ln.Addr())
	out.Flush()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() != "cpu" {
			fmt.Fprintf(os.Stderr, "floebench model: unknown request %q\n", sc.Text())
			return 1
		}
		fmt.Fprintln(out, int64(processCPU()), modelBusy.Load(), modelRead.Load())
		out.Flush()
	}
	return 0
}

// modelBusy is the time the model server spent on requests from the end
// of reading each body to its [DONE] (its decoding and answering: the
// model's part of a Task's time; the transfer of the body is counted as
// the sender's).
var modelBusy atomic.Int64

// modelRead is the time the model server's handlers spent reading the
// request bodies (from the handler's start, the headers read): the
// transfer of a Task's context over loopback.
var modelRead atomic.Int64

// bodyBufs are the model server's request body buffers.
var bodyBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func serveChat(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.Error(w, `{"error":{"message":"not found"}}`, http.StatusNotFound)
		return
	}
	r0 := time.Now()
	// Into a buffer of the body's length, kept for the next request: a
	// growing io.ReadAll of a late Task's 1.7 MB body copies it many
	// times over, the model server's CPU on Floe's cores.
	buf := bodyBufs.Get().(*bytes.Buffer)
	defer bodyBufs.Put(buf)
	buf.Reset()
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength) + bytes.MinRead) // room for ReadFrom's last read, of EOF
	}
	_, err := buf.ReadFrom(r.Body)
	body := buf.Bytes()
	t0 := time.Now()
	modelRead.Add(int64(t0.Sub(r0)))
	defer func() { modelBusy.Add(int64(time.Since(t0))) }()
	var req chatHead
	if err == nil {
		req, err = readHead(body)
	}
	if err != nil {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	send := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		if fl != nil {
			fl.Flush()
		}
	}
	type delta struct {
		Role    string `json:"role,omitempty"`
		Content string `json:"content,omitempty"`
	}
	type choice struct {
		Index        int     `json:"index"`
		Delta        delta   `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	}
	chunk := func(cs ...choice) map[string]any {
		return map[string]any{"id": "chatcmpl-bench", "object": "chat.completion.chunk", "model": req.Model, "choices": cs}
	}
	for i, s := range modelAnswer {
		d := delta{Content: s}
		if i == 0 {
			d.Role = "assistant"
		}
		send(chunk(choice{Delta: d}))
	}
	stop := "stop"
	send(chunk(choice{FinishReason: &stop}))
	prompt := int64(len(body) / 4)
	c := chunk()
	c["usage"] = map[string]int64{"prompt_tokens": prompt, "completion_tokens": 24, "total_tokens": prompt + 24}
	send(c)
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// chatHead is what selects the model server's answer: the model it
// names, and that the request streams and has messages.
type chatHead struct {
	Model  string `json:"model"`
	Stream bool   `json:"stream"`
}

// readHead reads a request body's chatHead without decoding its
// messages: the answer is the same whatever they say, and decoding a
// late Task's whole context (1.7 MB at 2,000 Tasks) was most of the
// model server's CPU, on the same cores as Floe's. The body must be an
// object whose top-level keys, model among them, come before messages
// (as Floe's openai provider writes them, and json.Marshal of the
// request struct), messages a non-empty array, and stream true among the
// top-level keys (before or after it). A key's quoted name cannot occur inside a JSON string
// (its quotes would be escaped there), so the byte searches find keys.
func readHead(body []byte) (chatHead, error) {
	var h chatHead
	at := bytes.Index(body, []byte(`"messages":`))
	if at < 0 {
		return h, errors.New("no messages")
	}
	// The keys before messages, closed into an object of their own.
	head := append(bytes.TrimRight(slices.Clone(body[:at]), ", \t\r\n"), '}')
	if err := json.Unmarshal(head, &h); err != nil {
		return h, err
	}
	rest := bytes.TrimLeft(body[at+len(`"messages":`):], " \t\r\n")
	if len(rest) < 2 || rest[0] != '[' || bytes.HasPrefix(bytes.TrimLeft(rest[1:], " \t\r\n"), []byte("]")) {
		return h, errors.New("messages is not a non-empty array")
	}
	if !h.Stream && !bytes.Contains(rest, []byte(`"stream":true`)) || !bytes.HasSuffix(bytes.TrimRight(rest, " \t\r\n"), []byte("}")) {
		return h, errors.New("not a streaming request")
	}
	return h, nil
}

// modelServer is the parent's handle on a model server child.
type modelServer struct{ *child }

// startModel starts this program again as a model server child and
// waits for its base URL.
func startModel(ctx context.Context) (*modelServer, error) {
	c, err := startChild(ctx, "model server", ModelEnv+"=openai", "http://")
	if err != nil {
		return nil, err
	}
	return &modelServer{c}, nil
}

// cpu is the child's process CPU time so far, the time it spent
// answering requests (modelBusy) and reading them (modelRead).
func (m *modelServer) cpu() (cpu, busy, read time.Duration, err error) {
	if _, err := io.WriteString(m.in, "cpu\n"); err != nil {
		return 0, 0, 0, fmt.Errorf("bench: model server cpu: %w", err)
	}
	l, err := m.out.ReadString('\n')
	if err != nil {
		return 0, 0, 0, fmt.Errorf("bench: model server cpu: %w", err)
	}
	f := strings.Fields(l)
	if len(f) != 3 {
		return 0, 0, 0, fmt.Errorf("bench: model server cpu: answer %q", l)
	}
	var ns [3]int64
	for i := range f {
		if ns[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
			return 0, 0, 0, fmt.Errorf("bench: model server cpu: %w", err)
		}
	}
	return time.Duration(ns[0]), time.Duration(ns[1]), time.Duration(ns[2]), nil
}

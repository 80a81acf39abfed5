package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine"
)

// ResumeResult is the time to rebuild a Session's model context from a
// Trace of Records records as a resuming engine does (engine.ResumeContext:
// trace.Replay reads the Trace file up to the tracer's position, then the
// stream after it, and the fold takes each record as it is read), median
// of Runs runs with the file in the page cache.
type ResumeResult struct {
	Records     int
	TraceBytes  int64 // the Trace file
	StreamTail  int   // records read from the stream after the position
	Resume      time.Duration
	ContextMsgs int   // messages of the resulting model context
	Alloc       int64 // bytes allocated by one resume
	Runs        int
	// JSONDecode is encoding/json decoding the same Trace file into
	// []map[string]any (median, same runs), JSONAlloc what it allocates.
	JSONDecode time.Duration
	JSONAlloc  int64
}

// jsonDecodeTrace decodes a Trace file with encoding/json into
// []map[string]any: the yardstick of resume.
func jsonDecodeTrace(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	dec := json.NewDecoder(bufio.NewReaderSize(f, 1<<16))
	var out []map[string]any
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if err == io.EOF {
				return len(out), nil
			}
			return len(out), err
		}
		out = append(out, m)
	}
}

// tailRecords is one Task the tracer has not written yet: the resume reads
// it from the stream.
const tailRecords = 20

func runResume(ctx context.Context, c *Config, p *progress) ([]ResumeResult, error) {
	e, err := startEnv(ctx, c.root, "resume", false, c.Log)
	if err != nil {
		return nil, err
	}
	defer e.stop()
	// One message of another Session, so that positions start above zero.
	if err := publishStamped(ctx, e, newSessionID(), "w0"); err != nil {
		return nil, err
	}
	if err := e.flush(ctx); err != nil {
		return nil, err
	}
	// Each size with its last Task in the stream; the smallest also with a
	// tracer that is caught up (nothing after its position).
	type shape struct{ n, tail int }
	var shapes []shape
	for i, n := range c.ResumeRecords {
		if i == 0 {
			shapes = append(shapes, shape{n, 0})
		}
		shapes = append(shapes, shape{n, min(tailRecords, n)})
	}
	var out []ResumeResult
	for _, sh := range shapes {
		n := sh.n
		p.logf("resume: writing a %d-record Trace, %d of them in the stream only", n, sh.tail)
		sid := newSessionID()
		recs := traceRecords(sid, n, time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC))
		size, err := writeTrace(ctx, e, sid, recs, sh.tail)
		if err != nil {
			return nil, err
		}
		r := ResumeResult{Records: n, TraceBytes: size, StreamTail: sh.tail, Runs: c.ResumeRuns}
		var resumes, decodes []float64
		want := len(engine.ModelContext(recs))
		created, _ := omni.SessionCreated(sid)
		path := trace.File(e.home, created, sid, 1)
		for range c.ResumeRuns {
			runtime.GC()
			var j0, j1 runtime.MemStats
			runtime.ReadMemStats(&j0)
			tj := time.Now()
			if _, err := jsonDecodeTrace(path); err != nil {
				return nil, fmt.Errorf("bench: json decode: %w", err)
			}
			decodes = append(decodes, time.Since(tj).Seconds())
			runtime.ReadMemStats(&j1)
			r.JSONAlloc = int64(j1.TotalAlloc - j0.TotalAlloc)
		}
		for i := range c.ResumeRuns {
			p.logf("resume: %d records, run %d/%d", n, i+1, c.ResumeRuns)
			runtime.GC()
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			t0 := time.Now()
			mc, _, bad, err := engine.ResumeContext(ctx, e.js, e.home, sid)
			took := time.Since(t0)
			runtime.ReadMemStats(&m1)
			if err != nil {
				return nil, fmt.Errorf("bench: resume: %w", err)
			}
			if len(mc) != want || bad != 0 {
				return nil, fmt.Errorf("bench: resumed a context of %d messages (%d records bad), want %d", len(mc), bad, want)
			}
			resumes = append(resumes, took.Seconds())
			r.ContextMsgs = len(mc)
			r.Alloc = int64(m1.TotalAlloc - m0.TotalAlloc)
		}
		r.Resume = time.Duration(median(resumes) * float64(time.Second))
		r.JSONDecode = time.Duration(median(decodes) * float64(time.Second))
		out = append(out, r)
	}
	return out, nil
}

// writeTrace writes all but the last tail records as the tracer would
// (Trace file 1 and a position at the stream's current end) and publishes
// the rest on the Session's subjects, after the position.
func writeTrace(ctx context.Context, e *env, sid string, recs []omni.Message, tail int) (int64, error) {
	created, _ := omni.SessionCreated(sid)
	path := trace.File(e.home, created, sid, 1)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return 0, err
	}
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	split := max(len(recs)-tail, 0)
	var line []byte
	for i := range recs[:split] {
		line = recs[i].AppendJSON(line[:0])
		line = append(line, '\n')
		w.Write(line)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return 0, err
	}
	info, err := f.Stat()
	f.Close()
	if err != nil {
		return 0, err
	}
	last, err := bus.LastSeq(ctx, e.js)
	if err != nil {
		return 0, err
	}
	if err := trace.WritePos(e.home, sid, trace.Pos{Seq: last, File: path, Size: info.Size(), Index: 1}); err != nil {
		return 0, err
	}
	for i := range recs[split:] {
		nm, err := bus.SessionMsg(sid, &recs[split+i], "")
		if err != nil {
			return 0, err
		}
		if err := e.publishAsync(ctx, nm); err != nil {
			return 0, err
		}
	}
	return info.Size(), e.flush(ctx)
}

var benchTools = []omni.ToolSpec{
	{Name: "exec_command", Description: "Run a shell command in the workspace; stdout and stderr are returned.",
		Parameters: json.RawMessage(`{"type":"object","properties":{"cmd":{"type":"string","description":"The command line, run with sh -c"},"description":{"type":"string"},"timeout_ms":{"type":"integer","minimum":1}},"required":["cmd"],"additionalProperties":false}`)},
	{Name: "read_file", Description: "Read a UTF-8 file of the workspace.",
		Parameters: json.RawMessage(`{"type":"object","properties":{"file_path":{"type":"string"},"offset":{"type":"integer"},"limit":{"type":"integer"}},"required":["file_path"]}`)},
	{Name: "apply_patch", Description: "Apply a unified diff to files of the workspace.",
		Parameters: json.RawMessage(`{"type":"object","properties":{"patch":{"type":"string"}},"required":["patch"]}`)},
	{Name: "run_subagent", Description: "Delegate a task to a child Session.",
		Parameters: json.RawMessage(`{"type":"object","properties":{"task":{"type":"string"}},"required":["task"]}`)},
}

// traceRecords returns n records of a long coding Session, built with the
// omni builders: session_meta and tool_list_ready, then Tasks of 20 records
// each — the prompt; a request with thinking, text and an exec_command call
// (approved, output of about 1.3 KB after request_end); a request reading a
// file (about 2 KB of Go with quotes, tabs and newlines); a final answer —
// each request closed by token_usage and request_end. Contents vary per Task.
func traceRecords(sid string, n int, t0 time.Time) []omni.Message {
	out := make([]omni.Message, 0, n)
	ts := t0
	add := func(m omni.Message) {
		if len(out) < n {
			ts = ts.Add(137 * time.Millisecond)
			m.Timestamp = omni.Timestamp(ts)
			out = append(out, m)
		}
	}
	add(omni.SessionMeta(omni.Meta{SessionID: sid, Provider: "anthropic", ModelID: "claude-sonnet-4-5",
		ModelContextWindow: 200000, SystemPrompt: "You are a careful coding agent. Prefer small, verifiable steps.",
		Workspace: "/home/dev/project"}))
	add(omni.ToolListReady(benchTools))
	var session omni.Usage
	usage := func(total int64) {
		req := omni.Usage{CacheRead: total * 3 / 4, CacheWrite: total / 8, Output: 180, Total: total}
		session = session.Add(req)
		add(omni.TokenUsage(session, req))
		add(omni.RequestEnd(omni.StatusCompleted, "", 0, 0))
	}
	for t := 0; len(out) < n; t++ {
		call1, call2 := fmt.Sprintf("toolu_%06d_a", t), fmt.Sprintf("toolu_%06d_b", t)
		add(omni.UserText(fmt.Sprintf("Task %d: the handler in internal/server/handler_%d.go returns 500 when the body is empty; find why and fix it, then run the tests.", t, t)))
		add(omni.RequestBegin())
		add(omni.Thinking(fmt.Sprintf("The user reports a 500 on empty bodies in handler_%d.go. I should look at the package layout first, then read the handler and its decodeBody call; an io.EOF from json.Decoder is probably not mapped to a 400.", t)))
		add(omni.Text(omni.RoleAssistant, "I'll list the package first, then read the handler."))
		add(omni.ToolCall("exec_command", fmt.Sprintf(`{"cmd":"ls -la internal/server && go vet ./internal/server/...","description":"list package %d"}`, t), call1))
		add(omni.ApprovalDecision(omni.DecisionAllow, call1))
		usage(int64(20000 + 900*t%150000))
		add(omni.ToolCallOutput(call1, listing(t), ""))
		add(omni.RequestBegin())
		add(omni.ToolCall("read_file", fmt.Sprintf(`{"file_path":"internal/server/handler_%d.go"}`, t), call2))
		add(omni.ApprovalDecision(omni.DecisionAllow, call2))
		usage(int64(21000 + 900*t%150000))
		add(omni.ToolCallOutput(call2, goFile(t), ""))
		add(omni.RequestBegin())
		add(omni.Text(omni.RoleAssistant, fmt.Sprintf("Found it: `decodeBody` in handler_%d.go treats io.EOF as an internal error. An empty body should be a 400 `bad_request`, like any malformed JSON. I changed the check to `errors.Is(err, io.EOF)` → 400 \"empty body\", added a table test case for it, and `go test ./internal/server/...` passes.", t)))
		usage(int64(22000 + 900*t%150000))
	}
	return out
}

func listing(t int) string {
	var b strings.Builder
	b.WriteString("total 96\n")
	for i := range 14 {
		fmt.Fprintf(&b, "-rw-r--r-- 1 dev dev %5d Nov 29 09:%02d handler_%d.go\n", 1200+37*i+t%500, i, t+i)
	}
	b.WriteString("[exit status 0]")
	return b.String()
}

func goFile(t int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "package server\n\nimport (\n\t\"encoding/json\"\n\t\"net/http\"\n)\n\n// handler%d answers POST /api/items/%d.\n", t, t)
	for i := range 8 {
		fmt.Fprintf(&b, "func (s *Server) step%d_%d(w http.ResponseWriter, r *http.Request) {\n\tvar req struct{ Name string `json:\"name\"` }\n\tif err := json.NewDecoder(r.Body).Decode(&req); err != nil {\n\t\thttp.Error(w, \"internal\", 500)\n\t\treturn\n\t}\n}\n\n", t, i)
	}
	return b.String()
}

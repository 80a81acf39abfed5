package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

// gw serves the gateway's API over real HTTP on the env's bus.
func (e *env) gw(t *testing.T, tweak func(*gateway.Config)) *client.Client {
	t.Helper()
	nc, err := e.st.Server.Connect()
	if err != nil {
		t.Fatal(err)
	}
	cfg := gateway.Config{Home: e.home}
	if tweak != nil {
		tweak(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, release, err := gateway.NewHandler(ctx, nc, cfg, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.CloseClientConnections(); release(); srv.Close(); nc.Close() })
	return client.New(srv.URL)
}

func readString(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "interop", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sentContext describes a Chat Completions request's messages compactly.
func sentContext(r rcSentRequest) []string {
	var out []string
	for _, m := range r.Messages {
		s := m.Role + ":"
		if m.ReasoningContent != nil {
			s += "(reasoning " + *m.ReasoningContent + ")"
		}
		s += m.text()
		for _, c := range m.ToolCalls {
			s += fmt.Sprintf("[call %s %s %s]", c.ID, c.Function.Name, c.Function.Arguments)
		}
		if m.ToolCallID != "" {
			s = "tool:" + m.ToolCallID + ":" + m.text()
		}
		out = append(out, s)
	}
	return out
}

func importFixture(t *testing.T, c *client.Client, data []byte, ws string) *client.Imported {
	t.Helper()
	imp, err := c.ImportTrace(ctxT(t), client.ImportTrace{DataBase64: base64.StdEncoding.EncodeToString(data), Workspace: ws})
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	return imp
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Traces written by the original harness, by hand in its exact format,
// imported and continued: the model gets exactly the context the original
// would give it.
func TestImportOriginalTracesSendsTheOriginalsContext(t *testing.T) {
	tests := []struct {
		file, sid, date, model string
		closed                 bool // the file ends in a completed compaction
		want                   []string
	}{
		{
			file: "original_tools.jsonl", sid: "session-2026-07-19-01-10-22-3f8a1c2d", date: "2026-07-18", model: "deepseek-v4-pro",
			want: []string{
				"system:You are a careful assistant.",
				"user:Create hello.txt, then clean /tmp/x",
				`assistant:(reasoning Write the file first, then remove the directory.)[call call_0 exec_command {"description":"write","cmd":"printf hi > hello.txt"}][call call_1 exec_command {"description":"clean","cmd":"rm -r /tmp/x"}]`,
				"tool:call_0:[no output]",
				"tool:call_1:" + omni.DeniedByUser,
				"assistant:hello.txt is written; cleaning /tmp/x was refused.",
				"user:Now list the files",
				`assistant:[call call_2 exec_command {"description":"list","cmd":"sleep 30; ls"}]`,
				"tool:call_2:" + omni.InterruptedOutput,
				"user:next task",
			},
		},
		{
			file: "original_compacted_002.jsonl", sid: "session-2026-07-20-16-00-00-0a1b2c3d", date: "2026-07-20", model: "anthropic/claude-sonnet-4",
			want: []string{
				"system:You are terse.",
				"user:" + omni.Block(omni.TagContextSummary, "The user asked for hello.txt; it was created with the text hi."),
				"user:Append a line",
				`assistant:[call call_7 exec_command {"cmd":"echo more >> hello.txt"}]`,
				"tool:call_7:[no output]",
				"assistant:Appended.",
				"user:next task",
			},
		},
		{
			file: "original_compaction_closed.jsonl", sid: "session-2026-07-21-09-30-00-deadbeef", date: "2026-07-21", model: "qwen3-coder", closed: true,
			want: []string{
				"system:You help with code.",
				"user:" + omni.Block(omni.TagContextSummary, "The user asked an old question and got an old answer."),
				"user:next task",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			f := rcNewFake(t, rcAnswer("ok"))
			e := rcEnv(t, f, nil)
			c := e.gw(t, nil)
			data := readFixture(t, tc.file)
			imp := importFixture(t, c, data, e.ws)
			if imp.SessionID != tc.sid || imp.Index != 1 || imp.Date != tc.date {
				t.Fatalf("import = %+v, want %s index 1 date %s", imp, tc.sid, tc.date)
			}
			path := filepath.Join(e.home, "traces", tc.date, tc.sid+"_001.jsonl")
			if got, err := os.ReadFile(path); err != nil || string(got) != string(data) {
				t.Fatalf("imported file %s: %v (equal: %v)", path, err, string(got) == string(data))
			}
			s, err := c.GetSession(ctxT(t), tc.sid)
			if err != nil || s.Model != "openai:"+tc.model || s.Workspace != e.ws || s.State != omni.StateIdle {
				t.Fatalf("session = %+v, %v", s, err)
			}
			list, err := c.ListSessions(ctxT(t))
			if err != nil || !slices.ContainsFunc(list, func(x client.Session) bool { return x.ID == tc.sid }) {
				t.Fatalf("the imported Session is not listed: %v", err)
			}
			taskID, err := c.SubmitTask(ctxT(t), tc.sid, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "next task"}}})
			if err != nil {
				t.Fatal(err)
			}
			rs, status := e.wait(tc.sid, taskID)
			if status != omni.StatusCompleted {
				t.Fatalf("status %q; stream %v", status, labels(rs, noPartials))
			}
			req := f.body(0)
			if req.Model != tc.model {
				t.Errorf("model = %q, want %q", req.Model, tc.model)
			}
			if got := sentContext(req); !slices.Equal(got, tc.want) {
				t.Fatalf("the model got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
			// The Task went on in the imported file; one that ended in a
			// completed compaction gets the new context's head first, in
			// the next file, as the original writes it.
			last := path
			if tc.closed {
				last = filepath.Join(e.home, "traces", tc.date, tc.sid+"_002.jsonl")
			}
			eventually(t, 10*time.Second, "the Task in the Trace", func() bool {
				b, _ := os.ReadFile(last)
				return strings.Contains(string(b), `"text":"ok"`)
			})
			files, err := trace.Files(e.home, tc.sid)
			if err != nil || files[0] != path || files[len(files)-1] != last {
				t.Fatalf("trace files = %v, %v; want %s … %s", files, err, path, last)
			}
			b, _ := os.ReadFile(path)
			if !strings.HasPrefix(string(b), string(data)) {
				t.Fatal("the imported records were rewritten")
			}
			if tc.closed {
				msgs, skipped, err := trace.Read(strings.NewReader(readString(t, last)))
				if err != nil || len(skipped) > 0 || len(msgs) < 4 {
					t.Fatalf("_002: %v %v %d", err, skipped, len(msgs))
				}
				if msgs[0].Type != omni.KindSessionMeta || msgs[1].Payload.Type != omni.TypeToolListReady || msgs[2].Payload.Text != tc.want[1][len("user:"):] || msgs[3].Payload.Text != "next task" {
					t.Fatalf("_002 starts %v", lcMsgLabels(msgs[:4]))
				}
			}
			// The history API shows the imported records.
			hist, err := c.Messages(ctxT(t), tc.sid)
			if err != nil || len(hist.Messages) < strings.Count(string(data), "\n") {
				t.Fatalf("messages: %d, %v", len(hist.Messages), err)
			}
		})
	}
}

// Round trip: a Floe Session that used a compaction, a tool and steering
// is exported, deleted and imported; the next Task's request carries
// exactly the history the original Session's would.
func TestExportDeleteImportKeepsTheHistory(t *testing.T) {
	gate := rcExecArgs("wait", "while [ ! -f release ]; do sleep 0.05; done; echo released")
	f := rcNewFake(t,
		rcAnswer("Hello back."),
		rcAnswer("[summary]\nWe greeted each other.\n[/summary]"),
		toolCallsTurn([3]string{"call_gate", "exec_command", gate}),
		rcAnswer("Through the gate."),
		rcAnswer("Three."),
		rcAnswer("Three."),
	)
	e := rcEnv(t, f, nil)
	c := e.gw(t, nil)
	sid := e.session("openai:gpt-test", omni.ApproveAllowAll, nil)
	_, status := e.wait(sid, e.submit(sid, "hello"))
	if status != omni.StatusCompleted {
		t.Fatalf("task 1: %s", status)
	}
	if _, status := e.wait(sid, e.submitTask(sid, omni.TaskCompact)); status != omni.StatusCompleted {
		t.Fatalf("compaction: %s", status)
	}
	task2 := e.submit(sid, "go through the gate")
	e.lcFollow(sid, nil, "the gate tool to run", func(r rec) bool { return label(r) == "approval_decision:allow:call_gate" })
	e.lcMustControl(sid, omni.CtlSteer, omni.Control{Text: "mind the step"})
	if err := os.WriteFile(filepath.Join(e.ws, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, status := e.wait(sid, task2); status != omni.StatusCompleted {
		t.Fatalf("task 2: %s", status)
	}
	e.lcTraced(sid)
	files, err := c.Traces(ctxT(t), sid)
	if err != nil || len(files) != 2 {
		t.Fatalf("traces = %v, %v; want two (a compaction rotated)", files, err)
	}
	exported, err := c.Trace(ctxT(t), sid, files[1].Index)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{omni.Block(omni.TagContextSummary, "We greeted each other."), omni.Block(omni.TagUserSteering, "mind the step"), "call_gate"} {
		quoted, _ := json.Marshal(want) // as the Trace line holds it
		if !bytes.Contains(exported, bytes.Trim(quoted, `"`)) {
			t.Fatalf("the exported file lacks %q:\n%s", want, exported)
		}
	}

	// The next Task on the original Session.
	if _, status := e.wait(sid, e.submit(sid, "third")); status != omni.StatusCompleted {
		t.Fatalf("task 3: %s", status)
	}
	before := f.body(4)

	if err := c.DeleteSession(ctxT(t), sid); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetSession(ctxT(t), sid); !client.IsCode(err, omni.CodeNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	imp, err := c.ImportTrace(ctxT(t), client.ImportTrace{DataBase64: base64.StdEncoding.EncodeToString(exported), Model: "openai:gpt-test"})
	if err != nil || imp.SessionID != sid {
		t.Fatalf("import = %+v, %v", imp, err)
	}
	taskID, err := c.SubmitTask(ctxT(t), sid, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: "third"}}})
	if err != nil {
		t.Fatal(err)
	}
	rs, status := e.wait(sid, taskID)
	if status != omni.StatusCompleted {
		t.Fatalf("task 3 after the import: %s; %v", status, labels(rs, noPartials))
	}
	after := f.body(5)
	if got, want := sentContext(after), sentContext(before); !slices.Equal(got, want) {
		t.Fatalf("after the round trip the model got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	want := []string{
		"user:" + omni.Block(omni.TagContextSummary, "We greeted each other."),
		"user:go through the gate",
		"assistant:[call call_gate exec_command " + gate + "]",
		"tool:call_gate:released\n",
		"user:" + omni.Block(omni.TagUserSteering, "mind the step"),
		"assistant:Through the gate.",
		"user:third",
	}
	if got := sentContext(after)[1:]; !slices.Equal(got, want) {
		t.Fatalf("context after the round trip:\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

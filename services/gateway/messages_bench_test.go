package gateway_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway/client"
)

// BenchmarkMessages serves GET /api/sessions/:id/messages for an idle
// Session whose Trace holds n records (the tracer caught up: nothing after
// its position on the stream), read over loopback HTTP and discarded.
func BenchmarkMessages(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			env := newBus(b)
			g := startGateway(b, env, "", nil)
			s, err := g.Alice.CreateSession(context.Background(), client.CreateSession{})
			if err != nil {
				b.Fatal(err)
			}
			size := writeBenchTrace(b, env, g.Home, s.ID, n)
			req, _ := http.NewRequest(http.MethodGet, g.URL+"/api/sessions/"+s.ID+"/messages", nil)
			req.Header.Set("Authorization", "Bearer "+aliceToken)
			b.SetBytes(size)
			b.ReportAllocs()
			for b.Loop() {
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatal(resp.Status)
				}
			}
		})
	}
}

// BenchmarkMessagesWindow serves the Web App's opening call, the newest 50
// Tasks, of an idle Session of 2,000 Tasks (writeBenchTrace: 4 records a
// Task), beside the whole history of the same Session: the ratio of the
// two is what the window saves.
func BenchmarkMessagesWindow(b *testing.B) {
	env := newBus(b)
	g := startGateway(b, env, "", nil)
	s, err := g.Alice.CreateSession(context.Background(), client.CreateSession{})
	if err != nil {
		b.Fatal(err)
	}
	writeBenchTrace(b, env, g.Home, s.ID, 8000)
	for _, q := range []string{"?tailTasks=50", ""} {
		name := "window=50"
		if q == "" {
			name = "window=all"
		}
		b.Run(name, func(b *testing.B) {
			req, _ := http.NewRequest(http.MethodGet, g.URL+"/api/sessions/"+s.ID+"/messages"+q, nil)
			req.Header.Set("Authorization", "Bearer "+aliceToken)
			b.ReportAllocs()
			var n int64
			for b.Loop() {
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				n, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatal(resp.Status)
				}
			}
			b.ReportMetric(float64(n)/1024, "KiB/op")
		})
	}
}

// writeBenchTrace writes a Trace of n records for sid (a Prompt, an
// answer, a tool call and its output, in turn, some with the characters
// JSON encoders like to escape) and a position past every stream message,
// and returns the file's size.
func writeBenchTrace(b *testing.B, env *bustest.Env, home, sid string, n int) int64 {
	b.Helper()
	last, err := bus.LastSeq(context.Background(), env.JS)
	if err != nil {
		b.Fatal(err)
	}
	created, _ := omni.SessionCreated(sid)
	path := trace.File(home, created, sid, 1)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		b.Fatal(err)
	}
	var sb strings.Builder
	for i := range n {
		var m omni.Message
		switch i % 4 {
		case 0:
			m = omni.UserText(fmt.Sprintf("step %d: make the build pass & keep <main> green. ", i) + strings.Repeat("please ", 20))
		case 1:
			m = omni.Text(omni.RoleAssistant, fmt.Sprintf("Running the tests for step %d, then I will look at the failures one by one. ", i)+strings.Repeat("ok ", 40))
		case 2:
			m = omni.ToolCall("shell", fmt.Sprintf(`{"command":"go test ./... 2>&1 | head -n %d"}`, i%50), fmt.Sprintf("call_%d", i))
		case 3:
			m = omni.ToolCallOutput(fmt.Sprintf("call_%d", i-1), "ok  \tfloe.dev/pkg/x\t0.01s\n--- FAIL: TestY (0.00s)\n    y_test.go:12: got <nil>, want &T{}\n"+strings.Repeat("line\n", 20), "completed")
		}
		sb.Write(omni.MustMarshal(&m))
		sb.WriteByte('\n')
	}
	if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := trace.WritePos(home, sid, trace.Pos{Seq: last, File: path, Size: int64(sb.Len()), Index: 1}); err != nil {
		b.Fatal(err)
	}
	return int64(sb.Len())
}

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/services/engine"
	"floe.dev/services/toolrunner"
	"floe.dev/services/tracer"
)

// BenchmarkProviderLatency measures the latency Floe adds to a streamed
// chunk: from the fake OpenAI-compatible server flushing a chunk to the
// chunk's partial_text reaching a JetStream consumer of the Session (an
// ordered consumer, as the gateway and `floe replay` use), through the
// provider's HTTP client and decoder, the segmenter, the async publish and
// the stream. One op is one chunk; chunks go one at a time (the next leaves
// when the previous arrived), so the figures are latency, not queueing.
// It reports p50-us and p99-us; run it with -benchtime=2000x.
func BenchmarkProviderLatency(b *testing.B) {
	n := b.N
	sent := make([]atomic.Int64, n) // UnixNano each chunk was flushed
	lat := make([]time.Duration, n)
	arrived := make(chan int, 1)

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		fl := w.(http.Flusher)
		fmt.Fprintf(w, "data: %s\n\n", rcRoleChunk())
		fl.Flush()
		for i := range n {
			chunk := "data: " + rcTextChunk("c"+strconv.Itoa(i)+" ") + "\n\n"
			sent[i].Store(time.Now().UnixNano())
			if _, err := w.Write([]byte(chunk)); err != nil {
				return
			}
			fl.Flush()
			select {
			case got := <-arrived:
				if got != i {
					b.Errorf("partial of chunk %d arrived while waiting for %d", got, i)
					return
				}
			case <-time.After(rcBound):
				b.Errorf("chunk %d never reached the consumer", i)
				return
			case <-r.Context().Done():
				return
			}
		}
		for _, c := range []string{rcFinishChunk("stop"), rcUsageChunk(100, n), "[DONE]"} {
			fmt.Fprintf(w, "data: %s\n\n", c)
		}
	}))
	defer srv.Close()

	st, home := rcBenchStack(b, srv.URL+"/v1")
	now := time.Now().UTC()
	sid := omni.NewSessionID(now, fmt.Sprintf("%08x", seq.Add(1)))
	ctx := context.Background()
	if err := st.Sessions.Create(ctx, &omni.SessionRecord{ID: sid, Model: rcModel, Workspace: filepath.Join(home, "ws"),
		ApprovalMode: omni.ApproveAllowAll, State: omni.StateIdle, CreatedUnixMs: now.UnixMilli()}); err != nil {
		b.Fatal(err)
	}

	// The consumer: each text partial "c<i> " is chunk i.
	fctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	consumed := make(chan error, 1)
	go func() {
		got := 0
		consumed <- bus.FollowUntil(fctx, st.JS, sid, []string{omni.ClassPartial}, 0, false, func(sm bus.StreamMsg) error {
			at := time.Now()
			m, err := omni.Decode(sm.Data)
			if err != nil || m.Payload.Type != omni.TypePartialText || m.Payload.Text == "" {
				return err
			}
			i, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(m.Payload.Text, "c"), " "))
			if err != nil || i >= n {
				return fmt.Errorf("unexpected partial %q", m.Payload.Text)
			}
			lat[i] = at.Sub(time.Unix(0, sent[i].Load()))
			arrived <- i
			if got++; got == n {
				return bus.ErrStop
			}
			return nil
		})
	}()

	b.ResetTimer()
	taskID := fmt.Sprintf("task-%d", seq.Add(1))
	if _, err := st.Sessions.Begin(ctx, sid, omni.StateRunning, taskID); err != nil {
		b.Fatal(err)
	}
	nm, err := bus.PackMsg(omni.TaskSubject(sid), &omni.Task{ID: taskID, Kind: omni.TaskRun, SessionID: sid,
		Input: []omni.InputPart{{Type: "text", Text: "stream"}}})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := st.JS.PublishMsg(ctx, nm); err != nil {
		b.Fatal(err)
	}
	if err := <-consumed; err != nil {
		b.Fatalf("consumer: %v", err)
	}
	b.StopTimer()

	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(n-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(pct(0.50), "p50-us")
	b.ReportMetric(pct(0.99), "p99-us")
}

// rcBenchStack starts what start does (engine, one tool runner, tracer on
// an embedded server) for a benchmark, the engine pointed at baseURL.
func rcBenchStack(b *testing.B, baseURL string) (*stack.Stack, string) {
	b.Helper()
	home := b.TempDir()
	b.Setenv("HOME", home)
	if err := os.MkdirAll(filepath.Join(home, "ws"), 0o755); err != nil {
		b.Fatal(err)
	}
	eng := engine.Config{RetryMax: 5, Home: home}
	eng.Providers.OpenAIBaseURL, eng.Providers.OpenAIAPIKey = baseURL, rcAPIKey
	st, err := stack.Start(context.Background(), stack.Options{Home: home, Listen: "off", Engine: &eng,
		Tracer: &tracer.Config{Home: home}}, testLogger())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Stop)
	nc, err := st.Server.Connect()
	if err != nil {
		b.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	cfg := toolrunner.Config{RunnerID: "bench-runner"}
	go func() {
		defer close(done)
		_ = toolrunner.Run(rctx, nc, cfg, testLogger())
	}()
	b.Cleanup(func() { stop(); <-done; nc.Close() })
	return st, home
}

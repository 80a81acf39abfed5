package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// TestLoadBackPressure: many Sessions stream at once through the engine,
// with SSE clients attached, on one replica. The ordered publishers apply
// back-pressure (a full queue or flow-control window makes the producer
// wait) instead of failing Tasks: every Task completes and every segment's
// deltas concatenate to its complete message.
//
// The CI variant is small; FLOE_LOAD=full runs the shape, 100
// Sessions × 2000 deltas with 500 SSE clients (scripts/load runs it), and
// logs the figures.
func TestLoadBackPressure(t *testing.T) {
	sessions, deltas, clients := 8, 200, 16
	if os.Getenv("FLOE_LOAD") == "full" {
		sessions, deltas, clients = 100, 2000, 500
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	e, err := startEnv(ctx, t.TempDir(), "load", true, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer e.stop()
	if err := raiseMaxConsumers(ctx, e, clients+sessions*4+64); err != nil {
		t.Fatal(err)
	}
	script := map[string]any{
		"requests": []any{map[string]any{"steps": []any{
			map[string]any{"text": strings.Repeat(fragment, deltas), "chunks": deltas},
		}}},
	}
	b, _ := json.Marshal(script)
	path := filepath.Join(e.home, "load-script.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	sids := make([]string, sessions)
	for i := range sids {
		s, err := e.api.CreateSession(ctx, client.CreateSession{Model: "scripted:" + path})
		if err != nil {
			t.Fatal(err)
		}
		sids[i] = s.ID
	}

	// The SSE clients, spread over the Sessions, each reading its
	// Session's stream until the Task's task_state idle.
	var (
		wg         sync.WaitGroup
		events     atomic.Int64
		reconnects atomic.Int64
		sseErrs    = make(chan error, clients)
		ready      sync.WaitGroup
	)
	for i := range clients {
		sid := sids[i%sessions]
		conn, err := dialSSE(ctx, e.addr, sid, 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		ready.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.close()
			first := true
			for {
				ev, err := conn.next()
				if err != nil {
					if ctx.Err() == nil && reconnects.Add(1) < int64(clients*20) {
						if err = conn.reconnect(ctx); err == nil {
							continue
						}
					}
					sseErrs <- fmt.Errorf("SSE client of %s: %w", sid, err)
					if first {
						ready.Done()
					}
					return
				}
				if first {
					first = false
					ready.Done() // the task_state snapshot: live from here
					continue
				}
				events.Add(1)
				if ev.server && bytes.Contains(ev.data, idleMark) && bytes.Contains(ev.data, taskIDMark) {
					return
				}
			}
		}()
	}
	ready.Wait()

	start := time.Now()
	tasks := make([]string, sessions)
	for i, sid := range sids {
		id, err := e.api.SubmitTask(ctx, sid, client.TaskRequest{Input: []client.InputPart{{Type: "text", Text: "stream"}}})
		if err != nil {
			t.Fatal(err)
		}
		tasks[i] = id
	}
	wg.Wait()
	took := time.Since(start)
	close(sseErrs)
	for err := range sseErrs {
		t.Error(err)
	}

	completed, segments := 0, 0
	for i, sid := range sids {
		var agg []byte
		open, partials := false, 0
		status := ""
		err := bus.Follow(ctx, e.js, sid, nil, 0, true, func(sm bus.StreamMsg) error {
			if sm.Class == omni.ClassServer {
				var ev omni.ServerEvent
				if json.Unmarshal(sm.Data, &ev) == nil && ev.Type == omni.ServerTaskState && ev.State == omni.StateIdle && ev.TaskID == tasks[i] {
					status = ev.Status
				}
				return nil
			}
			m, err := omni.Decode(sm.Data)
			if err != nil {
				return err
			}
			p := &m.Payload
			if m.Type != omni.KindModel || p.Role == omni.RoleUser {
				return nil
			}
			if m.IsPartial() {
				switch p.EventType {
				case omni.EventStart:
					if open {
						t.Errorf("%s seq %d: a segment starts inside another", sid, sm.Seq)
					}
					open, agg = true, append(agg[:0], p.Content()...)
				default:
					if !open {
						t.Errorf("%s seq %d: %s outside a segment", sid, sm.Seq, p.EventType)
					}
					agg = append(agg, p.Content()...)
				}
				partials++
				return nil
			}
			segments++
			if !open || string(agg) != p.Content() {
				t.Errorf("%s seq %d: complete %s is not its segment's deltas (%d bytes streamed, %d complete)", sid, sm.Seq, p.Type, len(agg), len(p.Content()))
			}
			open = false
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if status == omni.StatusCompleted {
			completed++
		} else {
			t.Errorf("%s: task ended %q", sid, status)
		}
		if partials < deltas {
			t.Errorf("%s: %d partials on the stream, want at least %d", sid, partials, deltas)
		}
	}
	t.Logf("%d of %d Tasks completed; %d Sessions × %d deltas with %d SSE clients in %v: %.0f deltas/s published, %.0f SSE events/s delivered, %d slow-client reconnects, %d complete messages checked",
		completed, sessions, sessions, deltas, clients, took.Round(time.Millisecond),
		float64(sessions*deltas)/took.Seconds(), float64(events.Load())/took.Seconds(), reconnects.Load(), segments)
}

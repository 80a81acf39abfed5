package bench

import (
	"context"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

// BenchmarkFork compares forking a 10,000-record Session through the
// fork route (POST /api/sessions/:id/fork over HTTP: the cut read as a
// resume reads it, the fork's Trace _001 written and synced, its record
// created) with resuming the same Session (engine.ResumeContext), in one
// run: a Trace written like the tracer writes it with the last Task
// still in the stream. "fork/end" forks everything so far; "fork/tail"
// cuts at a stream position inside the last Task.
func BenchmarkFork(b *testing.B) {
	const n = 10_000
	ctx := context.Background()
	e, err := startEnv(ctx, b.TempDir(), "fork", false, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	defer e.stop()
	if err := publishStamped(ctx, e, newSessionID(), "w0"); err != nil {
		b.Fatal(err)
	}
	sid := newSessionID()
	created, _ := omni.SessionCreated(sid)
	recs := traceRecords(sid, n, created)
	want := len(engine.ModelContext(recs))
	size, err := writeTrace(ctx, e, sid, recs, tailRecords)
	if err != nil {
		b.Fatal(err)
	}
	if err := e.st.Sessions.Create(ctx, &omni.SessionRecord{ID: sid, Model: "scripted:demo", Workspace: e.home,
		ApprovalMode: omni.ApproveAllowAll, State: omni.StateIdle, CreatedUnixMs: created.UnixMilli()}); err != nil {
		b.Fatal(err)
	}
	h, release, err := gateway.NewHandler(ctx, e.nc, gateway.Config{Home: e.home}, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	defer release()
	srv := httptest.NewServer(h)
	defer srv.Close()
	api := client.New(srv.URL)
	var tail []uint64
	if err := followSeqs(ctx, e, sid, &tail); err != nil || len(tail) < tailRecords {
		b.Fatalf("the stream holds %d records of the last Task (%v), want %d", len(tail), err, tailRecords)
	}

	b.Run("resume", func(b *testing.B) {
		b.SetBytes(size)
		b.ReportAllocs()
		for b.Loop() {
			mc, _, bad, err := engine.ResumeContext(ctx, e.js, e.home, sid)
			if err != nil || bad != 0 || len(mc) != want {
				b.Fatalf("ResumeContext = %d messages, %d bad, %v; want %d", len(mc), bad, err, want)
			}
		}
	})
	for _, c := range []struct {
		name string
		at   uint64
	}{{"fork/end", 0}, {"fork/tail", tail[len(tail)/2]}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(size)
			b.ReportAllocs()
			for range b.N {
				fork, err := api.Fork(ctx, sid, c.at)
				if err != nil {
					b.Fatal(err)
				}
				// Each fork's Trace is a copy of the parent's: removed
				// (not timed) so the disk does not fill.
				b.StopTimer()
				removeFork(ctx, b, e, fork.ID)
				b.StartTimer()
			}
		})
	}
}

// followSeqs appends the stream sequences of the Session's Trace-class
// messages.
func followSeqs(ctx context.Context, e *env, sid string, out *[]uint64) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	h, err := trace.Load(ctx, e.js, e.home, sid, trace.Options{})
	if err != nil {
		return err
	}
	for _, r := range h.Records {
		if r.Seq > 0 {
			*out = append(*out, r.Seq)
		}
	}
	return nil
}

func removeFork(ctx context.Context, b *testing.B, e *env, id string) {
	files, err := trace.Files(e.home, id)
	if err != nil || len(files) != 1 {
		b.Fatalf("fork %s: Trace files %v, %v", id, files, err)
	}
	os.Remove(files[0])
	if err := e.st.Sessions.Delete(ctx, id); err != nil {
		b.Fatal(err)
	}
}

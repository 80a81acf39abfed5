package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/services/engine"
)

// BenchmarkResume is the bench's resume scenario as a package benchmark,
// for profiling: a Trace written like the tracer writes it, the last Task
// still in the stream, loaded and folded per iteration.
func BenchmarkResume(b *testing.B) {
	for _, c := range []struct {
		n, tail int
	}{{1000, tailRecords}, {1000, 0}, {100_000, tailRecords}} {
		n := c.n
		b.Run(fmt.Sprintf("%d/tail=%d", n, c.tail), func(b *testing.B) {
			ctx := context.Background()
			e, err := startEnv(ctx, b.TempDir(), "resume", false, zerolog.Nop())
			if err != nil {
				b.Fatal(err)
			}
			defer e.stop()
			sid := newSessionID()
			recs := traceRecords(sid, n, time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC))
			want := len(engine.ModelContext(recs))
			size, err := writeTrace(ctx, e, sid, recs, c.tail)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(size)
			b.ReportAllocs()
			for b.Loop() {
				mc, _, bad, err := engine.ResumeContext(ctx, e.js, e.home, sid)
				if err != nil || bad != 0 || len(mc) != want {
					b.Fatalf("ResumeContext = %d messages, %d bad, %v; want %d messages", len(mc), bad, err, want)
				}
			}
		})
	}
}

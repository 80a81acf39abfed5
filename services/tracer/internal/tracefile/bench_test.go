package tracefile_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/pkg/trace"
	"floe.dev/services/tracer/internal/tracefile"
)

// BenchmarkStoreNewSession is the tracer's work for a new Session (its
// first record appended and its position recorded) in a home holding a
// year of date directories.
func BenchmarkStoreNewSession(b *testing.B) {
	home := b.TempDir()
	day := time.Date(2025, 12, 1, 0, 0, 0, 0, time.UTC)
	for d := range 365 {
		p := trace.File(home, day.AddDate(0, 0, d), fmt.Sprintf("session-2025-12-01-00-00-00-%08x", d), 1)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("{}\n"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	s, err := tracefile.Open(home, 0, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	data := []byte(`{"timestamp":"2026-11-30T12:00:00.000Z","type":"session_meta","payload":{"session_id":"x"}}`)
	seq := uint64(0)
	for b.Loop() {
		seq++
		id := fmt.Sprintf("session-2026-11-30-12-00-00-%08x", seq)
		if _, err := s.Append(id, tracefile.Record{Seq: seq, Data: data, Meta: true}); err != nil {
			b.Fatal(err)
		}
		if err := s.Flush(); err != nil {
			b.Fatal(err)
		}
	}
}

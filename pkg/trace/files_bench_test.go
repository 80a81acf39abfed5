package trace

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkFilesNewSession looks up a Session that has no Trace in a home
// holding a year of date directories: in a home whose imports are not
// indexed (one stat per date directory, as every home before import
// marks) and in an indexed one.
func BenchmarkFilesNewSession(b *testing.B) {
	for _, mode := range []string{"unindexed", "indexed"} {
		b.Run(mode, func(b *testing.B) {
			home := b.TempDir()
			day := time.Date(2025, 12, 1, 0, 0, 0, 0, time.UTC)
			for d := range 365 {
				touchTrace(b, File(home, day.AddDate(0, 0, d), fmt.Sprintf("session-2025-12-01-00-00-00-%08x", d), 1))
			}
			if mode == "indexed" {
				if _, err := IndexImports(home); err != nil {
					b.Fatal(err)
				}
			}
			i := 0
			for b.Loop() {
				i++
				sid := fmt.Sprintf("session-2026-11-30-12-00-00-%08x", i)
				if files, err := Files(home, sid); err != nil || len(files) != 0 {
					b.Fatal(files, err)
				}
			}
		})
	}
}

// BenchmarkFilesOnABusyDay looks up the two Trace files of a Session
// created on a day with 10,000 Sessions.
func BenchmarkFilesOnABusyDay(b *testing.B) {
	home := b.TempDir()
	day := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	const sid = "session-2026-11-30-12-00-00-ffffffff"
	for i := range 10_000 {
		touchTrace(b, File(home, day, fmt.Sprintf("session-2026-11-30-12-00-00-%08x", i), 1))
	}
	touchTrace(b, File(home, day, sid, 1))
	touchTrace(b, File(home, day, sid, 2))
	for b.Loop() {
		if files, err := Files(home, sid); err != nil || len(files) != 2 {
			b.Fatal(files, err)
		}
	}
}

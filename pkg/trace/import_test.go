package trace

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// touchTrace creates an empty Trace file.
func touchTrace(t testing.TB, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func wantFiles(t *testing.T, home, sid string, want ...string) {
	t.Helper()
	got, err := Files(home, sid)
	if err != nil || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("Files(%s) = %v, %v; want %v", sid, got, err, want)
	}
}

var (
	importedSID = "session-2026-07-19-01-10-22-3f8a1c2d" // local time; UTC was the 18th
	importFirst = time.Date(2026, 7, 18, 17, 10, 22, 0, time.UTC)
	idDate      = time.Date(2026, 7, 19, 0, 0, 0, 0, time.UTC)
)

func TestFilesFindsAnImportedTraceThroughItsMark(t *testing.T) {
	home := t.TempDir()
	if n, err := IndexImports(home); n != 0 || err != nil {
		t.Fatalf("IndexImports(new home) = %d, %v", n, err)
	}
	if err := MarkImported(home, importedSID, importFirst); err != nil {
		t.Fatal(err)
	}
	want := []string{File(home, importFirst, importedSID, 1), File(home, importFirst, importedSID, 2)}
	for _, p := range want {
		touchTrace(t, p)
	}
	wantFiles(t, home, importedSID, want...)

	// In an indexed home a Trace without its mark in another directory is
	// not looked for (that is what keeps a new Session to two stats).
	unmarked := "session-2026-07-19-01-10-22-00000001"
	touchTrace(t, File(home, importFirst, unmarked, 1))
	wantFiles(t, home, unmarked)

	// A Trace landing in its id's own directory needs no mark.
	own := "session-2026-07-18-01-10-22-00000002"
	if err := MarkImported(home, own, importFirst); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(markPath(home, own, importFirst)); !os.IsNotExist(err) {
		t.Errorf("mark of a Trace in its own directory: %v, want none", err)
	}

	// A mark that does not name a date is not trusted: the directories
	// are searched.
	if err := os.WriteFile(markPath(home, unmarked, idDate), []byte("../../etc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantFiles(t, home, unmarked, File(home, importFirst, unmarked, 1))

	if err := UnmarkImported(home, importedSID); err != nil {
		t.Fatal(err)
	}
	wantFiles(t, home, importedSID)
	if err := UnmarkImported(home, importedSID); err != nil {
		t.Errorf("UnmarkImported twice: %v", err)
	}
}

// A home whose Traces were imported before imports left marks: Files
// still finds them (every date directory is searched) until IndexImports
// has marked them, then through their marks.
func TestIndexImportsMarksTracesImportedBefore(t *testing.T) {
	home := t.TempDir()
	imported := []string{File(home, importFirst, importedSID, 1), File(home, importFirst, importedSID, 2)}
	for _, p := range imported {
		touchTrace(t, p)
	}
	// In its own directory and in another: its own one is the Trace.
	both := "session-2026-07-19-01-10-22-00000003"
	touchTrace(t, File(home, idDate, both, 1))
	touchTrace(t, File(home, importFirst, both, 1))
	// A later directory holds the same id's file 001 too: the first wins.
	touchTrace(t, File(home, idDate.AddDate(0, 0, 3), importedSID, 1))
	touchTrace(t, filepath.Join(home, "traces", "not-a-date", "session-2026-07-19-01-10-22-00000004_001.jsonl"))

	wantFiles(t, home, importedSID, imported...)
	n, err := IndexImports(home)
	if err != nil || n != 1 {
		t.Fatalf("IndexImports = %d, %v; want 1 mark", n, err)
	}
	if b, err := os.ReadFile(markPath(home, importedSID, idDate)); err != nil || string(b) != "2026-07-18\n" {
		t.Errorf("mark = %q, %v; want 2026-07-18", b, err)
	}
	if _, err := os.Stat(IndexesPath(home)); err != nil {
		t.Errorf("home not recorded as indexed: %v", err)
	}
	wantFiles(t, home, importedSID, imported...)
	wantFiles(t, home, both, File(home, idDate, both, 1))
	if n, err := IndexImports(home); n != 0 || err != nil {
		t.Errorf("IndexImports again = %d, %v; want nothing to do", n, err)
	}
	// Found through the mark now: without it, nothing is searched.
	os.Remove(markPath(home, importedSID, idDate))
	wantFiles(t, home, importedSID)
}

// A Session's files are 001, 002, … up to the first missing one.
func TestFilesOfASessionWithSeveralFiles(t *testing.T) {
	home := t.TempDir()
	var want []string
	for idx := 1; idx <= 3; idx++ {
		want = append(want, File(home, idDate, importedSID, idx))
		touchTrace(t, want[idx-1])
	}
	touchTrace(t, File(home, idDate, importedSID, 5)) // after a gap: not the tracer's
	touchTrace(t, File(home, idDate, "session-2026-07-19-01-10-22-00000005", 4))
	wantFiles(t, home, importedSID, want...)
}

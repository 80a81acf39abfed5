package trace

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"floe.dev/pkg/omni"
)

func TestSessionIDAndTracePathsRoundTrip(t *testing.T) {
	created := time.Date(2026, 11, 29, 23, 59, 59, 987e6, time.FixedZone("UTC+3", 3*3600))
	sid := omni.NewSessionID(created, "0123abcd")
	if want := "session-2026-11-29-20-59-59-0123abcd"; sid != want {
		t.Fatalf("omni.NewSessionID(%v) = %q, want %q", created, sid, want)
	}
	if !omni.ValidSessionID(sid) {
		t.Errorf("omni.ValidSessionID(%q) = false, want true", sid)
	}
	got, ok := omni.SessionCreated(sid)
	if want := created.Truncate(time.Second).UTC(); !ok || !got.Equal(want) || got.Location() != time.UTC {
		t.Errorf("omni.SessionCreated(%q) = %v, %v; want %v, true", sid, got, ok, want)
	}
	home := t.TempDir()
	for _, index := range []int{1, 2, 12, 999, 1000} {
		p := File(home, got, sid, index)
		dir, base := filepath.Split(p)
		if filepath.Clean(dir) != Dir(home, got) || filepath.Clean(dir) != filepath.Join(home, "traces", "2026-11-29") {
			t.Errorf("File(%d) dir = %q, want %s/traces/2026-11-29", index, dir, home)
		}
		if index == 1 && base != sid+"_001.jsonl" {
			t.Errorf("File(1) = %q, want %s_001.jsonl", base, sid)
		}
		if n, ok := IndexOf(p, sid); !ok || n != index {
			t.Errorf("IndexOf(%q) = %d, %v; want %d, true", p, n, ok, index)
		}
	}
}

func TestDirUsesUTCDate(t *testing.T) {
	created := time.Date(2026, 11, 30, 1, 0, 0, 0, time.FixedZone("UTC+2", 2*3600))
	if got, want := Dir("/h", created), filepath.Join("/h", "traces", "2026-11-29"); got != want {
		t.Errorf("Dir(%v) = %q, want %q", created, got, want)
	}
}

func TestIndexOfRejectsOtherNames(t *testing.T) {
	const sid = "session-2026-11-29-20-59-59-0123abcd"
	for _, name := range []string{
		sid + "_000.jsonl", sid + "_abc.jsonl", sid + "_+1.jsonl", sid + "_-1.jsonl", sid + "_ 1.jsonl",
		sid + "_.jsonl", sid + "_001.json", sid + "_001.jsonl.tmp", sid + "001.jsonl",
		"session-2026-11-29-20-59-59-0123abce_001.jsonl", sid + "_0x1.jsonl", "",
	} {
		if n, ok := IndexOf(name, sid); ok {
			t.Errorf("IndexOf(%q) = %d, true; want false", name, n)
		}
	}
}

// An imported Trace lands in the date directory of its first record: the
// original's ids use local time, so that can be another day than the id's.
func TestFilesFindsATraceInAnotherDateDirectory(t *testing.T) {
	home := t.TempDir()
	sid := "session-2026-07-19-01-10-22-3f8a1c2d" // local time; UTC was the 18th
	first := time.Date(2026, 7, 18, 17, 10, 22, 0, time.UTC)
	for _, idx := range []int{1, 2} {
		p := File(home, first, sid, idx)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("{}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Another Session's file in the id's own directory changes nothing.
	other := File(home, time.Date(2026, 7, 19, 0, 0, 0, 0, time.UTC), "session-2026-07-19-01-10-22-00000000", 1)
	os.MkdirAll(filepath.Dir(other), 0o755)
	os.WriteFile(other, []byte("{}\n"), 0o644)
	got, err := Files(home, sid)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{File(home, first, sid, 1), File(home, first, sid, 2)}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("Files = %v, want %v", got, want)
	}
	if got, err := Files(home, "session-2026-07-20-01-10-22-11111111"); err != nil || len(got) != 0 {
		t.Fatalf("Files(no trace) = %v, %v", got, err)
	}
}

package trace

import (
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

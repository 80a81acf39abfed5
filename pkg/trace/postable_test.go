package trace

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func tableSID(i int) string { return fmt.Sprintf("session-2026-12-02-00-00-00-%08x", i) }

func tablePos(home, sid string, seq uint64) Pos {
	created := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	return Pos{Seq: seq, File: File(home, created, sid, 1+int(seq%3)), Size: int64(seq) * 10, Index: 1 + int(seq%3)}
}

func openTable(t *testing.T, home string) *PosTable {
	t.Helper()
	pt, err := OpenPosTable(home)
	if err != nil {
		t.Fatalf("OpenPosTable: %v", err)
	}
	t.Cleanup(func() { pt.Close() })
	return pt
}

func TestPosTableGrowsAndKeepsEveryPosition(t *testing.T) {
	home := t.TempDir()
	pt := openTable(t, home)
	const n = 4500 // past half of 4096 and of 8192 slots: grows twice
	slots := make([]PosSlot, n)
	for i := range n {
		if err := pt.Put(tableSID(i), tablePos(home, tableSID(i), uint64(i)), &slots[i]); err != nil {
			t.Fatalf("Put %d: %v", i, err)
		}
	}
	// Rewrite through the slots remembered before the table grew: the
	// table notices and looks them up again.
	for i := range n {
		if err := pt.Put(tableSID(i), tablePos(home, tableSID(i), uint64(i)+1), &slots[i]); err != nil {
			t.Fatalf("second Put %d: %v", i, err)
		}
	}
	if pt.slots != 16384 {
		t.Errorf("slots = %d, want 16384 after %d Sessions", pt.slots, n)
	}
	for i := range n {
		want := tablePos(home, tableSID(i), uint64(i)+1)
		if p, ok, err := ReadPos(home, tableSID(i)); !ok || err != nil || p != want {
			t.Fatalf("ReadPos(%d) = %+v, %v, %v; want %+v", i, p, ok, err, want)
		}
	}
	// Deleted Sessions are gone, the others still found past their
	// tombstones, and a tombstone's slot is taken again.
	for i := 0; i < n; i += 2 {
		if err := pt.Delete(tableSID(i)); err != nil {
			t.Fatal(err)
		}
	}
	used := pt.used
	count := 0
	if err := pt.Range(func(sid string, p Pos) error { count++; return nil }); err != nil || count != n/2 {
		t.Errorf("Range saw %d positions (%v), want %d", count, err, n/2)
	}
	for i := range n {
		_, ok, err := ReadPos(home, tableSID(i))
		if err != nil || ok != (i%2 == 1) {
			t.Fatalf("ReadPos(%d) after deleting the even ones: ok %v, err %v", i, ok, err)
		}
	}
	if err := pt.Put(tableSID(0), tablePos(home, tableSID(0), 7), nil); err != nil {
		t.Fatal(err)
	}
	if p, ok, _ := ReadPos(home, tableSID(0)); !ok || p.Seq != 7 || pt.used != used {
		t.Errorf("re-created position = %+v, %v, used %d; want seq 7 in its tombstone's slot (used %d)", p, ok, pt.used, used)
	}
	// Reopened, the table holds the same.
	pt.Close()
	pt2 := openTable(t, home)
	if p, ok, err := pt2.Get(tableSID(1), nil); !ok || err != nil || p != tablePos(home, tableSID(1), 2) {
		t.Errorf("Get after reopening = %+v, %v, %v", p, ok, err)
	}
}

// Readers in other processes open the table on their own while the tracer
// writes and grows it: a read racing a write or a growth sees an older or
// a newer position, never a mix of two and never an error.
func TestPosTableReadersNeverSeeATornPosition(t *testing.T) {
	home := t.TempDir()
	pt := openTable(t, home)
	const n = 2100 // grows once
	var wg sync.WaitGroup
	done := make(chan struct{})
	errs := make(chan error, 4)
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := r; ; k += 7 {
				select {
				case <-done:
					return
				default:
				}
				sid := tableSID(k % n)
				p, ok, err := ReadPos(home, sid)
				if err != nil {
					errs <- fmt.Errorf("ReadPos(%s): %v", sid, err)
					return
				}
				if ok && p != tablePos(home, sid, p.Seq) {
					errs <- fmt.Errorf("ReadPos(%s) = %+v: not a position that was written", sid, p)
					return
				}
			}
		}()
	}
	for round := uint64(0); round < 3; round++ {
		for i := range n {
			if err := pt.Put(tableSID(i), tablePos(home, tableSID(i), round*n+uint64(i)), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(done)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}

func TestPosTableMovesOlderPositionFiles(t *testing.T) {
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, "tracer"), 0o755); err != nil {
		t.Fatal(err)
	}
	sid := tableSID(1)
	legacy := `{"seq":5,"file":"traces/2026-12-02/` + sid + `_002.jsonl","size":9,"index":2}`
	if err := os.WriteFile(PosPath(home, sid), []byte(legacy), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := tableSID(2)
	if err := os.WriteFile(PosPath(home, bad), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := Pos{Seq: 5, File: filepath.Join(home, "traces", "2026-12-02", sid+"_002.jsonl"), Size: 9, Index: 2}
	if p, ok, err := ReadPos(home, sid); !ok || err != nil || p != want {
		t.Fatalf("ReadPos of an older position file = %+v, %v, %v; want %+v", p, ok, err, want)
	}
	pt := openTable(t, home)
	if _, err := os.Stat(PosPath(home, sid)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("older position file still there after OpenPosTable: %v", err)
	}
	if p, ok, err := pt.Get(sid, nil); !ok || err != nil || p != want {
		t.Errorf("moved position = %+v, %v, %v; want %+v", p, ok, err, want)
	}
	if p, ok, err := ReadPos(home, sid); !ok || err != nil || p != want {
		t.Errorf("ReadPos of the moved position = %+v, %v, %v; want %+v", p, ok, err, want)
	}
	if _, _, err := ReadPos(home, bad); !errors.Is(err, ErrBadPos) {
		t.Errorf("unreadable older file: ReadPos err %v, want ErrBadPos (left where it is)", err)
	}
	if err := DeletePos(home, bad); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ReadPos(home, bad); ok || err != nil {
		t.Errorf("after DeletePos: %v, %v; want none", ok, err)
	}
}

// A slot damaged on disk (a power loss) may have been anyone's: a Session
// not found past it reads as ErrBadPos, others are unaffected, and writing
// the Session's position again gives it a good slot.
func TestPosTableDamagedSlot(t *testing.T) {
	home := t.TempDir()
	pt := openTable(t, home)
	a, b := tableSID(10), tableSID(11)
	for _, sid := range []string{a, b} {
		if err := pt.Put(sid, tablePos(home, sid, 3), nil); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(PosTablePath(home))
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(raw, []byte(`{"sid":"`+a))
	raw[i+100] ^= 1
	if err := os.WriteFile(PosTablePath(home), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadPos(home, a); !errors.Is(err, ErrBadPos) {
		t.Errorf("damaged position: err %v, want ErrBadPos", err)
	}
	if p, ok, err := ReadPos(home, b); !ok || err != nil || p.Seq != 3 {
		t.Errorf("another Session = %+v, %v, %v", p, ok, err)
	}
	if err := pt.Put(a, tablePos(home, a, 4), nil); err != nil {
		t.Fatal(err)
	}
	if p, ok, err := ReadPos(home, a); !ok || err != nil || p.Seq != 4 {
		t.Errorf("rewritten position = %+v, %v, %v; want seq 4", p, ok, err)
	}
}

// A header damaged on disk is rebuilt from the table's size: readers and
// the tracer still find every position, and the next new Session grows the
// table, which writes a good header again.
func TestPosTableDamagedHeader(t *testing.T) {
	home := t.TempDir()
	pt := openTable(t, home)
	for i := range 10 {
		if err := pt.Put(tableSID(i), tablePos(home, tableSID(i), 5), nil); err != nil {
			t.Fatal(err)
		}
	}
	pt.Close()
	f, err := os.OpenFile(PosTablePath(home), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("garbage"), 3)
	f.Close()
	if p, ok, err := ReadPos(home, tableSID(3)); !ok || err != nil || p.Seq != 5 {
		t.Errorf("ReadPos with a damaged header = %+v, %v, %v", p, ok, err)
	}
	pt = openTable(t, home)
	if err := pt.Put(tableSID(100), tablePos(home, tableSID(100), 6), nil); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{3, 100} {
		if _, ok, err := ReadPos(home, tableSID(i)); !ok || err != nil {
			t.Errorf("ReadPos(%d) after the table grew again: %v, %v", i, ok, err)
		}
	}
	pt.Close()
	f, _ = os.Open(PosTablePath(home))
	defer f.Close()
	if h, err := readHeader(f); err != nil || h.CRC == "" || h.Used != 11 {
		t.Errorf("header after growing = %+v, %v; want a checksummed one counting 11", h, err)
	}
}

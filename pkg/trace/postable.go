package trace

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The positions of every Session live in one file, $FLOE_HOME/tracer/
// positions: a hash table of fixed-size slots (PosTable). A new Session
// then costs one slot written into an existing file instead of a file
// created in a directory that holds every Session: creating files was most
// of what tracing a new Session cost.
//
// Layout: slot 0 is the header, slots 1..N the table (N a power of two).
// Every slot is posSize bytes, so a slot never straddles a page and is
// rewritten by one pwrite(2) that a killed writer cannot tear: a reader or
// a resuming tracer sees the old slot or the new one. A slot holds one line
// of JSON padded with spaces: the header {"floe_positions":1,"slots":N,
// "used":U,"crc":…} (U rewritten every usedEvery new Sessions), a position {"sid","seq","file","size","index","crc"},
// a tombstone {"sid","deleted":true,"crc"} (a deleted Session: probing goes
// on past it), or nothing (zero bytes, never written: probing stops). A
// Session's slot is found by linear probing from FNV-1a(sid) mod N. The
// CRC-32 (IEEE, hex) is of the JSON without its crc field; a read racing a
// write fails it and reads again.
//
// Only one writer may use the table at a time: the tracer holding the
// home's lock, or a tool or test while no tracer runs (WritePos,
// DeletePos). The table grows (doubles) when half its slots are used: the
// writer writes the larger table to positions.tmp, syncs it and renames it
// over the old one. A reader that opened the old table reads positions as
// they were at that moment: older, never inconsistent (the Trace up to an
// older position and the stream after it are still the whole history).
//
// Positions of an older layout, one file per Session ($FLOE_HOME/tracer/
// <sid>.pos), are still read when the table holds none for the Session;
// OpenPosTable moves them into the table.

const (
	posTableName     = "positions"
	posTableMinSlots = 4096 // 2 MiB, sparse until written
	usedEvery        = 64
)

// PosTablePath returns $home/tracer/positions, the position table.
func PosTablePath(home string) string {
	return filepath.Join(home, "tracer", posTableName)
}

// PosTable is the position table of one home, open for writing. It is not
// safe for concurrent use.
type PosTable struct {
	home  string
	path  string
	f     *os.File
	slots uint64 // N
	used  uint64 // slots holding a position or a tombstone
	gen   uint64 // bumped when the table is replaced (grown): slot hints expire
	page  []byte // read buffer of one slot
}

// PosSlot remembers where a Session's position is in a PosTable, so that
// rewriting it costs one pwrite; the zero value means unknown. It stays
// valid until the table grows (the PosTable notices and looks again).
type PosSlot struct {
	gen uint64
	i   uint64 // 1-based slot; 0 unknown
}

type posHeader struct {
	Version int    `json:"floe_positions"`
	Slots   uint64 `json:"slots"`
	Used    uint64 `json:"used"`
	CRC     string `json:"crc,omitempty"`
}

// posEntry is a slot's content; Pos.File is relative to home when it lies
// under it.
type posEntry struct {
	Sid     string `json:"sid"`
	Deleted bool   `json:"deleted,omitempty"`
	Seq     uint64 `json:"seq,omitempty"`
	File    string `json:"file,omitempty"`
	Size    int64  `json:"size,omitempty"`
	Index   int    `json:"index,omitempty"`
	CRC     string `json:"crc,omitempty"`
}

// slotState is what a slot holds.
type slotState int

const (
	slotEmpty slotState = iota
	slotUsed
	slotBad // does not decode or fails its checksum
)

// OpenPosTable opens (creating) the position table of home for writing,
// and moves positions of the older one-file-per-Session layout into it.
func OpenPosTable(home string) (*PosTable, error) {
	path := PosTablePath(home)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("trace: create %s: %w", filepath.Dir(path), err)
	}
	t := &PosTable{home: home, path: path, page: make([]byte, posSize)}
	if err := t.open(); err != nil {
		return nil, err
	}
	if err := t.importLegacy(); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// open opens the table file, creating an empty table when there is none.
func (t *PosTable) open() error {
	f, err := os.OpenFile(t.path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		if err := writeEmptyTable(t.path, posTableMinSlots); err != nil {
			return err
		}
		f, err = os.OpenFile(t.path, os.O_RDWR, 0)
	}
	if err != nil {
		return fmt.Errorf("trace: open position table: %w", err)
	}
	h, err := readHeader(f)
	if err != nil {
		f.Close()
		return err
	}
	if t.f != nil {
		t.f.Close()
	}
	t.f, t.slots, t.used = f, h.Slots, h.Used
	t.gen++
	return nil
}

// writeEmptyTable creates a table of n slots at path (through a temporary
// file and a rename, so a reader never sees it half-made).
func writeEmptyTable(path string, n uint64) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("trace: create position table: %w", err)
	}
	err = writeHeader(f, n, 0)
	if err == nil {
		err = f.Truncate(int64(n+1) * posSize)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("trace: create position table: %w", err)
	}
	return nil
}

// Close records the count of used slots and closes the table file.
func (t *PosTable) Close() error {
	if t.f == nil {
		return nil
	}
	err := writeHeader(t.f, t.slots, t.used)
	if cerr := t.f.Close(); err == nil {
		err = cerr
	}
	t.f = nil
	return err
}

// Get returns a Session's position; ok is false when the table holds none.
// slot, when not nil, is set to where it is (for Put).
func (t *PosTable) Get(sessionID string, slot *PosSlot) (p Pos, ok bool, err error) {
	if err := traceName(sessionID); err != nil {
		return Pos{}, false, err
	}
	i, p, ok, err := lookup(t.home, t.slots, sessionID, t.readSlot)
	if ok && slot != nil {
		*slot = PosSlot{gen: t.gen, i: i}
	}
	return p, ok, err
}

// Put records a Session's position: one pwrite of its slot, plus one of
// the header when the Session is new to the table. slot (optional) is the
// Session's PosSlot from an earlier Get or Put; Put updates it.
func (t *PosTable) Put(sessionID string, p Pos, slot *PosSlot) error {
	if err := traceName(sessionID); err != nil {
		return err
	}
	rec, err := encodeEntry(t.home, posEntry{Sid: sessionID, Seq: p.Seq, File: p.File, Size: p.Size, Index: p.Index})
	if err != nil {
		return fmt.Errorf("trace: position of %s: %w", sessionID, err)
	}
	if slot != nil && slot.i != 0 && slot.gen == t.gen {
		return t.writeSlot(slot.i, rec)
	}
	// A damaged slot on the probe path may have been this Session's; it
	// gets a new one (the damaged one is dropped when the table grows).
	i, _, found, _, err := t.find(sessionID)
	if err != nil {
		return err
	}
	if !found {
		if i, err = t.claim(sessionID); err != nil {
			return err
		}
	}
	if err := t.writeSlot(i, rec); err != nil {
		return err
	}
	if slot != nil {
		*slot = PosSlot{gen: t.gen, i: i}
	}
	return nil
}

// Delete replaces a Session's position by a tombstone; nothing when it has
// none.
func (t *PosTable) Delete(sessionID string) error {
	if err := traceName(sessionID); err != nil {
		return err
	}
	i, e, found, _, err := t.find(sessionID)
	if err != nil || !found || e.Deleted {
		return err
	}
	rec, err := encodeEntry(t.home, posEntry{Sid: sessionID, Deleted: true})
	if err != nil {
		return err
	}
	return t.writeSlot(i, rec)
}

// Range calls fn with every position in the table, in slot order.
func (t *PosTable) Range(fn func(sessionID string, p Pos) error) error {
	return t.entries(func(e posEntry) error {
		p, err := e.pos(t.home)
		if err != nil {
			return nil
		}
		return fn(e.Sid, p)
	})
}

// entries calls fn with every position in the table (no tombstones, no
// damaged slots), in slot order, reading many slots at a time.
func (t *PosTable) entries(fn func(e posEntry) error) error {
	const chunk = 128
	buf := make([]byte, chunk*posSize)
	for first := uint64(1); first <= t.slots; first += chunk {
		b := buf[:min(chunk, t.slots+1-first)*posSize]
		n, err := t.f.ReadAt(b, int64(first)*posSize)
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("trace: read position table: %w", err)
		}
		for off := 0; off+posSize <= n; off += posSize {
			e, st := decodeEntry(b[off : off+posSize])
			if st != slotUsed || e.Deleted {
				continue
			}
			if err := fn(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// find probes for sessionID's slot (see probe).
func (t *PosTable) find(sessionID string) (i uint64, e posEntry, found, bad bool, err error) {
	return probe(t.slots, sessionID, t.readSlot)
}

// probe walks sessionID's probe sequence in a table of n slots, reading
// slots with read, until its slot (found, i) or an empty one. A slot that
// does not decode may be anyone's: the walk goes on past it and reports
// bad. err is a read error.
func probe(n uint64, sessionID string, read func(uint64) (posEntry, slotState, error)) (i uint64, e posEntry, found, bad bool, err error) {
	h := slotHash(sessionID)
	for k := uint64(0); k < n; k++ {
		i := 1 + (h+k)&(n-1)
		e, st, err := read(i)
		if err != nil {
			return 0, posEntry{}, false, bad, err
		}
		switch {
		case st == slotEmpty:
			return 0, posEntry{}, false, bad, nil
		case st == slotBad:
			bad = true
		case e.Sid == sessionID:
			return i, e, true, bad, nil
		}
	}
	return 0, posEntry{}, false, bad, nil
}

// lookup finds a Session's position in a table of n slots read with read
// (probe), and returns it with File under home and the slot it is in.
func lookup(home string, n uint64, sessionID string, read func(uint64) (posEntry, slotState, error)) (uint64, Pos, bool, error) {
	i, e, found, bad, err := probe(n, sessionID, read)
	switch {
	case err != nil:
		return 0, Pos{}, false, err
	case !found && bad:
		return 0, Pos{}, false, badSlotError(sessionID)
	case !found || e.Deleted:
		return 0, Pos{}, false, nil
	}
	p, err := e.pos(home)
	return i, p, err == nil, err
}

// badSlotError is the answer for a Session not found past a damaged slot:
// the damaged one may have been its position.
func badSlotError(sessionID string) error {
	return fmt.Errorf("%w of %s: a damaged slot on its probe path", ErrBadPos, sessionID)
}

// claim finds a free slot for a Session the table does not hold (the first
// tombstone or empty slot of its probe sequence), growing the table first
// when half its slots are used.
func (t *PosTable) claim(sessionID string) (uint64, error) {
	if 2*(t.used+1) > t.slots {
		if err := t.grow(); err != nil {
			return 0, err
		}
	}
	h := slotHash(sessionID)
	for k := uint64(0); k < t.slots; k++ {
		i := 1 + (h+k)&(t.slots-1)
		e, st, err := t.readSlot(i)
		if err != nil {
			return 0, err
		}
		if st == slotUsed && e.Deleted {
			return i, nil // a tombstone: used already counts it
		}
		if st == slotEmpty {
			t.used++
			// The count is rewritten every usedEvery claims (and on
			// Close): after a crash it may be short by as many, which
			// only lets the table fill a little past half before it
			// grows (growing counts again).
			if t.used%usedEvery == 0 {
				if err := writeHeader(t.f, t.slots, t.used); err != nil {
					return 0, err
				}
			}
			return i, nil
		}
	}
	// Full of damaged slots: a larger table has room.
	if err := t.grow(); err != nil {
		return 0, err
	}
	return t.claim(sessionID)
}

// grow replaces the table by one of twice the slots holding its positions
// (tombstones and damaged slots dropped).
func (t *PosTable) grow() error {
	n := 2 * t.slots
	tmp := t.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("trace: grow position table: %w", err)
	}
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("trace: grow position table: %w", err)
	}
	if err := f.Truncate(int64(n+1) * posSize); err != nil {
		return fail(err)
	}
	taken := make([]uint64, (n+63)/64) // the new table's used slots
	used := uint64(0)
	err = t.entries(func(e posEntry) error {
		rec, err := encodeEntry("", e) // e.File is already relative
		if err != nil {
			return err
		}
		h := slotHash(e.Sid)
		for k := uint64(0); ; k++ {
			j := (h + k) & (n - 1)
			if taken[j/64]&(1<<(j%64)) == 0 {
				taken[j/64] |= 1 << (j % 64)
				if _, err := f.WriteAt(rec, int64(1+j)*posSize); err != nil {
					return err
				}
				break
			}
		}
		used++
		return nil
	})
	if err != nil {
		return fail(err)
	}
	if err := writeHeader(f, n, used); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("trace: grow position table: %w", err)
	}
	if err := os.Rename(tmp, t.path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("trace: grow position table: %w", err)
	}
	return t.open()
}

// importLegacy moves every $home/tracer/<sid>.pos into the table (the
// table entry first, then the file is removed, so a reader finds one or
// the other). Unreadable files are left where they are.
func (t *PosTable) importLegacy() error {
	names, err := readDirNames(filepath.Dir(t.path))
	if err != nil {
		return fmt.Errorf("trace: list positions: %w", err)
	}
	for _, name := range names {
		sid, ok := strings.CutSuffix(name, ".pos")
		if !ok || traceName(sid) != nil {
			continue
		}
		p, ok, err := readLegacyPos(t.home, sid)
		if err != nil || !ok {
			continue
		}
		if _, have, err := t.Get(sid, nil); err != nil || !have {
			if err := t.Put(sid, p, nil); err != nil {
				return err
			}
		}
		if err := os.Remove(PosPath(t.home, sid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("trace: remove moved position of %s: %w", sid, err)
		}
	}
	return nil
}

// readSlot reads slot i (1-based) through the page cache of t.page.
func (t *PosTable) readSlot(i uint64) (posEntry, slotState, error) {
	return readSlotAt(t.f, i, t.page)
}

func (t *PosTable) writeSlot(i uint64, rec []byte) error {
	if _, err := t.f.WriteAt(rec, int64(i)*posSize); err != nil {
		return fmt.Errorf("trace: write position table: %w", err)
	}
	return nil
}

// readSlotAt reads and decodes slot i of f, retrying a slot that fails its
// checksum (a read racing a write) twice.
func readSlotAt(f *os.File, i uint64, buf []byte) (posEntry, slotState, error) {
	b := buf[:posSize]
	for attempt := 1; ; attempt++ {
		n, err := f.ReadAt(b, int64(i)*posSize)
		if err != nil && !errors.Is(err, io.EOF) {
			return posEntry{}, slotBad, fmt.Errorf("trace: read position table: %w", err)
		}
		e, st := decodeEntry(b[:n])
		if st != slotBad || attempt == 3 {
			return e, st, nil
		}
	}
}

func decodeEntry(b []byte) (posEntry, slotState) {
	if len(b) == 0 || b[0] == 0 {
		return posEntry{}, slotEmpty
	}
	if j := bytes.IndexByte(b, '\n'); j >= 0 {
		b = b[:j]
	}
	var e posEntry
	if err := json.Unmarshal(b, &e); err != nil || e.Sid == "" {
		return posEntry{}, slotBad
	}
	sum := e.CRC
	e.CRC = ""
	if sum == "" || sum != entryCRC(e) {
		return posEntry{}, slotBad
	}
	return e, slotUsed
}

func entryCRC(e posEntry) string {
	e.CRC = ""
	b, _ := json.Marshal(e) // plain fields: cannot fail
	return fmt.Sprintf("%08x", crc32.ChecksumIEEE(b))
}

// encodeEntry returns the slot record of e, its File made relative to home
// (when home is not empty and File lies under it; else absolute).
func encodeEntry(home string, e posEntry) ([]byte, error) {
	if e.File != "" && home != "" {
		e.File = relToHome(home, e.File)
	}
	e.CRC = entryCRC(e)
	b, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	return padRecord(b, e.File)
}

// padRecord pads one JSON line to posSize: spaces, then a newline.
func padRecord(b []byte, file string) ([]byte, error) {
	if len(b) >= posSize {
		return nil, fmt.Errorf("file path %q too long for a position", file)
	}
	rec := make([]byte, posSize)
	copy(rec, b)
	for i := len(b); i < posSize-1; i++ {
		rec[i] = ' '
	}
	rec[posSize-1] = '\n'
	return rec, nil
}

// pos returns the entry's position with File as a path under home, checked
// as a position file's is.
func (e posEntry) pos(home string) (Pos, error) {
	p := Pos{Seq: e.Seq, File: e.File, Size: e.Size, Index: e.Index}
	idx, named := IndexOf(p.File, e.Sid)
	if !named || p.Size < 0 || (p.Index != 0 && p.Index != idx) {
		return Pos{}, fmt.Errorf("%w of %s: file %q, size %d, index %d", ErrBadPos, e.Sid, p.File, p.Size, p.Index)
	}
	p.Index = idx
	p.File = underHome(home, p.File)
	return p, nil
}

func slotHash(sessionID string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(sessionID))
	return h.Sum64()
}

func writeHeader(f *os.File, slots, used uint64) error {
	h := posHeader{Version: 1, Slots: slots, Used: used}
	h.CRC = headerCRC(h)
	b, err := json.Marshal(h)
	if err == nil {
		b, err = padRecord(b, "")
	}
	if err == nil {
		_, err = f.WriteAt(b, 0)
	}
	if err != nil {
		return fmt.Errorf("trace: write position table header: %w", err)
	}
	return nil
}

func headerCRC(h posHeader) string {
	h.CRC = ""
	b, _ := json.Marshal(h)
	return fmt.Sprintf("%08x", crc32.ChecksumIEEE(b))
}

// readHeader reads a table's header (retrying one that fails its checksum
// twice; one that still fails is rebuilt from the table's size).
func readHeader(f *os.File) (posHeader, error) {
	b := make([]byte, posSize)
	for attempt := 1; ; attempt++ {
		n, err := f.ReadAt(b, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			return posHeader{}, fmt.Errorf("trace: read position table: %w", err)
		}
		line := b[:n]
		if j := bytes.IndexByte(line, '\n'); j >= 0 {
			line = line[:j]
		}
		var h posHeader
		err = json.Unmarshal(line, &h)
		if err == nil && h.Version == 1 && h.Slots >= 1 && h.Slots&(h.Slots-1) == 0 && h.CRC == headerCRC(h) {
			return h, nil
		}
		if attempt == 3 {
			break
		}
	}
	// A damaged header (a power loss): the table's size still says how
	// many slots it has (it only ever changes by a rename of a whole
	// table). The count of used slots is then unknown: taken as half, so
	// the writer grows the table at its next new Session and counts again.
	if fi, err := f.Stat(); err == nil && fi.Size() >= 2*posSize && fi.Size()%posSize == 0 {
		if n := uint64(fi.Size()/posSize) - 1; n&(n-1) == 0 {
			return posHeader{Version: 1, Slots: n, Used: n / 2}, nil
		}
	}
	return posHeader{}, fmt.Errorf("%w: position table %s has no valid header", ErrBadPos, f.Name())
}

// readTablePos looks a Session up in home's position table, read-only; ok
// false when there is no table or it holds no position of the Session.
func readTablePos(home, sessionID string) (Pos, bool, error) {
	f, err := os.Open(PosTablePath(home))
	if errors.Is(err, fs.ErrNotExist) {
		return Pos{}, false, nil
	}
	if err != nil {
		return Pos{}, false, fmt.Errorf("trace: read trace position of %s: %w", sessionID, err)
	}
	defer f.Close()
	h, err := readHeader(f)
	if err != nil {
		return Pos{}, false, err
	}
	buf := make([]byte, posSize)
	_, p, ok, err := lookup(home, h.Slots, sessionID, func(i uint64) (posEntry, slotState, error) {
		return readSlotAt(f, i, buf)
	})
	return p, ok, err
}

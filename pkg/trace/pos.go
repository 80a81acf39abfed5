package trace

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"floe.dev/pkg/omni"
)

// Pos is how far a Session's Trace is written: the tracer appends
// records to File, then rewrites the position, then acknowledges the
// records on the bus. So File always holds at least Size bytes, the first
// Size bytes hold every record of the Session up to stream sequence Seq
// (and no later one), and a reader that wants the whole history takes the
// Trace files with an index below Index whole, File up to Size bytes, and
// then the Session's stream after Seq. Bytes past Size and files with an
// index above Index may be a crashed tracer's unrecorded writes; the tracer
// removes them when it resumes the Session (the records come again from
// the stream), so readers must ignore them.
//
// Seq is 0 until the tracer has written a record of the Session (it records
// its starting point before the first append).
type Pos struct {
	Seq   uint64 `json:"seq"`
	File  string `json:"file"`
	Size  int64  `json:"size"`
	Index int    `json:"index"`
}

// ErrBadPos is wrapped by ReadPos when a Session's position exists but
// does not hold a valid Pos (a position written by something else, or
// damaged by a power loss).
var ErrBadPos = errors.New("trace: malformed trace position")

// PosPath returns $home/tracer/<sid>.pos, where a Session's position was
// kept before the position table (PosTablePath): still read when the table
// holds none for the Session, moved into the table by OpenPosTable.
func PosPath(home, sessionID string) string {
	return filepath.Join(home, "tracer", sessionID+".pos")
}

// traceName checks that a Session id can name Trace and position files: a
// valid subject token (ValidSessionID) that also holds no path separator.
func traceName(sessionID string) error {
	if !omni.ValidSessionID(sessionID) || strings.ContainsAny(sessionID, `/\`) {
		return fmt.Errorf("trace: session id %q cannot name a trace file", sessionID)
	}
	return nil
}

// posSize is the fixed size of a position record (a slot of the position
// table, or a whole position file of the older layout): one line of JSON
// padded with spaces, rewritten in place with a single pwrite(2). A write
// that fits in one page is never cut short by a signal, so a killed writer
// leaves the old record or the new one. Write-temp-and-rename would be
// atomic too, but on ext4 a rename over a file (or a truncation to zero)
// forces writeback of the data and costs milliseconds instead of
// microseconds.
const posSize = 512

// posRecord is the stored form of the older layout's position file: Pos
// with File relative to home and a CRC-32 (IEEE, hex) of the JSON encoding
// of the Pos part, which catches a read racing a write (or a sector torn by
// a power loss).
type posRecord struct {
	Pos
	CRC string `json:"crc,omitempty"`
}

func posCRC(p Pos) string {
	b, _ := json.Marshal(p) // plain fields: cannot fail
	return fmt.Sprintf("%08x", crc32.ChecksumIEEE(b))
}

// ReadPos reads a Session's position: from the position table
// ($home/tracer/positions), else from a position file of the older layout
// ($home/tracer/<sid>.pos). ok is false, with a nil error, when the Session
// has none (never traced, deleted). File comes back as a path under home (it
// is stored relative to home, so a FLOE_HOME mounted at another path in
// another container still resolves). A position that does not decode or
// fails its checksum three reads in a row (a read racing a write is
// retried) gives an error wrapping ErrBadPos.
func ReadPos(home, sessionID string) (p Pos, ok bool, err error) {
	if err := traceName(sessionID); err != nil {
		return Pos{}, false, err
	}
	if p, ok, err = readTablePos(home, sessionID); ok || err != nil {
		return p, ok, err
	}
	if p, ok, err = readLegacyPos(home, sessionID); ok || err != nil {
		return p, ok, err
	}
	// OpenPosTable may have just moved the file into the table.
	return readTablePos(home, sessionID)
}

// readLegacyPos reads a position file of the older layout.
func readLegacyPos(home, sessionID string) (p Pos, ok bool, err error) {
	for attempt := 1; ; attempt++ {
		b, err := os.ReadFile(PosPath(home, sessionID))
		if errors.Is(err, fs.ErrNotExist) || (err == nil && len(b) == 0) {
			return Pos{}, false, nil
		}
		if err != nil {
			return Pos{}, false, fmt.Errorf("trace: read trace position of %s: %w", sessionID, err)
		}
		p, err = parsePos(b, sessionID)
		if err == nil {
			p.File = underHome(home, p.File)
			return p, true, nil
		}
		if attempt == 3 {
			return Pos{}, false, err
		}
	}
}

// underHome resolves a stored File: relative ones are under home.
func underHome(home, file string) string {
	f := filepath.FromSlash(file)
	if filepath.IsAbs(f) {
		return f
	}
	return filepath.Join(home, f)
}

// relToHome is the stored form of a File: relative to home when it lies
// under it, else absolute; always with forward slashes.
func relToHome(home, file string) string {
	if rel, err := filepath.Rel(home, file); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		file = rel
	} else if abs, err := filepath.Abs(file); err == nil {
		file = abs
	}
	return filepath.ToSlash(file)
}

func parsePos(b []byte, sessionID string) (Pos, error) {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[:i]
	}
	var r posRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return Pos{}, fmt.Errorf("%w of %s: %v", ErrBadPos, sessionID, err)
	}
	p := r.Pos
	if r.CRC != "" && r.CRC != posCRC(p) {
		return Pos{}, fmt.Errorf("%w of %s: checksum mismatch", ErrBadPos, sessionID)
	}
	idx, named := IndexOf(p.File, sessionID)
	if !named || p.Size < 0 || (p.Index != 0 && p.Index != idx) {
		return Pos{}, fmt.Errorf("%w of %s: file %q, size %d, index %d", ErrBadPos, sessionID, p.File, p.Size, p.Index)
	}
	p.Index = idx
	return p, nil
}

// WritePos records a Session's position in home's position table (created
// when missing), atomically: a reader, or a tracer resuming after a crash,
// sees the old position or the new one. Nothing is fsynced: after a power
// loss the position may be older than the Trace or, on some file systems,
// newer (the tracer checks the file's size against it when it resumes).
//
// The table has one writer at a time: WritePos is for tools and tests
// while no tracer runs on home (the tracer writes through its PosTable).
func WritePos(home, sessionID string, p Pos) error {
	return withPosTable(home, func(t *PosTable) error { return t.Put(sessionID, p, nil) })
}

// DeletePos removes a Session's position, from the table and any position
// file of the older layout; nothing when it has none. Like WritePos, for
// use while no tracer runs on home.
func DeletePos(home, sessionID string) error {
	if err := withPosTable(home, func(t *PosTable) error { return t.Delete(sessionID) }); err != nil {
		return err
	}
	if err := os.Remove(PosPath(home, sessionID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("trace: delete trace position of %s: %w", sessionID, err)
	}
	return nil
}

func withPosTable(home string, fn func(*PosTable) error) error {
	t, err := OpenPosTable(home)
	if err != nil {
		return err
	}
	err = fn(t)
	if cerr := t.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("trace: close position table: %w", cerr)
	}
	return err
}

// Files returns every Trace file of a Session in index order, as paths
// under home; none (and no error) when the Session has no Trace. A Session
// whose id encodes its creation (SessionCreated) has all its files in one
// date directory: the id's own, or, for an imported Trace, the one its
// import mark names (MarkImported). Its files are looked up by name, 001,
// 002, … up to the first missing one, so a Session costs a stat per file
// plus one, and a new Session two, whatever the date directories hold;
// nothing is listed. (In a home whose imports are not indexed yet,
// IndexImports, a Session found in neither place is looked for in every
// date directory.) Any other id is looked for in every date directory.
// It lists what is on disk: files past the Session's Pos may be
// unrecorded writes of a crashed tracer.
func Files(home, sessionID string) ([]string, error) {
	if err := traceName(sessionID); err != nil {
		return nil, err
	}
	created, ok := omni.SessionCreated(sessionID)
	if !ok {
		return listFiles(home, sessionID)
	}
	dir := Dir(home, created)
	files, err := probeFiles(dir, sessionID)
	if len(files) > 0 || err != nil {
		return files, err
	}
	if dir, ok, err = importedDir(home, sessionID, created); !ok || err != nil {
		return nil, err
	}
	return probeFiles(dir, sessionID)
}

// probeFiles returns the Trace files of a Session in dir: 001, 002, … up
// to the first missing one.
func probeFiles(dir, sessionID string) ([]string, error) {
	var files []string
	for idx := 1; ; idx++ {
		p := filepath.Join(dir, fileName(sessionID, idx))
		_, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return files, nil
		}
		if err != nil {
			return nil, fmt.Errorf("trace: list traces of %s: %w", sessionID, err)
		}
		files = append(files, p)
	}
}

// listFiles returns the Trace files of a Session whose id encodes no date,
// from every date directory.
func listFiles(home, sessionID string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(home, "traces"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("trace: list traces of %s: %w", sessionID, err)
	}
	type file struct {
		index int
		path  string
	}
	var files []file
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(home, "traces", e.Name())
		names, err := readDirNames(dir)
		if err != nil {
			return nil, fmt.Errorf("trace: list traces of %s: %w", sessionID, err)
		}
		for _, name := range names {
			if idx, ok := IndexOf(name, sessionID); ok {
				files = append(files, file{idx, filepath.Join(dir, name)})
			}
		}
	}
	sort.Slice(files, func(i, j int) bool {
		if files[i].index != files[j].index {
			return files[i].index < files[j].index
		}
		return files[i].path < files[j].path
	})
	paths := make([]string, len(files))
	for i, f := range files {
		paths[i] = f.path
	}
	return paths, nil
}

// readDirNames lists a directory without sorting or stat'ing its entries
// (a date directory may hold thousands of Traces); none when it is missing.
func readDirNames(dir string) ([]string, error) {
	d, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Readdirnames(-1)
}

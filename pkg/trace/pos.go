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

// ErrBadPos is wrapped by ReadPos when the position file exists
// but does not hold a valid Pos (a position written by something else,
// or damaged by a power loss).
var ErrBadPos = errors.New("trace: malformed trace position")

// PosPath returns $home/tracer/<sid>.pos, the Session's position file.
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

// posSize is the fixed size of a position file: one line of JSON
// padded with spaces, rewritten in place with a single pwrite(2) at offset
// 0. A write that fits in one page is never cut short by a signal, so a
// killed writer leaves the old record or the new one. Write-temp-and-rename
// would be atomic too, but on ext4 a rename over a file (or a truncation to
// zero) forces writeback of the data and costs milliseconds instead of
// microseconds.
const posSize = 512

// posRecord is the stored form: Pos with File relative to home
// and a CRC-32 (IEEE, hex) of the JSON encoding of the Pos part, which
// catches a read racing a write (or a sector torn by a power loss).
type posRecord struct {
	Pos
	CRC string `json:"crc,omitempty"`
}

func posCRC(p Pos) string {
	b, _ := json.Marshal(p) // plain fields: cannot fail
	return fmt.Sprintf("%08x", crc32.ChecksumIEEE(b))
}

// ReadPos reads a Session's position. ok is false, with a nil error,
// when the Session has none (never traced, deleted, or its position is
// being created). File comes back as a path under home (it is stored
// relative to home, so a FLOE_HOME mounted at another path in another
// container still resolves). A position that does not decode or fails its
// checksum three reads in a row (a read racing a write is retried) gives an
// error wrapping ErrBadPos.
func ReadPos(home, sessionID string) (p Pos, ok bool, err error) {
	if err := traceName(sessionID); err != nil {
		return Pos{}, false, err
	}
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
			if f := filepath.FromSlash(p.File); !filepath.IsAbs(f) {
				p.File = filepath.Join(home, f)
			} else {
				p.File = f
			}
			return p, true, nil
		}
		if attempt == 3 {
			return Pos{}, false, err
		}
	}
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

// WritePos replaces a Session's position atomically: the file is one
// fixed-size record (EncodePos) rewritten in place by a single pwrite,
// so a reader, or a tracer resuming after a crash, sees the old position or
// the new one (a concurrent read that catches a write half-way fails the
// checksum and ReadPos reads again). It creates $home/tracer when
// missing. Nothing is fsynced: after a power loss the position may be older
// than the Trace or, on some file systems, newer (the tracer checks the
// file's size against it when it resumes).
//
// Only one writer per Session may write its position at a time (the tracer
// holds a lock on home for that).
func WritePos(home, sessionID string, p Pos) error {
	if err := traceName(sessionID); err != nil {
		return err
	}
	rec, err := EncodePos(home, p)
	if err != nil {
		return fmt.Errorf("trace: trace position of %s: %w", sessionID, err)
	}
	path := PosPath(home, sessionID)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if errors.Is(err, fs.ErrNotExist) {
		if err = os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
			f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
		}
	}
	if err != nil {
		return fmt.Errorf("trace: write trace position of %s: %w", sessionID, err)
	}
	_, err = f.WriteAt(rec, 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("trace: write trace position of %s: %w", sessionID, err)
	}
	return nil
}

// EncodePos returns the fixed-size record WritePos writes at
// offset 0 of PosPath: for a writer that keeps the file open and
// rewrites it with one WriteAt. File is a path as File builds it (home
// joined with the rest); it is stored relative to home when it lies under
// it, else as an absolute path. It fails only when the path is too long for
// the record.
func EncodePos(home string, p Pos) ([]byte, error) {
	if rel, err := filepath.Rel(home, p.File); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		p.File = rel
	} else if abs, err := filepath.Abs(p.File); err == nil {
		p.File = abs
	}
	p.File = filepath.ToSlash(p.File)
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	// The stored record is the checksummed encoding with a crc field added.
	sum := crc32.ChecksumIEEE(b)
	b = fmt.Appendf(b[:len(b)-1], `,"crc":"%08x"}`, sum)
	if len(b) >= posSize {
		return nil, fmt.Errorf("file path %q too long for a position", p.File)
	}
	rec := make([]byte, posSize)
	copy(rec, b)
	for i := len(b); i < posSize-1; i++ {
		rec[i] = ' '
	}
	rec[posSize-1] = '\n'
	return rec, nil
}

// Files returns every Trace file of a Session in index order, as paths
// under home; none (and no error) when the Session has no Trace. A Session
// whose id encodes its creation (SessionCreated) is looked up in that UTC
// date's directory only, and only when its file 001 exists there (so a new
// Session costs one stat, whatever the directory holds); any other id in
// every date directory. It lists
// what is on disk: files past the Session's Pos may be unrecorded
// writes of a crashed tracer.
func Files(home, sessionID string) ([]string, error) {
	if err := traceName(sessionID); err != nil {
		return nil, err
	}
	var dirs []string
	if created, ok := omni.SessionCreated(sessionID); ok {
		// A new Session has no file 001: answer that without listing the
		// day's directory, which holds every Session created that day
		// (listing it for each new Session slowed tracing down with the
		// day's Session count).
		if _, err := os.Lstat(File(home, created, sessionID, 1)); errors.Is(err, fs.ErrNotExist) {
			// An imported Trace lands in the date directory of its
			// first record, which need not be the id's date (the
			// original's ids use local time): one stat per date
			// directory, no listing.
			dir, err := importedDir(home, sessionID)
			if dir == "" || err != nil {
				return nil, err
			}
			dirs = []string{dir}
		} else {
			dirs = []string{Dir(home, created)}
		}
	} else {
		entries, err := os.ReadDir(filepath.Join(home, "traces"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("trace: list traces of %s: %w", sessionID, err)
		}
		for _, e := range entries {
			if e.IsDir() {
				dirs = append(dirs, filepath.Join(home, "traces", e.Name()))
			}
		}
	}
	type file struct {
		index int
		path  string
	}
	var files []file
	for _, dir := range dirs {
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

// importedDir returns the date directory holding file 001 of sessionID,
// or "" when there is none.
func importedDir(home, sessionID string) (string, error) {
	root := filepath.Join(home, "traces")
	names, err := readDirNames(root)
	if err != nil {
		return "", fmt.Errorf("trace: list traces of %s: %w", sessionID, err)
	}
	sort.Strings(names)
	name := fmt.Sprintf("%s_%03d.jsonl", sessionID, 1)
	for _, d := range names {
		if _, err := os.Lstat(filepath.Join(root, d, name)); err == nil {
			return filepath.Join(root, d), nil
		}
	}
	return "", nil
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

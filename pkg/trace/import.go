package trace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"floe.dev/pkg/omni"
)

// An imported Trace lands in the date directory of its first record (protocol.md
// §5), which need not be the one its id names (the original's ids use
// local time). So that Files finds it without looking in every date
// directory, the import leaves a mark in the id's own date directory,
// <sid>.import, holding the name of the date directory it used.

// markPath is the import mark of a Session whose id dates it created.
func markPath(home, sessionID string, created time.Time) string {
	return filepath.Join(Dir(home, created), sessionID+".import")
}

const dateLayout = "2006-01-02"

// MarkImported records that Session sessionID's Trace is being imported
// into the date directory of first (where File(home, first, sessionID, 1)
// lands), when that is not the directory its id names; nothing otherwise.
// Call it before the Trace file is written: a mark without a Trace is
// harmless, a Trace without its mark would be found only by IndexImports.
// The mark is written whole (a temporary file, synced, renamed).
func MarkImported(home, sessionID string, first time.Time) error {
	if err := traceName(sessionID); err != nil {
		return err
	}
	created, ok := omni.SessionCreated(sessionID)
	if !ok || Dir(home, created) == Dir(home, first) {
		return nil
	}
	return writeMark(home, sessionID, created, first.UTC().Format(dateLayout))
}

func writeMark(home, sessionID string, created time.Time, date string) error {
	path := markPath(home, sessionID, created)
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("trace: mark import of %s: %w", sessionID, err)
	}
	f, err := os.CreateTemp(dir, ".mark-*")
	if err != nil {
		return fmt.Errorf("trace: mark import of %s: %w", sessionID, err)
	}
	defer os.Remove(f.Name())
	_, err = f.WriteString(date + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("trace: mark import of %s: %w", sessionID, err)
	}
	return nil
}

// UnmarkImported removes a Session's import mark, if any: for an import
// that did not happen, and for the tracer deleting the Session (after its
// Trace files, so that a delete cut short finds them again).
func UnmarkImported(home, sessionID string) error {
	if err := traceName(sessionID); err != nil {
		return err
	}
	created, ok := omni.SessionCreated(sessionID)
	if !ok {
		return nil
	}
	if err := os.Remove(markPath(home, sessionID, created)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("trace: remove import mark of %s: %w", sessionID, err)
	}
	return nil
}

// importedDir returns the date directory an imported Trace of sessionID
// was put in, as its mark names it; ok is false when there is none. In a
// home whose imports are not indexed yet (imported before marks existed),
// or when the mark is unreadable, it looks for file 001 in every date
// directory instead.
func importedDir(home, sessionID string, created time.Time) (dir string, ok bool, err error) {
	b, err := os.ReadFile(markPath(home, sessionID, created))
	if err == nil {
		if date, perr := time.Parse(dateLayout, strings.TrimSpace(string(b))); perr == nil {
			return Dir(home, date), true, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", false, fmt.Errorf("trace: read import mark of %s: %w", sessionID, err)
	} else if indexed(home) {
		return "", false, nil
	}
	return scanImported(home, sessionID)
}

// scanImported looks for file 001 of sessionID in every date directory:
// one stat per directory, in date order.
func scanImported(home, sessionID string) (string, bool, error) {
	root := filepath.Join(home, "traces")
	names, err := readDirNames(root)
	if err != nil {
		return "", false, fmt.Errorf("trace: list traces of %s: %w", sessionID, err)
	}
	sort.Strings(names)
	name := fileName(sessionID, 1)
	for _, d := range names {
		if _, err := os.Lstat(filepath.Join(root, d, name)); err == nil {
			return filepath.Join(root, d), true, nil
		}
	}
	return "", false, nil
}

// IndexesPath is the file that says every imported Trace of home has its
// import mark: $home/tracer/imports-indexed, written by IndexImports.
func IndexesPath(home string) string {
	return filepath.Join(home, "tracer", "imports-indexed")
}

// indexedHomes caches the homes known to be indexed (that never changes
// back).
var indexedHomes sync.Map

func indexed(home string) bool {
	if _, ok := indexedHomes.Load(home); ok {
		return true
	}
	if _, err := os.Stat(IndexesPath(home)); err != nil {
		return false
	}
	indexedHomes.Store(home, true)
	return true
}

// IndexImports gives every imported Trace of home that has no import mark
// one (Traces imported before marks existed), then records that home is
// indexed, so that Files never again looks in every date directory for a
// Session. It lists every date directory, once per home: the tracer runs
// it when it starts. It returns how many marks it wrote.
func IndexImports(home string) (int, error) {
	if indexed(home) {
		return 0, nil
	}
	root := filepath.Join(home, "traces")
	dates, err := readDirNames(root)
	if err != nil {
		return 0, fmt.Errorf("trace: index imports: %w", err)
	}
	sort.Strings(dates) // the first date directory wins, as for scanImported
	found := map[string]string{}
	var sids []string
	for _, d := range dates {
		if _, err := time.Parse(dateLayout, d); err != nil {
			continue
		}
		names, err := readDirNames(filepath.Join(root, d))
		if err != nil {
			return 0, fmt.Errorf("trace: index imports: %w", err)
		}
		for _, name := range names {
			sid, ok := strings.CutSuffix(name, "_001.jsonl")
			if !ok || traceName(sid) != nil {
				continue
			}
			if created, ok := omni.SessionCreated(sid); !ok || Dir(home, created) == filepath.Join(root, d) {
				continue
			}
			if _, seen := found[sid]; !seen {
				found[sid] = d
				sids = append(sids, sid)
			}
		}
	}
	n := 0
	for _, sid := range sids {
		created, _ := omni.SessionCreated(sid)
		if _, err := os.Lstat(File(home, created, sid, 1)); err == nil {
			continue // its own directory has a Trace: Files takes that one
		}
		if err := writeMark(home, sid, created, found[sid]); err != nil {
			return n, fmt.Errorf("trace: index imports: %w", err)
		}
		n++
	}
	if err := os.MkdirAll(filepath.Dir(IndexesPath(home)), 0o755); err != nil {
		return n, fmt.Errorf("trace: index imports: %w", err)
	}
	if err := os.WriteFile(IndexesPath(home), []byte("1\n"), 0o644); err != nil {
		return n, fmt.Errorf("trace: index imports: %w", err)
	}
	return n, nil
}

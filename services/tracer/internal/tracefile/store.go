// Package tracefile writes Session Traces (protocol.md §5): one append-only JSONL
// file per Session and context under $FLOE_HOME/traces/<date>/, rotated on
// session_meta, with a position (trace.Pos, a slot of the home's position
// table, trace.PosTable) per Session that makes appends exactly-once across
// crashes when the caller follows the protocol:
//
//  1. Append the records of a batch (each one write(2) of the record and its
//     newline, on an O_APPEND descriptor);
//  2. Flush: rewrite the position of every Session the batch touched (one
//     fixed-size in-place pwrite of its slot per Session);
//  3. only then acknowledge the batch on the bus.
//
// A process killed anywhere in that sequence leaves, per Session, either
// records past the recorded position (killed in 1 or before 2 completed:
// the file is truncated back to the recorded size when the Session is next
// touched, and the unacknowledged records come again) or a position ahead
// of the acknowledgement (killed between 2 and 3: the redelivered records
// have sequences at or below the recorded one and are skipped). Files
// created by a rotation that was never recorded are removed on resume.
//
// Nothing is fsynced. A process crash loses nothing (the page cache
// survives it); a power loss or kernel crash can lose the last seconds of
// appends that were already acknowledged (until the kernel's writeback,
// typically up to 30 s), and the position may then point past the end of
// the file: the Store notices, logs it and continues from the file's real
// end, so those records are missing from the Trace (they stay in the stream
// while it retains them). Syncing every batch would cost about a
// millisecond per touched Session (measured on ext4 here: ~2 µs without).
//
// A Store is used by one goroutine; it is not safe for concurrent use.
package tracefile

import (
	"container/list"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
)

// Record is one Trace record to append.
type Record struct {
	// Seq is the record's FLOE_SESSIONS stream sequence.
	Seq uint64
	// Data is the OmniMessage JSON exactly as it was on the bus, one line,
	// without a trailing newline. Append copies it.
	Data []byte
	// Meta marks a session_meta: it starts a new file when the current one
	// already holds records.
	Meta bool
	// Time dates the Trace of a Session whose id does not encode its
	// creation (the first record's timestamp decides its directory).
	Time time.Time
}

// Store appends records to Trace files under a home directory. It keeps at
// most maxOpen Sessions in memory, each with its Trace file open; the least
// recently used one is flushed and closed to make room, and is reloaded
// from its position when it comes back.
type Store struct {
	home    string
	maxOpen int
	log     zerolog.Logger
	lock    *os.File
	pos     *trace.PosTable

	sessions map[string]*session
	lru      list.List  // of *session, most recently used first
	dirty    []*session // appended to since the last Flush
	gen      uint64     // Flush generation: files are checked once per generation
	buf      []byte     // write buffer: one record and its newline(s)
	// deleted maps a deleted Session to the stream sequence its messages
	// were purged through: records at or below it still in flight are
	// dropped (Delete, Committed).
	deleted map[string]uint64
	// failPos, set by tests only, makes a position write fail.
	failPos func(sessionID string) error
}

// session is the in-memory state of one Session's Trace.
type session struct {
	id     string
	dir    string // the date directory of all its files
	index  int    // current file index, 1-based
	path   string // current file
	f      *os.File
	slot   trace.PosSlot // where its position is in the table
	size   int64         // bytes in the current file, ours included
	seq    uint64        // stream sequence of the last record written
	needNL bool          // the file does not end in a newline: start the next record on a new line

	dirty   bool
	checked uint64    // generation in which the file was last checked
	used    time.Time // last Append (or load)
	elem    *list.Element
}

// ErrLocked is returned by Open when another Store (another tracer) holds
// the home directory.
var ErrLocked = errors.New("tracefile: another tracer holds the lock on this home")

// DefaultMaxOpen is the default bound on Sessions (and open files) kept.
const DefaultMaxOpen = 256

// Open takes the tracer lock on home (creating $home/tracer) and returns a
// Store keeping at most maxOpen Sessions open (DefaultMaxOpen when ≤ 0).
// It fails with ErrLocked while another Store holds the lock.
func Open(home string, maxOpen int, log zerolog.Logger) (*Store, error) {
	if maxOpen <= 0 {
		maxOpen = DefaultMaxOpen
	}
	dir := filepath.Join(home, "tracer")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("tracefile: create %s: %w", dir, err)
	}
	lock, err := lockFile(filepath.Join(dir, "lock"))
	if err != nil {
		return nil, err
	}
	pos, err := trace.OpenPosTable(home)
	if err != nil {
		unlockFile(lock)
		return nil, fmt.Errorf("tracefile: %w", err)
	}
	// Once per home: marks for Traces imported before imports left one,
	// so that a new Session is never looked for in every date directory.
	if n, err := trace.IndexImports(home); err != nil {
		pos.Close()
		unlockFile(lock)
		return nil, fmt.Errorf("tracefile: %w", err)
	} else if n > 0 {
		log.Info().Int("marks", n).Msg("indexed imported traces")
	}
	return &Store{home: home, maxOpen: maxOpen, log: log, lock: lock, pos: pos, sessions: make(map[string]*session), deleted: make(map[string]uint64)}, nil
}

// Append writes rec to the Session's current Trace file, unless the
// Session's position already covers rec.Seq (a redelivery of a record
// written before a restart): then it reports written false. A session_meta
// rotates to the next file first when the current one holds records.
//
// An error means the file may hold a partial record: the caller must not
// acknowledge, and must Reset the Store before going on (resuming truncates
// the file back to its recorded position).
func (s *Store) Append(sessionID string, rec Record) (written bool, err error) {
	if through, ok := s.deleted[sessionID]; ok && rec.Seq <= through {
		return false, nil
	}
	st, err := s.session(sessionID, rec.Time)
	if err != nil {
		return false, err
	}
	if rec.Seq <= st.seq {
		return false, nil
	}
	if st.checked != s.gen {
		if err := s.check(st); err != nil {
			return false, err
		}
		st.checked = s.gen
	}
	if rec.Meta && st.size > 0 {
		if err := s.rotate(st); err != nil {
			return false, err
		}
	}
	b := s.buf[:0]
	if st.needNL {
		b = append(b, '\n')
	}
	b = append(b, rec.Data...)
	b = append(b, '\n')
	n, err := st.f.Write(b)
	st.size += int64(n)
	if cap(b) <= 1<<20 {
		s.buf = b // keep a small buffer; let a huge record's go
	}
	if err != nil {
		return false, fmt.Errorf("tracefile: append to %s: %w", st.path, err)
	}
	st.needNL = false
	st.seq = rec.Seq
	if !st.dirty {
		st.dirty = true
		s.dirty = append(s.dirty, st)
	}
	return true, nil
}

// Flush records the position of every Session appended to since the last
// Flush. After it returns nil the appended records may be acknowledged.
//
// A position that cannot be written (the shared position table refuses
// it) fails its Session only: that Session is forgotten (Forget: its
// appends since its recorded position are written again when it is
// reloaded), the others are recorded, and the error is a PositionErrors
// naming the failed ones. After a PositionErrors the records may be
// acknowledged too, once the caller has set the failed Sessions aside.
func (s *Store) Flush() error {
	var failed PositionErrors
	for _, st := range s.dirty {
		if !st.dirty {
			continue // flushed when it was evicted
		}
		if err := s.writePos(st); err != nil {
			if failed == nil {
				failed = PositionErrors{}
			}
			failed[st.id] = err
			s.Forget(st.id)
			continue
		}
		st.dirty = false
	}
	clear(s.dirty)
	s.dirty = s.dirty[:0]
	s.gen++
	if failed != nil {
		return failed
	}
	return nil
}

// ErrPositionWrite is wrapped by every error of a position the shared
// position table refused (from Flush, or from an Append that records a
// Session's starting point).
var ErrPositionWrite = errors.New("tracefile: position not recorded")

// PositionErrors is Flush's error when only some Sessions' positions could
// not be written: each failed Session's error.
type PositionErrors map[string]error

func (e PositionErrors) Error() string {
	ids := make([]string, 0, len(e))
	for id := range e {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(e[id].Error())
	}
	return b.String()
}

// FailPositions makes every position write of a Session for which fail
// returns an error fail with it (tests: a position table that refuses
// writes). nil ends it.
func (s *Store) FailPositions(fail func(sessionID string) error) { s.failPos = fail }

// Delete removes a Session's Trace files and position and forgets it; it
// returns how many Trace files it removed. The Session's messages are
// already purged from the stream through sequence purgedThrough: records
// of it at or below that which still arrive (delivered before the purge)
// are dropped instead of creating the Trace again. A failure leaves what it
// could not remove; deleting again finishes the job.
func (s *Store) Delete(sessionID string, purgedThrough uint64) (int, error) {
	if st := s.sessions[sessionID]; st != nil {
		st.close()
		st.dirty = false // Flush skips it
		s.lru.Remove(st.elem)
		delete(s.sessions, sessionID)
	}
	if purgedThrough > 0 {
		s.deleted[sessionID] = purgedThrough
	}
	files, err := trace.Files(s.home, sessionID)
	if err != nil {
		return 0, fmt.Errorf("tracefile: delete %s: %w", sessionID, err)
	}
	// Last file first, and the import mark after them: what a failure
	// leaves is still found (trace.Files looks from file 001 up to the
	// first missing one).
	n := 0
	for i := len(files) - 1; i >= 0; i-- {
		if err := os.Remove(files[i]); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return n, fmt.Errorf("tracefile: delete %s: %w", sessionID, err)
		}
		n++
	}
	if err := trace.UnmarkImported(s.home, sessionID); err != nil {
		return n, fmt.Errorf("tracefile: delete %s: %w", sessionID, err)
	}
	if err := s.pos.Delete(sessionID); err != nil {
		return n, fmt.Errorf("tracefile: delete position of %s: %w", sessionID, err)
	}
	if err := os.Remove(trace.PosPath(s.home, sessionID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return n, fmt.Errorf("tracefile: delete position of %s: %w", sessionID, err)
	}
	return n, nil
}

// Committed tells the Store that every message up to seq is acknowledged:
// deleted Sessions purged through an earlier sequence can no longer send
// records, so they are forgotten.
func (s *Store) Committed(seq uint64) {
	for id, through := range s.deleted {
		if through < seq {
			delete(s.deleted, id)
		}
	}
}

// Forget drops one Session as Reset drops every one: nothing of it is
// recorded, its file is closed and its next Append reloads it from its
// recorded position, truncating what was written after it. Use it after
// an Append of that Session failed, to go on with the others.
func (s *Store) Forget(sessionID string) {
	st := s.sessions[sessionID]
	if st == nil {
		return
	}
	st.close()
	st.dirty = false // Flush skips it
	s.lru.Remove(st.elem)
	delete(s.sessions, sessionID)
}

// Recorded returns the stream sequence of the last record of the Session
// whose position is recorded (0 when none is).
func (s *Store) Recorded(sessionID string) (uint64, error) {
	var slot trace.PosSlot
	pos, ok, err := s.pos.Get(sessionID, &slot)
	if err != nil && !errors.Is(err, trace.ErrBadPos) {
		return 0, fmt.Errorf("tracefile: %w", err)
	}
	if !ok {
		return 0, nil
	}
	return pos.Seq, nil
}

// Reset forgets every Session without recording anything, as a crash
// would: their files are closed and the next Append of each reloads it from
// its position, truncating what was written after it. Use it after an
// error, before records are redelivered.
func (s *Store) Reset() {
	for _, st := range s.sessions {
		st.close()
	}
	clear(s.sessions)
	clear(s.dirty)
	s.dirty = s.dirty[:0]
	s.lru.Init()
	s.gen++
}

// Close closes every file and releases the lock. It records nothing: Flush
// first to keep what was appended since (unrecorded appends are truncated
// and written again on the next start).
func (s *Store) Close() error {
	s.Reset()
	if s.lock == nil {
		return nil
	}
	err := s.pos.Close()
	if uerr := unlockFile(s.lock); err == nil {
		err = uerr
	}
	s.lock = nil
	return err
}

func (st *session) pos() trace.Pos {
	return trace.Pos{Seq: st.seq, File: st.path, Size: st.size, Index: st.index}
}

// close closes the Session's file. Write errors were reported by the
// writes themselves (nothing is buffered), so close errors are not.
func (st *session) close() {
	if st.f != nil {
		st.f.Close()
		st.f = nil
	}
}

// writePos records the Session's position: its slot of the position table,
// rewritten in place (one pwrite).
func (s *Store) writePos(st *session) error {
	if s.failPos != nil {
		if err := s.failPos(st.id); err != nil {
			return fmt.Errorf("%w: position of %s: %w", ErrPositionWrite, st.id, err)
		}
	}
	if err := s.pos.Put(st.id, st.pos(), &st.slot); err != nil {
		return fmt.Errorf("%w: position of %s: %w", ErrPositionWrite, st.id, err)
	}
	return nil
}

// session returns the Session's state, loading it (and evicting the least
// recently used one) when it is not in memory.
func (s *Store) session(id string, first time.Time) (*session, error) {
	if st := s.sessions[id]; st != nil {
		s.lru.MoveToFront(st.elem)
		st.used = time.Now()
		return st, nil
	}
	if len(s.sessions) >= s.maxOpen {
		if err := s.evict(s.lru.Back().Value.(*session)); err != nil {
			return nil, err
		}
	}
	st, err := s.load(id, first)
	if err != nil {
		return nil, err
	}
	st.checked = s.gen
	st.used = time.Now()
	st.elem = s.lru.PushFront(st)
	s.sessions[id] = st
	return st, nil
}

// CloseIdle closes the files of the Sessions last appended to before
// before and forgets them (recording a position first where one is not
// recorded), so an idle Session holds neither a descriptor nor memory in
// the tracer; one that comes back is reloaded from its position. It
// returns how many it closed.
func (s *Store) CloseIdle(before time.Time) (int, error) {
	n := 0
	for e := s.lru.Back(); e != nil; e = s.lru.Back() {
		st := e.Value.(*session)
		if !st.used.Before(before) {
			break
		}
		if err := s.evict(st); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// evict drops a Session from memory, recording its position first when it
// has unrecorded appends, so that reloading it finds them.
func (s *Store) evict(st *session) error {
	if st.dirty {
		if err := s.writePos(st); err != nil {
			return err
		}
		st.dirty = false
	}
	st.close()
	s.lru.Remove(st.elem)
	delete(s.sessions, st.id)
	return nil
}

// load resumes a Session from its position, or starts it: at the end of
// its last existing Trace file (one written by another tool, or by a tracer
// whose position was deleted), else in a new file dated by the id or, for
// an id that encodes no date, by first.
func (s *Store) load(id string, first time.Time) (*session, error) {
	var slot trace.PosSlot
	pos, ok, err := s.pos.Get(id, &slot)
	if errors.Is(err, trace.ErrBadPos) {
		s.log.Error().Err(err).Str("session_id", id).Msg("ignoring unreadable trace position")
		ok, err = false, nil
	}
	if err != nil {
		return nil, fmt.Errorf("tracefile: %w", err)
	}
	if ok {
		return s.resume(id, pos, slot)
	}
	st := &session{id: id}
	files, err := trace.Files(s.home, id)
	if err != nil {
		return nil, fmt.Errorf("tracefile: %w", err)
	}
	if len(files) > 0 {
		st.path = files[len(files)-1]
		st.index, _ = trace.IndexOf(st.path, id)
	} else {
		created, ok := omni.SessionCreated(id)
		if !ok {
			created = first
		}
		st.index = 1
		st.path = trace.File(s.home, created, id, 1)
	}
	st.dir = filepath.Dir(st.path)
	if err := s.openSized(st); err != nil {
		return nil, err
	}
	if err := s.checkTail(st); err != nil {
		st.close()
		return nil, err
	}
	// Record the starting point before the first append: a crash after it
	// must find a position to truncate back to, or the redelivered records
	// would be appended a second time.
	if err := s.writePos(st); err != nil {
		st.close()
		return nil, err
	}
	return st, nil
}

// resume reopens a Session at its recorded position, undoing whatever a
// crashed tracer wrote after it.
func (s *Store) resume(id string, pos trace.Pos, slot trace.PosSlot) (*session, error) {
	st := &session{id: id, path: pos.File, dir: filepath.Dir(pos.File), index: pos.Index, seq: pos.Seq, slot: slot}
	if err := s.openSized(st); err != nil {
		return nil, err
	}
	switch {
	case st.size > pos.Size:
		if err := st.f.Truncate(pos.Size); err != nil {
			st.close()
			return nil, fmt.Errorf("tracefile: truncate %s to %d: %w", st.path, pos.Size, err)
		}
		s.log.Info().Str("session_id", id).Uint64("seq", pos.Seq).Int64("size", pos.Size).
			Int64("dropped", st.size-pos.Size).Msg("truncated unrecorded trace tail")
		st.size = pos.Size
	case st.size < pos.Size:
		s.log.Warn().Str("session_id", id).Uint64("seq", pos.Seq).Int64("size", st.size).
			Int64("recorded_size", pos.Size).Msg("trace file is shorter than its recorded position")
	}
	if err := s.checkTail(st); err != nil {
		st.close()
		return nil, err
	}
	// Files after the recorded one come from rotations that were never
	// recorded; their records come again from the stream.
	for idx := st.index + 1; ; idx++ {
		later := filepath.Join(st.dir, traceName(id, idx))
		err := os.Remove(later)
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err != nil {
			st.close()
			return nil, fmt.Errorf("tracefile: remove unrecorded %s: %w", later, err)
		}
		s.log.Info().Str("session_id", id).Int("index", idx).Msg("removed unrecorded trace file")
	}
	return st, nil
}

// check notices files removed, replaced or changed behind the Store's back
// (the gateway deleting a Session, another tool appending) and adapts: a
// removed file is created again.
func (s *Store) check(st *session) error {
	fi, err := st.f.Stat()
	switch {
	case err != nil:
		return fmt.Errorf("tracefile: stat %s: %w", st.path, err)
	case removed(st.path, fi):
		s.log.Warn().Str("session_id", st.id).Str("file", st.path).Msg("trace file was removed or replaced; reopening")
		st.close()
		if err := s.open(st, 0); err != nil {
			return err
		}
		fi, err := st.f.Stat()
		if err != nil {
			return fmt.Errorf("tracefile: stat %s: %w", st.path, err)
		}
		st.size = fi.Size()
		return s.checkTail(st)
	case fi.Size() != st.size:
		s.log.Warn().Str("session_id", st.id).Str("file", st.path).Int64("size", fi.Size()).
			Int64("expected_size", st.size).Msg("trace file changed size behind the tracer")
		st.size = fi.Size()
		return s.checkTail(st)
	}
	return nil
}

// rotate moves a Session to its next file. A leftover file at that index
// can only hold unrecorded writes, so it is truncated.
func (s *Store) rotate(st *session) error {
	st.close()
	st.index++
	st.path = filepath.Join(st.dir, traceName(st.id, st.index))
	if err := s.open(st, os.O_TRUNC); err != nil {
		return err
	}
	st.size, st.needNL = 0, false
	return nil
}

// open opens (creating) st.path for appending, creating its directory when
// it is missing.
func (s *Store) open(st *session, flag int) error {
	flag |= os.O_RDWR | os.O_APPEND | os.O_CREATE
	f, err := os.OpenFile(st.path, flag, 0o644)
	if errors.Is(err, fs.ErrNotExist) {
		if err = os.MkdirAll(st.dir, 0o755); err == nil {
			f, err = os.OpenFile(st.path, flag, 0o644)
		}
	}
	if err != nil {
		return fmt.Errorf("tracefile: open %s: %w", st.path, err)
	}
	st.f = f
	return nil
}

// openSized opens st.path and sets st.size to its size.
func (s *Store) openSized(st *session) error {
	if err := s.open(st, 0); err != nil {
		return err
	}
	fi, err := st.f.Stat()
	if err != nil {
		st.close()
		return fmt.Errorf("tracefile: stat %s: %w", st.path, err)
	}
	st.size = fi.Size()
	return nil
}

// checkTail sets needNL when the file's last byte (at st.size) is not a
// newline: a torn record, or a file written by another tool.
func (s *Store) checkTail(st *session) error {
	st.needNL = false
	if st.size == 0 {
		return nil
	}
	var b [1]byte
	if _, err := st.f.ReadAt(b[:], st.size-1); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("tracefile: read %s: %w", st.path, err)
	}
	st.needNL = b[0] != '\n'
	return nil
}

// traceName is the base name of a Session's Trace file number index, as
// trace.File builds it.
func traceName(id string, index int) string {
	return filepath.Base(trace.File("", time.Time{}, id, index))
}

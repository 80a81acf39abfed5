// Package snapshot keeps context snapshots: a Session's folded model
// context (fold.State) with the FLOE_SESSIONS sequence it covers, so that a
// Task starts from it and folds only the records stored after it instead
// of the Session's whole history (docs/history-window.md).
//
// A snapshot is taken at a Task boundary, from the fold a Task started
// with, never from a Runner's live fold: it is exactly what a full replay
// of the history up to its sequence gives, so starting from it never
// changes what the model is sent. Two places hold snapshots:
//
//   - the omni.SnapshotsBucket KV bucket, so any engine replica (or this one
//     after a restart) starts from it: msgpack, versioned, written when
//     Every records, and Grow times as many as the context has entries,
//     were folded since the stored one (so writing it costs O(1) per
//     record however long the Session: the whole context is encoded at
//     most once per as many records as it holds entries);
//   - this engine's memory, for the Sessions it ran last (Keep of them), so
//     the next Task here folds one Task's records and decodes nothing else.
//
// A snapshot is used only when it is this Session's (same id and creation
// time), of this stream's incarnation (epoch), and the stream still holds
// everything after it; otherwise (missing, stale, corrupt, foreign version)
// Load folds the whole history with trace.Replay and logs why.
package snapshot

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/s2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/engine/internal/fold"
)

// Version is the snapshot format: an engine that reads another version
// folds from the history instead (and writes its own). Bump it whenever
// fold.State or Envelope changes meaning. Version 2's Body is the S2
// block encoding of what version 1's was (the msgpack of Snapshot);
// version 1 is still read.
const Version = 2

// maxDecoded bounds a stored snapshot's decompressed size: a damaged
// length is corrupt, not an allocation.
const maxDecoded = 1 << 30

// Defaults of Store.
const (
	DefaultEvery = 256
	DefaultGrow  = 1
	DefaultKeep  = 64
)

// Envelope is a stored snapshot. Body is the msgpack of Snapshot,
// S2-compressed (a context is mostly text the model saw: the stored
// snapshot is written into the bucket's block being written, which keeps
// every version until it is sealed), decoded only when V is Version (or
// 1, uncompressed).
type Envelope struct {
	V    int    `msgpack:"v"`
	Body []byte `msgpack:"body"`
}

// Snapshot is one Session's folded context at a stream position.
type Snapshot struct {
	SessionID string `msgpack:"session_id"`
	// Created is the Session record's creation time: a Session deleted and
	// imported again under its id is another Session.
	Created int64 `msgpack:"created_unix_ms"`
	// Epoch is FLOE_SESSIONS's creation time (unix ms): sequences of a
	// recreated stream mean something else.
	Epoch int64 `msgpack:"epoch"`
	// Seq is the last stream sequence the context covers: every Trace-class
	// message of the Session at or below it is folded in, none above.
	Seq uint64 `msgpack:"seq"`
	// Mark is the sequence of the last message of the Session folded from
	// the stream (0: none known): the stream must still hold it, as that
	// Session's, or the Session was deleted (and perhaps imported again)
	// since.
	Mark  uint64      `msgpack:"mark,omitempty"`
	State *fold.State `msgpack:"state"`
}

// Encode returns the stored form of s.
func Encode(s *Snapshot) ([]byte, error) {
	body, err := omni.Pack(s)
	if err != nil {
		return nil, fmt.Errorf("snapshot: encode %s: %w", s.SessionID, err)
	}
	return omni.Pack(&Envelope{V: Version, Body: s2.EncodeBetter(nil, body)})
}

// Errors of Decode.
var (
	ErrVersion = errors.New("snapshot: another format version")
	ErrCorrupt = errors.New("snapshot: corrupt")
)

// Decode reads a stored snapshot: ErrVersion for another format version,
// ErrCorrupt for bytes that are not one.
func Decode(b []byte) (*Snapshot, error) {
	var env Envelope
	if err := omni.Unpack(b, &env); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	body := env.Body
	switch env.V {
	case Version:
		n, err := s2.DecodedLen(body)
		if err != nil || n > maxDecoded {
			return nil, fmt.Errorf("%w: compressed body: %d bytes, %v", ErrCorrupt, n, err)
		}
		if body, err = s2.Decode(make([]byte, n), body); err != nil {
			return nil, fmt.Errorf("%w: compressed body: %w", ErrCorrupt, err)
		}
	case 1:
	default:
		return nil, fmt.Errorf("%w: %d, this engine reads %d and 1", ErrVersion, env.V, Version)
	}
	s := &Snapshot{}
	if err := omni.Unpack(body, s); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if s.State == nil {
		return nil, fmt.Errorf("%w: no state", ErrCorrupt)
	}
	return s, nil
}

// Store loads Sessions' contexts through snapshots. Safe for concurrent use
// (one Task per Session at a time, as the Session lease makes it).
type Store struct {
	js   jetstream.JetStream
	kv   jetstream.KeyValue // nil: the bucket is missing, memory only
	home string
	log  zerolog.Logger
	// Every is how many records are folded after the stored snapshot
	// before a new one is stored, and at least Grow times the context's
	// entries; Keep how many Sessions' contexts stay in memory.
	Every, Grow, Keep int

	// refolds counts the Loads that found no usable snapshot.
	refolds atomic.Int64

	mu    sync.Mutex
	mem   map[string]*list.Element // of *held; mu
	order *list.List               // most recently used first; mu
}

// held is a context in memory: mu guards the map and list, a held value is
// only read or changed by the one Load that took it out.
type held struct {
	sid     string
	created int64
	epoch   int64
	seq     uint64
	mark    uint64
	fc      *fold.Context
	// stored is fc.Records when the KV snapshot was last written (or read).
	stored int
}

// Open returns a Store over the snapshot bucket; when the bucket does not
// exist (a layout set up before snapshots), the Store keeps snapshots in
// memory only and says so in the log. home is FLOE_HOME (the Traces).
func Open(ctx context.Context, js jetstream.JetStream, home string, log zerolog.Logger) *Store {
	s := &Store{js: js, home: home, log: log, Every: DefaultEvery, Grow: DefaultGrow, Keep: DefaultKeep,
		mem: map[string]*list.Element{}, order: list.New()}
	kv, err := js.KeyValue(ctx, omni.SnapshotsBucket)
	if err != nil {
		log.Warn().Err(err).Str("bucket", omni.SnapshotsBucket).Msg("no context snapshot bucket: snapshots stay in this engine (floe setup creates it)")
		return s
	}
	s.kv = kv
	return s
}

// Load returns the Session's folded context and the last stream sequence it
// covers, with the count of undecodable records skipped: what trace.Replay
// returns, except that the sequence may be later than Replay's (a snapshot
// covers the stream as far as it was when taken) with no Trace-class
// message of the Session in between. The context is the caller's to fold on. created is the Session
// record's CreatedUnixMs, purged its PurgedThrough: the Session's messages
// up to it left the stream on purpose (purge.Purger, FLOE_IDLE_KEEP), so a
// snapshot that covers them still applies although the stream no longer
// holds its mark.
func (s *Store) Load(ctx context.Context, sid string, created int64, purged uint64) (*fold.Context, uint64, int, error) {
	return s.load(ctx, sid, created, purged, false)
}

// Cover brings the Session's snapshot up to the stream's end and stores it
// in the bucket whatever Every says, and returns the sequence it covers
// (at least the stream's last sequence when it began): the idle purge
// (purge.Purger) calls it before it removes the Session's messages, so
// that the next Task starts from the snapshot instead of folding the
// whole Trace. It must not run while a Task of the Session loads (the
// purge runs only on an idle Session).
func (s *Store) Cover(ctx context.Context, sid string, created int64, purged uint64) (uint64, error) {
	if s.kv == nil {
		return 0, errors.New("snapshot: no bucket to store the snapshot in")
	}
	_, seq, _, err := s.load(ctx, sid, created, purged, true)
	return seq, err
}

func (s *Store) load(ctx context.Context, sid string, created int64, purged uint64, store bool) (*fold.Context, uint64, int, error) {
	stream, err := s.js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("snapshot: stream info: %w", err)
	}
	info := stream.CachedInfo()
	epoch := info.Created.UnixMilli()
	h, why := s.base(ctx, stream, sid, created, epoch, purged, info.State.FirstSeq, info.State.LastSeq)
	if h == nil {
		log := s.log.Info()
		if why != errMissing {
			log = s.log.Warn()
		}
		log.Str("session_id", sid).Str("reason", why.Error()).Msg("no usable context snapshot: folding the whole history")
		s.refolds.Add(1)
		return s.full(ctx, sid, created, epoch, info.State.LastSeq, store)
	}
	fc, bad, last := h.fc, 0, h.seq
	var m omni.Message
	held, err := bus.Holds(ctx, s.js, sid, omni.TraceClasses, h.seq+1)
	if err == nil && held {
		err = bus.Follow(ctx, s.js, sid, omni.TraceClasses, h.seq+1, true, func(sm bus.StreamMsg) error {
			last = max(last, sm.Seq)
			h.mark = sm.Seq
			if omni.Unmarshal(sm.Data, &m) != nil {
				bad++
				return nil
			}
			fc.Apply(&m)
			return nil
		})
	}
	if err != nil {
		return nil, 0, 0, fmt.Errorf("snapshot: records of %s after seq %d: %w", sid, h.seq, err)
	}
	h.seq = last
	if store {
		// Every Trace-class message of the Session up to the stream's last
		// sequence before the read was folded.
		h.seq, h.stored = max(last, info.State.LastSeq), -1
	}
	// Cloned before h goes back to memory, where the next Load may take it.
	clone := fc.Clone()
	s.keep(ctx, h)
	return clone, last, bad, nil
}

var errMissing = errors.New("none stored")

// base takes the Session's snapshot out of memory, or reads the stored one,
// and checks that it applies; nil and why when none does.
func (s *Store) base(ctx context.Context, stream jetstream.Stream, sid string, created, epoch int64, purged, first, last uint64) (*held, error) {
	check := func(h *held) error {
		// The Session's messages up to purged were removed on purpose, and
		// the snapshot covers them: its mark may be gone, and so may what
		// the stream dropped before its first sequence (other Sessions'
		// purged messages; this Session had none between purged and its
		// next Task).
		covered := purged > 0 && h.seq >= purged && h.mark <= purged
		switch {
		case h.mark > 0 && !covered && !s.holds(ctx, stream, sid, h.mark):
			return fmt.Errorf("the stream no longer holds the Session's message %d (deleted since?)", h.mark)
		case h.created != created:
			return errors.New("of another Session of the same id")
		case h.epoch != epoch:
			return errors.New("of another incarnation of the stream")
		case h.seq > last:
			return fmt.Errorf("past the stream's end (seq %d, last %d)", h.seq, last)
		case h.seq+1 < first && !covered:
			return fmt.Errorf("the stream no longer holds what follows it (seq %d, first %d)", h.seq, first)
		}
		return nil
	}
	s.mu.Lock()
	el := s.mem[sid]
	if el != nil {
		delete(s.mem, sid)
		s.order.Remove(el)
	}
	s.mu.Unlock()
	if el != nil {
		// Only one whose last message the stream still holds: without one,
		// a Session deleted and imported again could look the same.
		if h := el.Value.(*held); h.mark > 0 && check(h) == nil {
			return h, nil
		}
	}
	if s.kv == nil {
		return nil, errMissing
	}
	e, err := s.kv.Get(ctx, sid)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, errMissing
	}
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	snap, err := Decode(e.Value())
	if err != nil {
		return nil, err
	}
	if snap.SessionID != sid {
		return nil, fmt.Errorf("%w: of session %s", ErrCorrupt, snap.SessionID)
	}
	fc, err := fold.Restore(snap.State)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	h := &held{sid: sid, created: snap.Created, epoch: snap.Epoch, seq: snap.Seq, mark: snap.Mark, fc: fc, stored: fc.Records}
	if err := check(h); err != nil {
		return nil, fmt.Errorf("stale: %w", err)
	}
	return h, nil
}

// holds reports whether the stream holds the Session's message at seq (an
// error reads as no: the caller folds the history instead).
func (s *Store) holds(ctx context.Context, stream jetstream.Stream, sid string, seq uint64) bool {
	m, err := stream.GetMsg(ctx, seq)
	if err != nil {
		return false
	}
	of, _, ok := omni.ParseSessionSubject(m.Subject)
	return ok && of == sid
}

// full folds the whole history (trace.Replay) and keeps the result as the
// Session's snapshot. before is the stream's last sequence before the fold
// began: the fold read every Trace-class message of the Session up to it,
// so the snapshot covers it even when the Session's last message is older.
func (s *Store) full(ctx context.Context, sid string, created, epoch int64, before uint64, store bool) (*fold.Context, uint64, int, error) {
	fc := fold.New()
	last, bad, err := trace.Replay(ctx, s.js, s.home, sid, fc.Apply, fc.Reset)
	if err != nil {
		return nil, 0, 0, err
	}
	// Any message of the Session marks it (its Task's task_state, which
	// the Runner publishes before it loads, when there is one).
	mark, err := bus.LastStored(ctx, s.js, omni.SessionSubject(sid, omni.ClassServer))
	if err != nil {
		mark = 0
	}
	clone := fc.Clone()
	s.keep(ctx, &held{sid: sid, created: created, epoch: epoch, seq: max(last, before), mark: mark, fc: fc, stored: -1})
	if store {
		last = max(last, before)
	}
	return clone, last, bad, nil
}

// keep puts h back in memory (dropping the least recently used beyond
// Keep) and stores it in the bucket when Every records were folded since
// the stored one. A snapshot that cannot be stored is logged: the next
// Task on another engine folds more, nothing else changes.
func (s *Store) keep(ctx context.Context, h *held) {
	if s.kv != nil && (h.stored < 0 || h.fc.Records-h.stored >= max(s.Every, s.Grow*h.fc.Len())) {
		if err := s.put(ctx, h); err != nil {
			s.log.Warn().Err(err).Str("session_id", h.sid).Uint64("seq", h.seq).Msg("cannot store the context snapshot")
		} else {
			h.stored = h.fc.Records
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if el := s.mem[h.sid]; el != nil {
		s.order.Remove(el)
	}
	s.mem[h.sid] = s.order.PushFront(h)
	for s.order.Len() > max(s.Keep, 0) {
		old := s.order.Remove(s.order.Back()).(*held)
		delete(s.mem, old.sid)
	}
}

func (s *Store) put(ctx context.Context, h *held) error {
	st, err := h.fc.State()
	if err != nil {
		return err
	}
	b, err := Encode(&Snapshot{SessionID: h.sid, Created: h.created, Epoch: h.epoch, Seq: h.seq, Mark: h.mark, State: st})
	if err != nil {
		return err
	}
	if _, err := s.kv.Put(ctx, h.sid, b); err != nil {
		return fmt.Errorf("snapshot: store %s (%d bytes): %w", h.sid, len(b), err)
	}
	return nil
}

// Refolds is how many Loads found no usable snapshot and folded the whole
// history.
func (s *Store) Refolds() int64 { return s.refolds.Load() }

// Forget drops the Session's snapshot from memory and the bucket (a
// deleted Session). Dropping one is always safe: the next Task folds the
// history.
func (s *Store) Forget(ctx context.Context, sid string) error {
	s.mu.Lock()
	if el := s.mem[sid]; el != nil {
		delete(s.mem, sid)
		s.order.Remove(el)
	}
	s.mu.Unlock()
	return Invalidate(ctx, s.kv, sid)
}

// Invalidate deletes the Session's stored snapshot (nil kv: nothing to
// do).
func Invalidate(ctx context.Context, kv jetstream.KeyValue, sid string) error {
	if kv == nil {
		return nil
	}
	if err := kv.Delete(ctx, sid); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("snapshot: invalidate %s: %w", sid, err)
	}
	return nil
}

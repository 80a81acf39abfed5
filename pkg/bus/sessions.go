package bus

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/omni"
)

// Sessions stores Session records in the SessionsBucket KV bucket.
type Sessions struct {
	kv jetstream.KeyValue
}

// Errors of the Session record store.
var (
	ErrSessionNotFound = errors.New("bus: session not found")
	ErrSessionExists   = errors.New("bus: session already exists")
	// ErrConflict means the record changed since it was read (a lost
	// compare-and-set), e.g. another Task started first.
	ErrConflict = errors.New("bus: session record changed concurrently")
)

// Create stores a new record; ErrSessionExists if the id is taken.
func (s *Sessions) Create(ctx context.Context, r *omni.SessionRecord) error {
	b, err := omni.Pack(r)
	if err != nil {
		return err
	}
	if _, err := s.kv.Create(ctx, r.ID, b); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return ErrSessionExists
		}
		return fmt.Errorf("bus: create session %s: %w", r.ID, err)
	}
	return nil
}

// Get returns a record and its revision.
func (s *Sessions) Get(ctx context.Context, id string) (*omni.SessionRecord, uint64, error) {
	if !omni.ValidSessionID(id) {
		return nil, 0, ErrSessionNotFound
	}
	e, err := s.kv.Get(ctx, id)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
			return nil, 0, ErrSessionNotFound
		}
		return nil, 0, fmt.Errorf("bus: get session %s: %w", id, err)
	}
	var r omni.SessionRecord
	if err := omni.Unpack(e.Value(), &r); err != nil {
		return nil, e.Revision(), &UndecodableError{ID: id, Revision: e.Revision(), Principal: principalOf(e.Value()), Err: err}
	}
	return &r, e.Revision(), nil
}

// UndecodableError is returned for a stored record that does not decode
// (written by a broken or newer writer, or damaged). Such a record is
// skipped by List and can only be deleted.
type UndecodableError struct {
	ID       string
	Revision uint64
	// Principal is the owner read from the record's principal field when
	// that much decodes, "" when it does not.
	Principal string
	Err       error
}

func (e *UndecodableError) Error() string {
	return "bus: session " + e.ID + " record does not decode: " + e.Err.Error()
}

func (e *UndecodableError) Unwrap() error { return e.Err }

// principalOf reads only the principal field of a record that does not
// decode whole ("" when even that fails).
func principalOf(b []byte) string {
	var p struct {
		Principal string `msgpack:"principal"`
	}
	if omni.Unpack(b, &p) != nil {
		return ""
	}
	return p.Principal
}

// Update applies fn to the current record and stores it with a
// compare-and-set, retrying when another writer got in between. fn returns
// an error to abort (returned as is). It returns the stored record.
func (s *Sessions) Update(ctx context.Context, id string, fn func(*omni.SessionRecord) error) (*omni.SessionRecord, error) {
	for {
		r, rev, err := s.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if err := fn(r); err != nil {
			return nil, err
		}
		b, err := omni.Pack(r)
		if err != nil {
			return nil, err
		}
		if _, err := s.kv.Update(ctx, id, b, rev); err != nil {
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue // lost the race: re-read and re-apply
			}
			return nil, fmt.Errorf("bus: update session %s: %w", id, err)
		}
		return r, nil
	}
}

// ErrBusy is returned by Begin when the Session already runs a Task or
// compaction; State says which.
type ErrBusy struct{ State string }

func (e *ErrBusy) Error() string { return "bus: session is " + e.State }

// Begin moves a Session from idle to state (running or compacting) for
// taskID. Exactly one of any number of concurrent callers wins; the others
// get *ErrBusy.
func (s *Sessions) Begin(ctx context.Context, id, state, taskID string) (*omni.SessionRecord, error) {
	return s.Update(ctx, id, func(r *omni.SessionRecord) error {
		if r.Deleted {
			return ErrSessionNotFound
		}
		if r.State != "" && r.State != omni.StateIdle {
			return &ErrBusy{State: r.State}
		}
		r.State, r.TaskID = state, taskID
		return nil
	})
}

// End moves a Session back to idle if taskID still holds it.
func (s *Sessions) End(ctx context.Context, id, taskID, status string) error {
	_, err := s.Update(ctx, id, func(r *omni.SessionRecord) error {
		if r.TaskID != taskID {
			return nil
		}
		r.State, r.TaskID, r.LastStatus = omni.StateIdle, "", status
		return nil
	})
	return err
}

// List returns every record that decodes, and the ones that do not
// (skipped, so one damaged record never hides the others).
func (s *Sessions) List(ctx context.Context) ([]*omni.SessionRecord, []*UndecodableError, error) {
	keys, err := s.kv.ListKeys(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("bus: list sessions: %w", err)
	}
	var out []*omni.SessionRecord
	var bad []*UndecodableError
	for k := range keys.Keys() {
		r, _, err := s.Get(ctx, k)
		var ue *UndecodableError
		switch {
		case errors.Is(err, ErrSessionNotFound):
			continue
		case errors.As(err, &ue):
			bad = append(bad, ue)
			continue
		case err != nil:
			return nil, nil, err
		}
		out = append(out, r)
	}
	return out, bad, nil
}

// Delete removes a record (whether it decodes or not).
func (s *Sessions) Delete(ctx context.Context, id string) error {
	if err := s.kv.Purge(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("bus: delete session %s: %w", id, err)
	}
	return nil
}

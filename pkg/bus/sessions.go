package bus

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/omni"
)

// Sessions stores Session records in the SessionsBucket KV bucket.
//
// A record's command policy (1.0 KB of a 1.7 KB record with the factory
// rules) is stored once per bucket under policyKeyPrefix and the digest
// of its msgpack, and the record holds only the digest
// (CommandPolicyRef): a record is rewritten three times a Task, and the
// bucket's block being written keeps every version until it is sealed
// (docs/operations.md "Retention and disk"). The store writes the policy
// before the first record that names it and never removes it (it is the
// same for every Session created under one deployment policy), and fills
// CommandPolicy back in when it reads a record: its callers see the
// record as it was.
type Sessions struct {
	kv jetstream.KeyValue
	nc *nats.Conn // for leader reads (GetLatest); nil: GetLatest is Get

	mu       sync.Mutex
	policies map[string]storedPolicy // digest → stored policy; mu
}

// policyKeyPrefix begins the keys of the Session record bucket that hold
// a command policy ("policy.<digest>"): no Session id has a '.'.
const policyKeyPrefix = "policy."

// maxPolicies bounds the policies a Sessions remembers (a deployment has
// one policy at a time).
const maxPolicies = 64

// encode is the stored form of r: its command policy stored apart (when
// it has one) and named by its digest. at is the revision the write
// replaces (0: a new record), a lower bound of the bucket's last sequence.
func (s *Sessions) encode(ctx context.Context, r *omni.SessionRecord, at uint64) ([]byte, error) {
	cp := *r
	cp.CommandPolicyRef = ""
	if r.CommandPolicy != nil {
		ref, err := s.storePolicy(ctx, r.CommandPolicy, at)
		if err != nil {
			return nil, err
		}
		cp.CommandPolicy, cp.CommandPolicyRef = nil, ref
	}
	return omni.Pack(&cp)
}

// policyLag is how many bucket writes a stored policy may lag behind a
// record write before the store writes it again (the same bytes). The
// file store removes a sealed block once it holds no live message, and a
// policy written once would keep its block, every old record version in
// it included, for ever: written again, it follows the records, and a
// home whose records are all rewritten since (the idle purge rewrites an
// idle Session's) keeps only its block being written. One extra write of
// 1 KB per policyLag record writes (about 0.9 KB each; a block of 4 MiB
// holds about 4,600).
const policyLag = 1000

// storePolicy stores p under its digest unless it is there already (and
// no more than policyLag writes behind at, the revision the caller's
// write replaces), and returns the digest.
func (s *Sessions) storePolicy(ctx context.Context, p *omni.CommandPolicy, at uint64) (string, error) {
	b, err := omni.Pack(p)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	ref := hex.EncodeToString(sum[:16])
	key := policyKeyPrefix + ref
	if have, ok := s.policy(ref); ok {
		if have.rev == 0 || at <= have.rev+policyLag {
			return ref, nil
		}
		rev, err := s.kv.Put(ctx, key, have.b)
		if err != nil {
			// It is still stored where it was: only its block stays.
			return ref, nil
		}
		s.remember(ref, have.b, rev)
		return ref, nil
	}
	rev, err := s.kv.Create(ctx, key, b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		rev = 0 // stored by another writer: its revision is learnt on a read
		if e, err := s.kv.Get(ctx, key); err == nil {
			rev = e.Revision()
		}
	} else if err != nil {
		return "", fmt.Errorf("bus: store command policy %s: %w", ref, err)
	}
	s.remember(ref, b, rev)
	return ref, nil
}

// storedPolicy is a policy's msgpack and the revision it was stored at
// (0: unknown).
type storedPolicy struct {
	b   []byte
	rev uint64
}

func (s *Sessions) policy(ref string) (storedPolicy, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.policies[ref]
	return p, ok
}

func (s *Sessions) remember(ref string, b []byte, rev uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.policies == nil || len(s.policies) >= maxPolicies {
		s.policies = map[string]storedPolicy{}
	}
	s.policies[ref] = storedPolicy{b: b, rev: max(rev, s.policies[ref].rev)}
}

// decode reads a stored record, its command policy filled in: an
// *UndecodableError for bytes that are not a record or a policy that is
// not stored (or not the one named).
func (s *Sessions) decode(ctx context.Context, id string, rev uint64, b []byte) (*omni.SessionRecord, error) {
	var r omni.SessionRecord
	if err := omni.Unpack(b, &r); err != nil {
		return nil, &UndecodableError{ID: id, Revision: rev, Principal: principalOf(b), Err: err}
	}
	if r.CommandPolicyRef == "" {
		return &r, nil
	}
	ref := r.CommandPolicyRef
	have, ok := s.policy(ref)
	pb := have.b
	if !ok {
		var prev uint64
		e, err := s.kv.Get(ctx, policyKeyPrefix+ref)
		if err == nil {
			pb, prev = e.Value(), e.Revision()
		} else if s.nc != nil {
			// A direct get may be answered by a replica that lags (it has
			// no policy written a moment ago) or by none: only the
			// leader's "not found" means the policy is missing.
			prev, pb, err = s.leaderGet(ctx, policyKeyPrefix+ref)
			if errors.Is(err, ErrSessionNotFound) {
				err = jetstream.ErrKeyNotFound
			}
		}
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			return nil, &UndecodableError{ID: id, Revision: rev, Principal: r.Principal, Err: fmt.Errorf("its command policy %s is not stored", ref)}
		case err != nil:
			return nil, fmt.Errorf("bus: get session %s: its command policy %s: %w", id, ref, err)
		}
		sum := sha256.Sum256(pb)
		if hex.EncodeToString(sum[:16]) != ref {
			return nil, &UndecodableError{ID: id, Revision: rev, Principal: r.Principal, Err: fmt.Errorf("its command policy %s is stored damaged", ref)}
		}
		s.remember(ref, pb, prev)
	}
	p := &omni.CommandPolicy{}
	if err := omni.Unpack(pb, p); err != nil {
		return nil, &UndecodableError{ID: id, Revision: rev, Principal: r.Principal, Err: fmt.Errorf("its command policy %s: %w", ref, err)}
	}
	r.CommandPolicy, r.CommandPolicyRef = p, ""
	return &r, nil
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
	b, err := s.encode(ctx, r, 0)
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
	r, err := s.decode(ctx, id, e.Revision(), e.Value())
	return r, e.Revision(), err
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

// GetLatest is Get answered by the bucket's stream leader, which holds
// every acknowledged write: Get is a direct get that any replica may
// answer, and in a cluster a lagging one can miss a write acknowledged a
// moment ago (an engine then saw another Task in the record of the Task it
// was handed, and dropped it). Use it where a decision rests on the read.
func (s *Sessions) GetLatest(ctx context.Context, id string) (*omni.SessionRecord, uint64, error) {
	if s.nc == nil {
		return s.Get(ctx, id)
	}
	if !omni.ValidSessionID(id) {
		return nil, 0, ErrSessionNotFound
	}
	seq, data, err := s.leaderGet(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	r, err := s.decode(ctx, id, seq, data)
	return r, seq, err
}

// leaderGet reads the last value of the bucket's key from the stream
// leader: its sequence and bytes, or ErrSessionNotFound when it has none
// (or a delete or purge marker).
func (s *Sessions) leaderGet(ctx context.Context, key string) (uint64, []byte, error) {
	req, _ := json.Marshal(map[string]string{"last_by_subj": "$KV." + omni.SessionsBucket + "." + key})
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	m, err := s.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.KV_"+omni.SessionsBucket, req)
	if err != nil {
		return 0, nil, fmt.Errorf("bus: get %s from the leader: %w", key, err)
	}
	var resp struct {
		Error *struct {
			Code    int    `json:"code"`
			ErrCode int    `json:"err_code"`
			Desc    string `json:"description"`
		} `json:"error"`
		Message *struct {
			Seq  uint64 `json:"seq"`
			Hdrs []byte `json:"hdrs"`
			Data []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return 0, nil, fmt.Errorf("bus: get %s from the leader: %w", key, err)
	}
	if resp.Error != nil {
		if resp.Error.Code == 404 {
			return 0, nil, ErrSessionNotFound
		}
		return 0, nil, fmt.Errorf("bus: get %s from the leader: %s (%d)", key, resp.Error.Desc, resp.Error.ErrCode)
	}
	if resp.Message == nil {
		return 0, nil, fmt.Errorf("bus: get %s from the leader: empty answer", key)
	}
	if bytes.Contains(resp.Message.Hdrs, []byte("KV-Operation")) {
		return 0, nil, ErrSessionNotFound // a delete or purge marker
	}
	return resp.Message.Seq, resp.Message.Data, nil
}

// Update applies fn to the current record and stores it with a
// compare-and-set, retrying when another writer got in between. fn returns
// an error to abort (returned as is). It returns the stored record. fn sees
// the leader's record (GetLatest), so its decision never rests on a stale
// replica.
func (s *Sessions) Update(ctx context.Context, id string, fn func(*omni.SessionRecord) error) (*omni.SessionRecord, error) {
	for {
		r, rev, err := s.GetLatest(ctx, id)
		if err != nil {
			return nil, err
		}
		if err := fn(r); err != nil {
			return nil, err
		}
		b, err := s.encode(ctx, r, rev)
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

// SetAt stores r over the record's revision rev (a compare-and-set, no
// retry): ErrConflict when another write got in since rev was read.
func (s *Sessions) SetAt(ctx context.Context, r *omni.SessionRecord, rev uint64) error {
	b, err := s.encode(ctx, r, rev)
	if err != nil {
		return err
	}
	if _, err := s.kv.Update(ctx, r.ID, b, rev); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return ErrConflict
		}
		return fmt.Errorf("bus: update session %s: %w", r.ID, err)
	}
	return nil
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

// End moves a Session back to idle if taskID still holds it. The caller
// publishes the Task's end itself: Released is cleared, so no redelivery
// of the Task publishes another.
func (s *Sessions) End(ctx context.Context, id, taskID, status string) error {
	_, err := s.Update(ctx, id, func(r *omni.SessionRecord) error {
		if r.TaskID != taskID {
			return nil
		}
		r.State, r.TaskID, r.LastStatus, r.Released, r.ReleasedUnixMs = omni.StateIdle, "", status, "", 0
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
	if !omni.ValidSessionID(id) {
		return nil // no record has that key (a command policy's has a '.')
	}
	if err := s.kv.Purge(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("bus: delete session %s: %w", id, err)
	}
	return nil
}

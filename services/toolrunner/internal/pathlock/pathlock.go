// Package pathlock serializes the file tools' writes to one path across
// every toolrunner process (protocol.md §7): write_file and edit_file hold a lock
// on the resolved path for their read-modify-write, so parallel edits of
// one file never lose each other's changes.
//
// A lock is a key of the floe_locks JetStream KV bucket, created only if
// absent (kv.Create) with a lease: a per-key TTL, so a lock whose runner
// died frees itself. The key is the SHA-256 of the path, so two Sessions
// sharing a Workspace (a subagent and its parent) serialize too.
package pathlock

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DefaultLease is how long a lock lives if its holder never releases it
// (killed): far beyond a file tool's run (files are capped at 10 MB).
const DefaultLease = 30 * time.Second

// retry bounds the wait between attempts at a held lock.
const (
	retryMin = 5 * time.Millisecond
	retryMax = 100 * time.Millisecond
)

// Locker takes path locks in a KV bucket.
type Locker struct {
	kv    jetstream.KeyValue
	owner []byte
	lease time.Duration
}

// New returns a Locker on kv (the floe_locks bucket); owner names the
// holder in the key's value (the runner id), for operators.
func New(kv jetstream.KeyValue, owner string, lease time.Duration) *Locker {
	if lease < time.Second {
		lease = DefaultLease
	}
	return &Locker{kv: kv, owner: []byte(owner), lease: lease}
}

// Key returns the bucket key of path.
func Key(path string) string {
	h := sha256.Sum256([]byte(path))
	return "p." + hex.EncodeToString(h[:16])
}

// Lock waits until it holds path's lock or ctx ends, and returns the
// function that releases it.
func (l *Locker) Lock(ctx context.Context, path string) (func(), error) {
	key := Key(path)
	wait := retryMin
	for {
		rev, err := l.kv.Create(ctx, key, l.owner, jetstream.KeyTTL(l.lease))
		if err == nil {
			return func() {
				// Released even if the call's context has ended.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = l.kv.Delete(ctx, key, jetstream.LastRevision(rev))
			}, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("lock %s: %w", path, context.Cause(ctx))
		case <-t.C:
		}
		wait = min(2*wait, retryMax)
	}
}

// Local serializes by path within one process: the file tools' lock when
// no bucket is given.
type Local struct {
	mu    sync.Mutex
	paths map[string]*localEntry
}

type localEntry struct {
	ch   chan struct{} // a one-slot semaphore
	refs int           // guarded by Local.mu
}

// Lock waits until it holds path's lock or ctx ends.
func (l *Local) Lock(ctx context.Context, path string) (func(), error) {
	l.mu.Lock()
	if l.paths == nil {
		l.paths = map[string]*localEntry{}
	}
	e := l.paths[path]
	if e == nil {
		e = &localEntry{ch: make(chan struct{}, 1)}
		l.paths[path] = e
	}
	e.refs++
	l.mu.Unlock()
	done := func() {
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.paths, path)
		}
		l.mu.Unlock()
	}
	select {
	case e.ch <- struct{}{}:
		return func() { <-e.ch; done() }, nil
	case <-ctx.Done():
		done()
		return nil, fmt.Errorf("lock %s: %w", path, context.Cause(ctx))
	}
}

// Package wirecache keeps, for each Session, the encoded beginning of its
// last model request, so that the next request encodes only what follows
// it (docs/history-window.md).
//
// A Session's context is append-only between compactions and its messages
// never change once folded (fold.Context.Messages shares them), so a
// request's first n messages, when they are the same pointers as the last
// request's first n (or equal messages), encode to the same bytes: a
// provider copies those bytes instead of converting and marshalling every
// message of the context again. Where the cut falls is the provider's to choose (a point
// where its wire messages are complete and nothing after it merges into
// them) and so is the Tag that tells what may follow the cut.
package wirecache

import (
	"container/list"
	"reflect"
	"sync"

	"floe.dev/pkg/omni"
)

// Defaults of a Cache.
const (
	DefaultSessions = 64
	DefaultBytes    = 64 << 20
)

// Prefix is the encoded beginning of a request. It is never changed once
// stored: readers share it.
type Prefix struct {
	// Msgs are the request's first messages that Wire encodes.
	Msgs []*omni.Message
	// Wire is their wire messages: JSON values separated by commas,
	// without brackets ("" when they have none).
	Wire []byte
	// Tag is the provider's state at the cut (anthropic: the role of the
	// last wire message).
	Tag string
}

// Cache holds the Prefix of the Sessions that sent a request last, at
// most Sessions of them and Bytes of wire bytes in all (the least
// recently used go first). Safe for concurrent use; the zero value is not
// usable (New).
type Cache struct {
	sessions, bytes int

	mu    sync.Mutex
	m     map[string]*list.Element // of *entry; mu
	order *list.List               // most recently used first; mu
	held  int                      // wire bytes in m; mu
}

type entry struct {
	sid string
	p   *Prefix
}

// New returns a Cache of at most sessions Sessions and bytes wire bytes
// (defaults for values ≤ 0).
func New(sessions, bytes int) *Cache {
	if sessions <= 0 {
		sessions = DefaultSessions
	}
	if bytes <= 0 {
		bytes = DefaultBytes
	}
	return &Cache{sessions: sessions, bytes: bytes, m: map[string]*list.Element{}, order: list.New()}
}

// Lookup returns the Session's Prefix when its messages begin msgs (in
// the same order, each the same pointer or an equal message: a carry-over
// text the engine makes anew for each request), else nil. A pointer
// compares in O(1) whatever the message's size; only a message at another
// address is compared field by field.
func (c *Cache) Lookup(sid string, msgs []*omni.Message) *Prefix {
	if c == nil || sid == "" {
		return nil
	}
	c.mu.Lock()
	var p *Prefix
	if el := c.m[sid]; el != nil {
		p = el.Value.(*entry).p
		c.order.MoveToFront(el)
	}
	c.mu.Unlock()
	if p == nil || len(p.Msgs) > len(msgs) {
		return nil
	}
	for i, m := range p.Msgs {
		if msgs[i] != m && !reflect.DeepEqual(msgs[i], m) {
			return nil
		}
	}
	return p
}

// Store makes p the Session's Prefix (nil forgets it). A Prefix larger
// than the whole Cache is not kept.
func (c *Cache) Store(sid string, p *Prefix) {
	if c == nil || sid == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el := c.m[sid]; el != nil {
		c.held -= len(el.Value.(*entry).p.Wire)
		c.order.Remove(el)
		delete(c.m, sid)
	}
	if p == nil || len(p.Wire) > c.bytes {
		return
	}
	c.m[sid] = c.order.PushFront(&entry{sid: sid, p: p})
	c.held += len(p.Wire)
	for c.order.Len() > c.sessions || c.held > c.bytes {
		old := c.order.Remove(c.order.Back()).(*entry)
		delete(c.m, old.sid)
		c.held -= len(old.p.Wire)
	}
}

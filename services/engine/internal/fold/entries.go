package fold

import (
	"slices"
	"sync"
	"sync/atomic"

	"floe.dev/pkg/omni"
)

// entries is a Context's user messages and committed turns, kept so that
// Clone costs O(1) whatever the Session's length (docs/history-window.md):
//
//   - a spine is an append-only array of entries with an index of their
//     tool calls. One Context owns it and appends to it; its clones read a
//     prefix of it (the first n entries) and never write it;
//   - a clone appends to its own tail, indexed by its own map;
//   - a turn is changed in place only by the Context that made it (its
//     gen): another Context's turn is copied first (copy-on-write), and an
//     element of the spine that clones read is never overwritten: the
//     owner copies the array first (rare: an output or an abort reaching a
//     turn of an earlier Task).
//
// So a Task's clone of the cached context shares its whole prefix, and the
// cache folds the next Task's records on without copying either.
type entries struct {
	sp    *spine
	n     int  // the first n entries of sp are this Context's
	owner bool // appends go to sp (else to tail)
	tail  []entry
	calls map[string]int // a tail turn's call id → its entry index (n + i)
	// others is the same of a tail turn's tool_call messages that are not
	// calls (incomplete ones): rare, nil without one.
	others map[string]int
	gen    uint64 // turns with this gen are this Context's own
	// pending is the indices, ascending, of the turns with a call that
	// has neither an output nor the interrupted mark (turn.running): what
	// Unpaired and an abort read instead of every entry. This Context's
	// own (a clone copies it: it is short, empty between Tasks).
	pending []int
}

// spine is an array of entries shared by the Context that owns it and its
// clones. mu guards entries, calls and frozen: the owner writes under it,
// clones read under it (a clone and its original may live in different
// goroutines: a Task's history and the snapshot cache).
type spine struct {
	mu      sync.RWMutex
	entries []entry
	// calls maps a committed call id to the last entry index with it;
	// others the same of the tool_call messages of committed turns that
	// are not calls (incomplete ones; nil without one).
	calls  map[string]int
	others map[string]int
	// frozen: entries below it are read by clones and never overwritten.
	frozen int
}

var gens atomic.Uint64

func newGen() uint64 { return gens.Add(1) }

func newEntries() entries {
	return entries{sp: &spine{calls: map[string]int{}}, owner: true, gen: newGen()}
}

// length is how many entries the Context has.
func (l *entries) length() int { return l.n + len(l.tail) }

// at returns entry i (the turn is shared: read it only).
func (l *entries) at(i int) entry {
	if i >= l.n {
		return l.tail[i-l.n]
	}
	l.sp.mu.RLock()
	defer l.sp.mu.RUnlock()
	return l.sp.entries[i]
}

// each calls f with every entry in order (the turns are shared: f reads
// them only, and must not call back into l's writers).
func (l *entries) each(f func(i int, e entry)) {
	l.sp.mu.RLock()
	for i, e := range l.sp.entries[:l.n] {
		f(i, e)
	}
	l.sp.mu.RUnlock()
	for i, e := range l.tail {
		f(l.n+i, e)
	}
}

// read calls f with the entries in order, in one or two runs (the turns
// are shared: f reads them only, and must not call back into l).
func (l *entries) read(f func([]entry)) {
	l.sp.mu.RLock()
	f(l.sp.entries[:l.n])
	l.sp.mu.RUnlock()
	f(l.tail)
}

// add appends e. A turn added is indexed by its calls (a later turn's call
// id wins).
func (l *entries) add(e entry) {
	if e.turn != nil && e.turn.gen != l.gen {
		// A turn another Context may hold (an open request begun before a
		// Clone): this Context's copy from now on.
		e.turn = e.turn.dup(l.gen)
	}
	if e.turn != nil && e.turn.running() {
		l.pending = append(l.pending, l.length())
	}
	if !l.owner {
		i := l.length()
		l.tail = append(l.tail, e)
		if e.turn != nil {
			if l.calls == nil {
				l.calls = map[string]int{}
			}
			for _, id := range e.turn.calls {
				l.calls[id] = i
			}
			l.others = e.turn.indexOthers(l.others, i)
		}
		return
	}
	sp := l.sp
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.entries = append(sp.entries, e)
	if e.turn != nil {
		for _, id := range e.turn.calls {
			sp.calls[id] = l.n
		}
		sp.others = e.turn.indexOthers(sp.others, l.n)
	}
	l.n++
}

// indexOthers adds the ids of t's tool_call messages that are not calls to
// m (made when needed) at entry index i, and returns m.
func (t *turn) indexOthers(m map[string]int, i int) map[string]int {
	if t.toolCalls <= len(t.calls) {
		return m // every tool_call message is a call
	}
	for _, msg := range t.assistant {
		if msg.Payload.Type == omni.TypeToolCall && !t.has(msg.Payload.ToolCallID) {
			if m == nil {
				m = map[string]int{}
			}
			m[msg.Payload.ToolCallID] = i
		}
	}
	return m
}

// hasOther reports whether t has a tool_call message with id that is not
// one of its calls.
func (t *turn) hasOther(id string) bool {
	if t.toolCalls <= len(t.calls) {
		return false
	}
	for _, msg := range t.assistant {
		if msg.Payload.Type == omni.TypeToolCall && msg.Payload.ToolCallID == id && !t.has(id) {
			return true
		}
	}
	return false
}

// find returns the index of the last committed turn with call id, or -1.
func (l *entries) find(id string) int { return l.last(id, false) }

// findOther reports whether a committed turn has a tool_call message with
// id that is not one of its calls (an incomplete one).
func (l *entries) findOther(id string) bool { return l.last(id, true) >= 0 }

// last returns the index of the last committed turn with id, or -1: with
// a call id, or (others) with a tool_call message id that is not a call.
// It looks in l's own index, then in the spine's under its lock.
func (l *entries) last(id string, others bool) int {
	own, has := l.calls, (*turn).has
	if others {
		own, has = l.others, (*turn).hasOther
	}
	if i, ok := own[id]; ok {
		return i
	}
	sp := l.sp
	sp.mu.RLock()
	defer sp.mu.RUnlock()
	shared := sp.calls
	if others {
		shared = sp.others
	}
	i, ok := shared[id]
	if !ok {
		return -1
	}
	if i < l.n {
		return i
	}
	// The owner has since committed a turn with the same id (call ids are
	// Session-unique, so only an imported history has such): look in
	// this Context's part.
	for j := l.n - 1; j >= 0; j-- {
		if t := sp.entries[j].turn; t != nil && has(t, id) {
			return j
		}
	}
	return -1
}

// mutable returns entry i's turn, this Context's own to change: a turn
// another Context may hold is copied and the copy put in its place.
func (l *entries) mutable(i int) *turn {
	if i >= l.n {
		e := &l.tail[i-l.n]
		if e.turn.gen != l.gen {
			e.turn = e.turn.dup(l.gen)
		}
		return e.turn
	}
	if !l.owner || i < l.frozenAt() {
		// The element is read by another Context: take a private array.
		l.detach()
	}
	sp := l.sp
	sp.mu.Lock()
	defer sp.mu.Unlock()
	e := &sp.entries[i]
	if e.turn.gen != l.gen {
		e.turn = e.turn.dup(l.gen)
	}
	return e.turn
}

func (l *entries) frozenAt() int {
	l.sp.mu.RLock()
	defer l.sp.mu.RUnlock()
	return l.sp.frozen
}

// detach makes l the owner of a new spine holding its entries (their
// turns still shared: mutable copies them).
func (l *entries) detach() {
	sp := &spine{calls: make(map[string]int, len(l.sp.calls)+len(l.calls))}
	sp.entries = make([]entry, 0, l.length()+1)
	l.each(func(i int, e entry) {
		sp.entries = append(sp.entries, e)
		if e.turn != nil {
			for _, id := range e.turn.calls {
				sp.calls[id] = i
			}
			sp.others = e.turn.indexOthers(sp.others, i)
		}
	})
	*l = entries{sp: sp, n: len(sp.entries), owner: true, gen: l.gen, pending: l.pending}
}

// clone returns entries that share l's: the returned and l fold on
// independently. O(1) when l owns its spine (the snapshot cache does).
func (l *entries) clone() entries {
	if !l.owner {
		// A clone's clone: give it a spine of its own first (never on the
		// engine's path, where only the cache is cloned).
		l.detach()
	}
	sp := l.sp
	sp.mu.Lock()
	sp.frozen = l.n
	sp.mu.Unlock()
	// Both get a new gen: the turns made so far are shared now.
	l.gen = newGen()
	return entries{sp: sp, n: l.n, gen: newGen(), pending: slices.Clone(l.pending)}
}

// settled drops entry i from pending if its turn no longer runs (an
// output or the interrupted mark reached its last open call).
func (l *entries) settled(i int) {
	k, ok := slices.BinarySearch(l.pending, i)
	if !ok || l.at(i).turn.running() {
		return
	}
	l.pending = slices.Delete(l.pending, k, k+1)
}

// has reports whether t has a call id.
func (t *turn) has(id string) bool {
	for _, c := range t.calls {
		if c == id {
			return true
		}
	}
	return false
}

// dup returns a copy of t that gen's Context may change.
func (t *turn) dup(gen uint64) *turn {
	d := &turn{
		gen:       gen,
		assistant: append([]*omni.Message(nil), t.assistant...),
		toolCalls: t.toolCalls,
		calls:     append([]string(nil), t.calls...),
		outputs:   append([]*omni.Message(nil), t.outputs...),
	}
	if t.interrupted != nil {
		d.interrupted = make(map[string]*omni.Message, len(t.interrupted))
		for id, v := range t.interrupted {
			d.interrupted[id] = v
		}
	}
	return d
}

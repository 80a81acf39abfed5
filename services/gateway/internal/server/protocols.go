package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// The standard protocols (protocol.md §9: AG-UI, A2A) are views of a Session's
// stream. What they need beyond it, the binding of a protocol's ids to
// Sessions and Tasks, lives in the floe_protocols KV bucket (never in a
// gateway's memory), so every replica serves them and a restarted gateway
// picks up where another left off.

// bindings is the floe_protocols bucket.
type bindings struct {
	kv jetstream.KeyValue
}

// errNoBinding: no record under the key.
var errNoBinding = errors.New("no such binding")

// protoKey is a bucket key for a protocol's free-form id: a hash, so any
// id the client makes up is a valid key.
func protoKey(prefix string, parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return prefix + "." + hex.EncodeToString(h.Sum(nil)[:20])
}

func (b *bindings) get(ctx context.Context, key string, v any) error {
	e, err := b.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return errNoBinding
	}
	if err != nil {
		return err
	}
	return json.Unmarshal(e.Value(), v)
}

func (b *bindings) put(ctx context.Context, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = b.kv.Put(ctx, key, data)
	return err
}

// create stores v under key unless the key exists: false then.
func (b *bindings) create(ctx context.Context, key string, v any) (bool, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return false, err
	}
	_, err = b.kv.Create(ctx, key, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil
	}
	return err == nil, err
}

// openBindings opens the bucket (bus.Setup creates it).
func openBindings(ctx context.Context, js jetstream.JetStream) (*bindings, error) {
	kv, err := js.KeyValue(ctx, omni.ProtocolsBucket)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", omni.ProtocolsBucket, err)
	}
	return &bindings{kv: kv}, nil
}

// protocols returns the bindings, opening the bucket on first use (a
// layout set up before the bucket existed gets it from the next setup).
func (s *Server) protocols(ctx context.Context) (*bindings, *apiError) {
	s.protoMu.Lock()
	defer s.protoMu.Unlock()
	if s.proto != nil {
		return s.proto, nil
	}
	b, err := openBindings(ctx, s.js)
	if err != nil {
		return nil, unavailable("open the protocol bindings (run floe setup)", err)
	}
	s.proto = b
	return b, nil
}

// visibleSession returns the Session sid if the caller may see it; 404
// otherwise, as for the REST routes.
func (s *Server) visibleSession(ctx context.Context, sid string) (*omni.SessionRecord, *apiError) {
	rec, _, err := s.sessions.Get(ctx, sid)
	if errors.Is(err, bus.ErrSessionNotFound) {
		return nil, errNotFound
	}
	if err != nil {
		return nil, unavailable("read session", err)
	}
	if !s.visible(ctx, rec) {
		return nil, errNotFound
	}
	return rec, nil
}

// streamItem is one message of a Session's client stream.
type streamItem struct {
	seq    uint64
	server bool
	data   []byte
}

// errStopRead ends a read early (from fn).
var errStopRead = errors.New("stop reading")

// readSession hands fn the Session's client-stream messages from start on,
// in stream order, each once: first what is stored (replayed from
// JetStream), then live through the gateway's tail (the SSE fan-out's one
// subscription), with the same handover as an SSE client: registered at
// the tail first, the gap replayed up to the tail's position, the queue's
// entries at or below the last replayed sequence dropped. A reader the tail
// cuts off for being slow registers again and replays what it missed.
// It returns when fn returns errStopRead (nil then), an error, or ctx ends.
func (s *Server) readSession(ctx context.Context, sid string, start uint64, fn func(streamItem) error) error {
	if start == 0 {
		start = 1
	}
	last := start - 1
	deliver := func(it streamItem) error {
		if it.seq <= last {
			return nil
		}
		last = it.seq
		return fn(it)
	}
	for {
		var once sync.Once
		cut := make(chan struct{})
		c := &sseClient{sid: sid, q: newQueue(s.opts.ClientBuffer), kick: func(bool) { once.Do(func() { close(cut) }) }}
		live, err := s.tail.subscribe(ctx, c)
		if err != nil {
			return err
		}
		err = func() error {
			defer s.tail.unsubscribe(c)
			if last < live {
				// A replay is a short-lived consumer: it takes one of the
				// slots SSE replays share (maxReplays), so a reconnect storm
				// waits its turn.
				select {
				case s.replays <- struct{}{}:
				case <-ctx.Done():
					return ctx.Err()
				}
				err := s.scan(ctx, sid, omni.ClientClasses, last+1, nil, func(m bus.StreamMsg) error {
					return deliver(streamItem{seq: m.Seq, server: m.Class == omni.ClassServer, data: m.Data})
				})
				<-s.replays
				if err != nil {
					return err
				}
				last = max(last, live)
			}
			var batch []sseItem
			for {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-cut:
					return nil // register again and catch up
				case <-c.q.notify:
					var closed bool
					batch, closed = c.q.drain(batch)
					for i := range batch {
						it := batch[i]
						batch[i] = sseItem{}
						if err := deliver(streamItem{seq: it.seq, server: it.server, data: it.data}); err != nil {
							return err
						}
					}
					if closed {
						return nil
					}
				}
			}
		}()
		if errors.Is(err, errStopRead) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// lastSeq is the stream's last sequence: a Task submitted after reading it
// starts above it.
func (s *Server) lastSeq(ctx context.Context) (uint64, int64, error) {
	info, err := s.stream.Info(ctx)
	if err != nil {
		return 0, 0, err
	}
	return info.State.LastSeq, epochOf(info), nil
}

// retained reports whether the stream still holds everything from
// sequence from on (a Task's messages) of a Session whose record says its
// messages up to purged left the stream (PurgedThrough), and the stream's
// epoch.
func (s *Server) retained(ctx context.Context, from, purged uint64) (bool, int64, error) {
	info, err := s.stream.Info(ctx)
	if err != nil {
		return false, 0, err
	}
	return info.State.FirstSeq <= max(from, 1) && purged < max(from, 1), epochOf(info), nil
}

// sseStart writes the head of an SSE answer and returns a function that
// writes and flushes a batch within the write timeout.
func (s *Server) sseStart(w http.ResponseWriter) func([]byte) error {
	h := w.Header()
	for k, v := range sseHeaders {
		h.Set(k, v)
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	sink := &httpSink{w: w, rc: rc, timeout: s.opts.WriteTimeout}
	return sink.write
}

// longLived registers a streaming handler with the server (Close ends and
// waits for it) and returns its context, ended by the client leaving or
// the server closing, and the function to call when it returns; nil when
// the server is closing.
func (s *Server) longLived(r *http.Request) (context.Context, func()) {
	if !s.track() {
		return nil, nil
	}
	ctx, cancel := context.WithCancel(s.ctx)
	stop := context.AfterFunc(r.Context(), cancel)
	return ctx, func() {
		stop()
		cancel()
		s.streams.Done()
	}
}

// heartbeatEvery is the SSE heartbeat of the protocol streams.
func (s *Server) heartbeatEvery() time.Duration { return s.opts.Heartbeat }

// Package bustest starts a real embedded nats-server per test: random port,
// JetStream on, store in t.TempDir(), shut down in t.Cleanup. Nothing is
// shared, so tests using it can run in parallel.
package bustest

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/embed"
	"floe.dev/pkg/omni"
)

// Env is one test's broker and the layout on it.
type Env struct {
	Server   *embed.Server
	Conn     *nats.Conn
	JS       jetstream.JetStream
	Sessions *bus.Sessions
	Config   bus.Config
}

// Start runs a server listening on a random 127.0.0.1 port with Floe's
// layout set up (file storage). cfg tunes retention.
func Start(t testing.TB, cfg bus.Config) *Env {
	t.Helper()
	srv, err := embed.Start(embed.Options{StoreDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("start nats-server: %v", err)
	}
	t.Cleanup(srv.Shutdown)
	nc := Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sessions, err := bus.Setup(ctx, js, cfg)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	return &Env{Server: srv, Conn: nc, JS: js, Sessions: sessions, Config: cfg}
}

// Connect opens another in-process connection closed at cleanup.
func Connect(t testing.TB, srv *embed.Server) *nats.Conn {
	t.Helper()
	nc, err := srv.Connect()
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Eventually polls cond every 10ms until it holds or d passes.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Buffer collects output written from other goroutines (a service's log,
// a process's stdout) for a test to read; safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Contains reports whether what was written so far contains s.
func (l *Buffer) Contains(s string) bool {
	return strings.Contains(l.String(), s)
}

// Held is how many messages of Session sid FLOE_SESSIONS holds, from the
// stream's state (a read until caught up would wait for messages purged
// while it reads).
func Held(t testing.TB, js jetstream.JetStream, sid string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(omni.SessionWildcard(sid)))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

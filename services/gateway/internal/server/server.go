// Package server implements the gateway's HTTP API (protocol.md §3) and its SSE
// stream (protocol.md §4) over the bus: Session records in the floe_sessions KV
// bucket, Tasks on FLOE_TASKS, control requests to the engine owning a
// Session, and the Session's messages read back from FLOE_SESSIONS and the
// Trace files.
//
// The gateway keeps no state of its own: every answer is computed from the
// bus and the Trace files, so any number of gateway replicas can serve the
// same Sessions and a restarted gateway resumes every SSE client from its
// Last-Event-ID.
package server

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/ops"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/telemetry"
)

// Options are the server's settings; the gateway's Config fills them with
// defaults applied.
type Options struct {
	Tokens map[string]string
	// Addr is the listen address, PublicURL the gateway's URL as clients
	// reach it and AllowedHosts more Host names it answers to (origin.go).
	Addr         string
	PublicURL    string
	AllowedHosts []string
	MaxBody      int64
	// MaxImport caps a Trace file imported by POST /api/traces/import
	// (its request body is capped at the file's base64 size plus room
	// for the other fields).
	MaxImport int64
	// MaxImports is how many imports run at once (more get 429).
	MaxImports      int
	Home            string
	DefaultModel    string
	WorkspaceRoots  []string // resolved by the caller: never nil in use
	ScriptsDir      string
	ReadBodyTimeout time.Duration
	Heartbeat       time.Duration
	ControlTimeout  time.Duration
	QueueWait       time.Duration
	ClientBuffer    int
	WriteTimeout    time.Duration
	// CheckModel, when set, says whether the engines can use a model
	// (its provider's key is configured); nil: any model is taken.
	CheckModel func(ref string) error
	// CommandPolicy is snapshotted into every Session created here.
	CommandPolicy *omni.CommandPolicy
	// DetachSSE serves SSE on the taken-over connection (see stream.go).
	DetachSSE bool
	// Metrics receives the gateway's series and Gatherer is what /metrics
	// serves; nil: a registry of the gateway's own.
	Metrics  prometheus.Registerer
	Gatherer prometheus.Gatherer
	// Telemetry traces each request as a server span (nil: off).
	Telemetry *telemetry.Provider
}

// Server serves the API. It is an http.Handler.
type Server struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	stream   jetstream.Stream
	sessions *bus.Sessions
	opts     Options
	log      zerolog.Logger
	auth     *authenticator
	guard    *hostGuard
	signIns  jetstream.KeyValue // browser sign-ins; nil when unavailable
	fails    *failLimiter
	mux      *http.ServeMux
	metrics  *metrics
	events   eventsHub // /api/events
	tail     *tail
	replays  chan struct{} // a slot per running replay (maxReplays)
	imports  chan struct{} // a slot per running import (Options.MaxImports)
	promh    http.Handler
	micro    micro.Service // nil when the registration failed
	// badRecords holds "id@revision" of undecodable records already logged.
	badRecords sync.Map
	sandboxes  sandboxCache // the runners' tool confinement, for GET

	protoMu sync.Mutex
	proto   *bindings // guarded by protoMu: nil until first opened

	// ctx ends when the server closes: long-lived handlers (SSE) end with it.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	closed  bool           // guarded by mu
	streams sync.WaitGroup // Add only under mu while !closed
}

// New returns a server on an existing bus layout (bus.Setup must have run).
// ctx covers the setup only; Close releases the server.
func New(ctx context.Context, nc *nats.Conn, opts Options, log zerolog.Logger) (*Server, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("gateway: jetstream: %w", err)
	}
	sessions, err := bus.Open(ctx, js)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w (is the bus layout set up?)", err)
	}
	stream, err := js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return nil, fmt.Errorf("gateway: open stream %s: %w (is the bus layout set up?)", omni.SessionsStream, err)
	}
	if opts.Metrics == nil {
		reg := ops.NewRegistry()
		opts.Metrics, opts.Gatherer = reg, reg
	}
	if opts.Gatherer == nil {
		opts.Gatherer = prometheus.DefaultGatherer
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		nc: nc, js: js, stream: stream, sessions: sessions,
		opts: opts, log: log, auth: newAuthenticator(opts.Tokens),
		guard: newHostGuard(opts.Addr, opts.PublicURL, opts.AllowedHosts),
		mux:   http.NewServeMux(), metrics: newMetrics(opts.Metrics),
		promh: promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{}),
		ctx:   sctx, cancel: cancel,
	}
	s.signIns = openSignIns(ctx, js, log)
	s.fails = newFailLimiter()
	s.tail = newTail(s)
	s.replays = make(chan struct{}, maxReplays)
	s.imports = make(chan struct{}, max(opts.MaxImports, 1))
	if srv, err := ops.Register(nc, "gateway", "Floe gateway: HTTP API and SSE", s.status); err != nil {
		log.Warn().Err(err).Msg("not registered as a NATS micro service")
	} else {
		s.micro = srv
	}
	s.routes()
	return s, nil
}

// Close ends every open SSE stream and waits for their handlers to return.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.streams.Wait()
	s.tail.close()
	if s.micro != nil {
		s.micro.Stop()
	}
}

// status is the micro status endpoint's answer.
func (s *Server) status() any {
	s.tail.mu.Lock()
	defer s.tail.mu.Unlock()
	return map[string]any{"sse_clients": s.tail.clients, "sse_sessions": len(s.tail.feeds), "stream_consumers": boolInt(s.tail.run != nil)}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// track registers a long-lived handler; false once Close has begun.
func (s *Server) track() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.streams.Add(1)
	return true
}

// Closing returns a channel closed when Close has been called.
func (s *Server) Closing() <-chan struct{} { return s.ctx.Done() }

func (s *Server) routes() {
	m := s.mux
	m.HandleFunc("GET /healthz", s.handleHealth)
	m.HandleFunc("GET /metrics", s.handleMetrics)
	m.HandleFunc("POST /api/sessions", s.serve(s.handleCreate))
	m.HandleFunc("GET /api/sessions", s.serve(s.handleList))
	m.HandleFunc("GET /api/sessions/{id}", s.serve(s.handleGet))
	m.HandleFunc("PATCH /api/sessions/{id}", s.serve(s.handlePatch))
	m.HandleFunc("DELETE /api/sessions/{id}", s.serve(s.handleDelete))
	m.HandleFunc("POST /api/sessions/{id}/tasks", s.serve(s.handleTask))
	m.HandleFunc("POST /api/sessions/{id}/compact", s.serve(s.handleCompact))
	m.HandleFunc("GET /api/sessions/{id}/stream", s.serve(s.handleStream))
	m.HandleFunc("GET /api/sessions/{id}/messages", s.serve(s.handleMessages))
	m.HandleFunc("POST /api/sessions/{id}/approvals/{toolCallId}", s.serve(s.handleApprove))
	m.HandleFunc("POST /api/sessions/{id}/abort", s.serve(s.handleAbort))
	m.HandleFunc("POST /api/sessions/{id}/steer", s.serve(s.handleSteer))
	m.HandleFunc("POST /api/sessions/{id}/retry-now", s.serve(s.handleRetryNow))
	m.HandleFunc("GET /api/sessions/{id}/traces", s.serve(s.handleTraces))
	m.HandleFunc("GET /api/sessions/{id}/traces/{index}", s.serve(s.handleTrace))
	m.HandleFunc("POST /api/traces/import", s.serve(s.handleImport))
	m.HandleFunc("POST /api/sessions/{id}/fork", s.serve(s.handleFork))
	s.protocolRoutes(m)
	s.webRoutes(m)
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	if s.nc.Status() != nats.CONNECTED {
		writeError(w, errorf(http.StatusServiceUnavailable, omni.CodeUnavailable, "not connected to NATS (%s)", s.nc.Status()))
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	s.promh.ServeHTTP(w, r)
}

// Package embed runs a nats-server with JetStream inside the Floe process:
// what `floe run`, `floe serve` and every test use instead of an external
// NATS. It is the only package besides tests that imports nats-server.
package embed

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// DefaultMaxPayload matches the gateway's default body cap (protocol.md §3).
const DefaultMaxPayload = 8 << 20

// Options configures the embedded server.
type Options struct {
	// StoreDir is the JetStream store directory (required).
	StoreDir string
	// Listen is the client listener, host:port; "" or "off" for none
	// (in-process connections only); port 0 picks a free port.
	Listen string
	// MaxPayload is the largest message in bytes (default DefaultMaxPayload).
	MaxPayload int32
	// ServerName names the server (default "floe").
	ServerName string
	// Logs enables the server's own logging to stderr.
	Logs bool
	// SyncInterval is how often the store syncs its blocks to disk and
	// compacts the sealed ones that are mostly deleted messages (default
	// nats-server's, 2 min). Benchmarks shorten it to see a store settled.
	SyncInterval time.Duration
	// Credentials, when set, makes the server require them from every
	// client, in-process ones included: the users of Users with the
	// least-privilege roles of deploy/nats/auth.conf (see LoadCredentials).
	// Nil serves without authentication, which Start refuses on a
	// listener that is not loopback.
	Credentials Credentials
}

// Server is a running embedded nats-server.
type Server struct {
	ns    *server.Server
	lock  *os.File
	creds Credentials // nil without authentication
}

// ErrOpenListener is returned by Start for a listener on an address other
// than loopback without Credentials: anyone who can reach it could read
// and drive every Session.
var ErrOpenListener = errors.New("embed: refusing to listen for NATS clients on a non-loopback address without authentication")

// ErrStoreInUse means another process runs a server on the same store.
var ErrStoreInUse = errors.New("embed: the JetStream store is in use by another process")

// lockStore takes an exclusive lock on the store directory: two servers on
// one store would corrupt it (nats-server does not lock it itself).
func lockStore(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("embed: store dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "floe.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("embed: lock store: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w (%s): is `floe serve` running on this FLOE_HOME? Use that server with --server (floe chat --server http://127.0.0.1:7364, its default address), or choose another --home", ErrStoreInUse, dir)
	}
	return f, nil
}

// Start starts the server and waits until it accepts connections.
func Start(o Options) (*Server, error) {
	if o.StoreDir == "" {
		return nil, errors.New("embed: StoreDir is required")
	}
	opts := &server.Options{
		ServerName:   o.ServerName,
		JetStream:    true,
		StoreDir:     o.StoreDir,
		MaxPayload:   o.MaxPayload,
		NoSigs:       true,
		NoLog:        !o.Logs,
		SyncInterval: o.SyncInterval,
	}
	if opts.ServerName == "" {
		opts.ServerName = "floe"
	}
	if opts.MaxPayload == 0 {
		opts.MaxPayload = DefaultMaxPayload
	}
	if o.Listen == "" || o.Listen == "off" {
		opts.DontListen = true
	} else {
		host, port, err := net.SplitHostPort(o.Listen)
		if err != nil {
			return nil, fmt.Errorf("embed: listen address %q: %w", o.Listen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("embed: listen port %q: %w", port, err)
		}
		if p == 0 {
			p = server.RANDOM_PORT
		}
		opts.Host, opts.Port = host, p
		if o.Credentials == nil && !loopback(host) {
			return nil, fmt.Errorf("%w: %s (keep authentication on, or listen on 127.0.0.1)", ErrOpenListener, o.Listen)
		}
	}
	if o.Credentials != nil {
		users, err := o.Credentials.users()
		if err != nil {
			return nil, err
		}
		opts.Users = users
	}
	lock, err := lockStore(o.StoreDir)
	if err != nil {
		return nil, err
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("embed: %w", err)
	}
	if o.Logs {
		ns.ConfigureLogger()
	}
	ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		lock.Close()
		return nil, errors.New("embed: nats-server not ready within 30s")
	}
	return &Server{ns: ns, lock: lock, creds: o.Credentials}, nil
}

// loopback reports whether host names only the loopback interface; an
// empty host (every interface) or any other name is not.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ClientURL is the nats:// URL of the client listener ("" when not listening).
func (s *Server) ClientURL() string {
	if s.ns.Addr() == nil {
		return ""
	}
	return s.ns.ClientURL()
}

// Connect opens an in-process connection (no sockets) with the given
// options; on an authenticated server it connects as admin unless opts
// name another user (ConnectAs). It has no reconnect buffer (a publish
// while disconnected fails at once, the rule of bus.ClientOptions), so a
// publish.Publisher may use it.
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	base := []nats.Option{nats.InProcessServer(s.ns), nats.MaxReconnects(-1), nats.ReconnectBufSize(-1)}
	if s.creds != nil {
		base = append(base, nats.UserInfo(UserAdmin, s.creds[UserAdmin]))
	}
	opts = append(base, opts...)
	nc, err := nats.Connect("", opts...)
	if err != nil {
		return nil, fmt.Errorf("embed: connect: %w", err)
	}
	return nc, nil
}

// Shutdown stops the server and waits for it to exit.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	if s.lock != nil {
		s.lock.Close() // releases the flock
		s.lock = nil
	}
}

// DisconnectClient closes a client's connection from the server side (the
// client sees its connection drop and reconnects): for tests of what a
// dropped connection costs. cid is nats.Conn.GetClientID.
func (s *Server) DisconnectClient(cid uint64) error {
	return s.ns.DisconnectClientByID(cid)
}

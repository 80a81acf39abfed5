package bustest

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
)

// Link forwards TCP connections from its listener to to, until cut: then
// every connection it carries is closed and new ones are closed at once,
// as a killed server's peers see it (no shutdown notice, just silence).
// Restore lets connections through again (the server came back); the
// listener keeps its address throughout and closes at cleanup.
type Link struct {
	ln  net.Listener
	to  string
	mu  sync.Mutex
	cs  []net.Conn
	cut bool
}

// NewLink listens on a random 127.0.0.1 port and forwards to to; it is
// closed at cleanup.
func NewLink(t testing.TB, to string) *Link {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &Link{ln: ln, to: to}
	t.Cleanup(l.Close)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.mu.Lock()
			cut := l.cut
			l.mu.Unlock()
			if cut {
				c.Close()
				continue
			}
			d, err := net.Dial("tcp", l.to)
			if err != nil {
				c.Close()
				continue
			}
			l.mu.Lock()
			if l.cut {
				// Cut while dialing: this connection was never through.
				l.mu.Unlock()
				c.Close()
				d.Close()
				continue
			}
			l.cs = append(l.cs, c, d)
			l.mu.Unlock()
			go func() { _, _ = io.Copy(d, c); d.Close() }()
			go func() { _, _ = io.Copy(c, d); c.Close() }()
		}
	}()
	return l
}

// Addr is the address to dial.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Cut closes every connection and refuses new ones until Restore.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = true
	for _, c := range l.cs {
		c.Close()
	}
	l.cs = nil
}

// Restore lets new connections through again after Cut.
func (l *Link) Restore() {
	l.mu.Lock()
	l.cut = false
	l.mu.Unlock()
}

// Close cuts the link for good and closes its listener.
func (l *Link) Close() {
	l.Cut()
	l.ln.Close()
}

func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// Cluster is three JetStream servers whose routes each go through a Link
// of their own, so that one server can be cut off from the others as if
// killed with -9, and whose clients reach them through a Link each.
type Cluster struct {
	Servers []*server.Server
	routes  [][]*Link // routes[i][j]: i's route to j
	clients []*Link   // clients[i]: the clients' way to server i
	t       testing.TB
}

// Start3 starts a Cluster (servers n1, n2, n3), shut down at cleanup.
func Start3(t testing.TB) *Cluster {
	t.Helper()
	var routeAddrs []string
	for range 3 {
		routeAddrs = append(routeAddrs, freeAddr(t))
	}
	c := &Cluster{routes: make([][]*Link, 3), t: t}
	for i := range 3 {
		c.routes[i] = make([]*Link, 3)
		for j := range 3 {
			if i != j {
				c.routes[i][j] = NewLink(t, routeAddrs[j])
			}
		}
	}
	for i := range 3 {
		host, port, _ := net.SplitHostPort(routeAddrs[i])
		p, _ := strconv.Atoi(port)
		o := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: -1,
			JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
			// Advertised to the peers for implicit routes: a port nothing
			// listens on, so a cut route cannot come back around the links
			// (it did, through the real address: an isolated server
			// rejoined within seconds).
			Cluster: server.ClusterOpts{Name: "tail", Host: host, Port: p, Advertise: "127.0.0.1:1"},
		}
		for j := range 3 {
			if i != j {
				o.Routes = append(o.Routes, server.RoutesFromStr("nats://"+c.routes[i][j].Addr())...)
			}
		}
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		t.Cleanup(s.Shutdown)
		c.Servers = append(c.Servers, s)
	}
	for _, s := range c.Servers {
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("server not ready")
		}
	}
	for _, s := range c.Servers {
		c.clients = append(c.clients, NewLink(t, strings.TrimPrefix(s.ClientURL(), "nats://")))
	}
	return c
}

// URLs lists server i (through its client Link) first, then the others
// directly: a connection made with them (and nats.DontRandomize) is on
// server i until Isolate(i) moves it to another.
func (c *Cluster) URLs(i int) string {
	urls := []string{"nats://" + c.clients[i].Addr()}
	for j, o := range c.Servers {
		if j != i {
			urls = append(urls, o.ClientURL())
		}
	}
	return strings.Join(urls, ",")
}

// Connect opens a connection on server i (see URLs), reconnecting for
// ever, closed at cleanup.
func (c *Cluster) Connect(i int) *nats.Conn {
	c.t.Helper()
	nc, err := nats.Connect(c.URLs(i), nats.DontRandomize(), nats.IgnoreDiscoveredServers(),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(nc.Close)
	return nc
}

// Index is the index of the server named name, or -1.
func (c *Cluster) Index(name string) int {
	for i, s := range c.Servers {
		if s.Name() == name {
			return i
		}
	}
	return -1
}

// Isolate cuts server i off from the others and from the clients that
// reach it through its client Link, as a kill -9 looks to them.
func (c *Cluster) Isolate(i int) {
	for j := range c.routes {
		if j != i {
			c.routes[i][j].Cut()
			c.routes[j][i].Cut()
		}
	}
	c.clients[i].Cut()
}

// Setup sets Floe's layout up with cfg through a connection on server 0,
// retrying while the cluster elects its meta leader.
func (c *Cluster) Setup(cfg bus.Config) {
	c.t.Helper()
	js, err := jetstream.New(c.Connect(0))
	if err != nil {
		c.t.Fatal(err)
	}
	Eventually(c.t, 30*time.Second, "a meta leader", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := bus.Setup(ctx, js, cfg)
		return err == nil
	})
}

// Rejoin restores the links Isolate(i) cut: server i meets its peers
// again (and catches up) and its clients can reach it.
func (c *Cluster) Rejoin(i int) {
	for j := range c.routes {
		if j != i {
			c.routes[i][j].Restore()
			c.routes[j][i].Restore()
		}
	}
	c.clients[i].Restore()
}

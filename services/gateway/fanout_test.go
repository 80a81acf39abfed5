package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

// sessionConsumers is the number of consumers on FLOE_SESSIONS.
func sessionConsumers(t testing.TB, env *bustest.Env) int {
	t.Helper()
	s, err := env.JS.Stream(ctxT(t), omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}

func TestSSEClientsShareOneStreamConsumer(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	startEngine(t, env, func(e *fakeEngine) { e.Deltas = 30 })
	g := startGateway(t, env, "", nil)
	base := sessionConsumers(t, env)
	var sids []string
	var cols []*collector
	for range 3 {
		s := createSession(t, g.Alice, client.CreateSession{})
		sids = append(sids, s.ID)
		for range 8 {
			c := openStream(t, g.Alice, s.ID, "")
			c.next() // snapshot
			cols = append(cols, c)
		}
	}
	if n := sessionConsumers(t, env); n != base+1 {
		t.Fatalf("%d consumers on %s with 24 SSE clients on 3 Sessions, want %d (one for the gateway)", n, omni.SessionsStream, base+1)
	}
	for _, sid := range sids {
		submit(t, g.Alice, sid, "go")
	}
	for i, c := range cols {
		c.until("end", idleEvent)
		equalStreams(t, withIDs(t, c.got), busStream(t, env, sids[i/8]))
	}
	// A reconnect replays its gap from a consumer of its own, deleted once
	// the gap is written.
	last := cols[0].got[3].ID
	c := openStream(t, g.Alice, sids[0], last)
	c.until("end", idleEvent)
	want := busStream(t, env, sids[0])
	equalStreams(t, withIDs(t, c.got), want[slicesIndexSeq(want, seqOf(t, last))+1:])
	eventually(t, "replay consumer deleted", func() bool { return sessionConsumers(t, env) == base+1 })
}

func slicesIndexSeq(s []streamed, seq uint64) int {
	for i, m := range s {
		if m.Seq == seq {
			return i
		}
	}
	return -1
}

// rawSSE is a minimal SSE reader on its own TCP connection: one goroutine
// per client in the load test, and what it records is exactly what the
// gateway wrote.
type rawSSE struct {
	conn net.Conn
	body io.ReadCloser
	r    *bufio.Reader
}

func dialRaw(addr, sid, lastID string) (*rawSSE, error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	hdr := ""
	if lastID != "" {
		hdr = "Last-Event-ID: " + lastID + "\r\n"
	}
	fmt.Fprintf(conn, "GET /api/sessions/%s/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n%s\r\n", sid, aliceToken, hdr)
	conn.SetReadDeadline(time.Now().Add(waitLimit))
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 1024), nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		conn.Close()
		return nil, fmt.Errorf("stream %s: HTTP %d", sid, resp.StatusCode)
	}
	return &rawSSE{conn: conn, body: resp.Body, r: bufio.NewReaderSize(resp.Body, 1024)}, nil
}

// next returns the next event's id ("" for id-less events) and data.
func (c *rawSSE) next(deadline time.Time) (id string, data []byte, err error) {
	c.conn.SetReadDeadline(deadline)
	have := false
	for {
		l, err := c.r.ReadSlice('\n')
		if err != nil {
			return "", nil, err
		}
		l = bytes.TrimRight(l, "\r\n")
		switch {
		case len(l) == 0:
			if have {
				return id, data, nil
			}
		case bytes.HasPrefix(l, []byte("id: ")):
			id = string(l[4:])
		case bytes.HasPrefix(l, []byte("data: ")):
			data, have = append([]byte(nil), l[6:]...), true
		}
	}
}

func (c *rawSSE) close() { c.conn.Close() }

// TestSSELoadEveryClientSeesItsSessionExactlyOnce runs many SSE clients on
// many Sessions while partials flow, some clients reconnecting with
// Last-Event-ID mid-run: every client's ids strictly increase and, joined
// over its reconnects, equal its Session's stream exactly (no gap, no
// duplicate). The CI size is small; FLOE_SSE_LOAD=full runs the acceptance
// size, 10,000 clients on 1,000 Sessions.
func TestSSELoadEveryClientSeesItsSessionExactlyOnce(t *testing.T) {
	for _, detach := range []bool{false, true} {
		t.Run(fmt.Sprintf("detach=%v", detach), func(t *testing.T) { sseLoad(t, detach) })
	}
}

func sseLoad(t *testing.T, detach bool) {
	sessions, perSession, msgs := 20, 10, 30
	full := os.Getenv("FLOE_SSE_LOAD") == "full"
	if full {
		sessions, perSession, msgs = 1000, 10, 20
	} else {
		t.Parallel()
	}
	env := bustest.Start(t, bus.Config{MaxConsumers: 100})
	g := startGateway(t, env, "", func(c *gateway.Config) { c.Heartbeat = 5 * time.Second; c.DetachSSE = detach })
	addr := strings.TrimPrefix(g.URL, "http://")
	sids := make([]string, sessions)
	for i := range sids {
		sids[i] = createSession(t, g.Alice, client.CreateSession{}).ID
	}
	var results []loadResult
	if full {
		// The clients run in a child process: 10 000 connections on each
		// side do not fit one process's file descriptors.
		results = runChildClients(t, addr, sids, perSession, msgs, func() {
			checkOneConsumer(t, env, sessions*perSession)
			publishEach(t, env, sids, msgs)
		})
	} else {
		results = runClients(addr, sids, perSession, msgs, func() error {
			checkOneConsumer(t, env, sessions*perSession)
			publishEach(t, env, sids, msgs)
			return nil
		})
	}
	want := make(map[string][]uint64, sessions)
	for _, sid := range sids {
		for _, m := range busStream(t, env, sid) {
			want[sid] = append(want[sid], m.Seq)
		}
	}
	reconnects := 0
	for i, res := range results {
		if res.Err != "" {
			t.Fatalf("client %d: %v", i, res.Err)
		}
		reconnects += res.Reconnects
		w := want[sids[i%sessions]]
		if fmt.Sprint(res.IDs) != fmt.Sprint(w) {
			t.Fatalf("client %d (%d reconnects) got ids %v, want %v", i, res.Reconnects, res.IDs, w)
		}
	}
	t.Logf("%d clients on %d Sessions, %d events each, %d reconnects with Last-Event-ID", len(results), sessions, msgs, reconnects)
}

func checkOneConsumer(t testing.TB, env *bustest.Env, clients int) {
	t.Helper()
	if n := sessionConsumers(t, env); n != 1 {
		t.Fatalf("%d consumers on %s with %d SSE clients, want 1", n, omni.SessionsStream, clients)
	}
}

// loadResult is what one load-test client saw.
type loadResult struct {
	IDs        []uint64 `json:"ids"`
	Reconnects int      `json:"reconnects"`
	Err        string   `json:"err,omitempty"`
}

// runClients opens perSession SSE clients on every Session, calls live once
// every stream is open (its snapshot read), then reads msgs events on
// each; every fourth client drops its connection after a few events and
// comes back with its Last-Event-ID.
func runClients(addr string, sids []string, perSession, msgs int, live func() error) []loadResult {
	sessions := len(sids)
	clients := sessions * perSession
	results := make([]loadResult, clients)
	var ready, done sync.WaitGroup
	ready.Add(clients)
	done.Add(clients)
	start := make(chan struct{})
	var openErr atomic.Value
	deadline := time.Now().Add(5 * time.Minute)
	for i := range clients {
		go func() {
			defer done.Done()
			res := &results[i]
			sid := sids[i%sessions]
			readyOnce := sync.OnceFunc(ready.Done)
			defer readyOnce()
			c, err := dialRaw(addr, sid, "")
			if err == nil {
				_, _, err = c.next(deadline) // the snapshot: live from here
			}
			if err != nil {
				openErr.Store(err)
				res.Err = err.Error()
				return
			}
			readyOnce()
			<-start
			dropAt := -1
			if i%4 == 1 {
				dropAt = 3 + i%(msgs/2)
			}
			lastID := ""
			for len(res.IDs) < msgs {
				if len(res.IDs) == dropAt {
					c.close()
					dropAt = -1
					if c, err = dialRaw(addr, sid, lastID); err != nil {
						res.Err = err.Error()
						return
					}
					res.Reconnects++
				}
				id, _, err := c.next(deadline)
				if err != nil {
					res.Err = fmt.Sprintf("after %d events: %v", len(res.IDs), err)
					c.close()
					return
				}
				if id == "" {
					continue // snapshot after the replayed gap
				}
				lastID = id
				_, q, _ := strings.Cut(id, "-")
				seq, _ := strconv.ParseUint(q, 10, 64)
				res.IDs = append(res.IDs, seq)
			}
			c.close()
		}()
	}
	ready.Wait()
	if err := openErr.Load(); err != nil {
		close(start)
		done.Wait()
		return results
	}
	if err := live(); err != nil {
		results[0].Err = err.Error()
	}
	close(start)
	done.Wait()
	return results
}

// TestSSELoadClientProcess is the child of the full load test: it is run
// by runChildClients only.
func TestSSELoadClientProcess(t *testing.T) {
	spec := os.Getenv("FLOE_SSE_LOAD_CHILD")
	if spec == "" {
		t.Skip("the full load test's client process")
	}
	var in struct {
		Addr             string
		Sids             []string
		PerSession, Msgs int
	}
	if err := json.Unmarshal([]byte(spec), &in); err != nil {
		t.Fatal(err)
	}
	stdin := bufio.NewReader(os.Stdin)
	results := runClients(in.Addr, in.Sids, in.PerSession, in.Msgs, func() error {
		fmt.Println("ready")
		_, err := stdin.ReadString('\n') // "go": the parent publishes
		return err
	})
	b, _ := json.Marshal(results)
	fmt.Printf("results %s\n", b)
}

// runChildClients runs runClients in a child process (this test binary)
// and calls publish once its streams are open.
func runChildClients(t *testing.T, addr string, sids []string, perSession, msgs int, publish func()) []loadResult {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := json.Marshal(map[string]any{"Addr": addr, "Sids": sids, "PerSession": perSession, "Msgs": msgs})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^TestSSELoadClientProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "FLOE_SSE_LOAD_CHILD="+string(spec))
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	out := bufio.NewReaderSize(stdout, 1<<20)
	var results []loadResult
	for {
		line, err := out.ReadString('\n')
		if err != nil {
			t.Fatalf("client process: %v", err)
		}
		switch {
		case line == "ready\n":
			publish()
			io.WriteString(stdin, "go\n")
		case strings.HasPrefix(line, "results "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "results ")), &results); err != nil {
				t.Fatal(err)
			}
			return results
		}
	}
}

// publishEach publishes n partial deltas on every Session, round-robin,
// asynchronously.
func publishEach(t testing.TB, env *bustest.Env, sids []string, n int) {
	t.Helper()
	js, _ := jetstream.New(env.Conn, jetstream.WithPublishAsyncMaxPending(4096))
	for i := range n {
		for _, sid := range sids {
			m := omni.Partial(omni.TypeText, omni.EventDelta, "d"+strconv.Itoa(i)+" ", "", "")
			msg, _ := bus.SessionMsg(sid, &m, "")
			for {
				_, err := js.PublishMsgAsync(msg)
				if err == nil {
					break
				}
				if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
					t.Fatal(err)
				}
				<-js.PublishAsyncComplete()
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(waitLimit):
		t.Fatal("publish acks missing")
	}
}

// A detached stream (DetachSSE) is cut off like any other when it stops
// reading, without slowing a reading client, and ends its connection.
func TestDetachedSlowClientIsDisconnectedOthersUnaffected(t *testing.T) {
	// Not parallel, and a buffer of 96 events for the reading client:
	// under -race on a loaded machine it fell 16 events behind once, and
	// more than 48 once at load 23. The silent client is cut off either way
	// behind its full socket: its buffer fills, or a write waits longer
	// than WriteTimeout (both count as slow disconnects); the flood (480
	// events, 7.5 MiB, under NATS's payload limit as one complete message)
	// is more than its socket (about 4 MiB here) and buffer (1.5 MiB) hold.
	env := newBus(t)
	startEngine(t, env, func(e *fakeEngine) { e.Deltas = 480; e.DeltaBytes = 16 << 10 })
	g := startGateway(t, env, "", func(c *gateway.Config) {
		c.ClientBuffer = 96
		c.WriteTimeout = time.Second
		c.DetachSSE = true
	})
	s := createSession(t, g.Alice, client.CreateSession{})
	slow, err := dialRaw(strings.TrimPrefix(g.URL, "http://"), s.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	defer slow.close()
	good := openStream(t, g.Alice, s.ID, "")
	submit(t, g.Alice, s.ID, "flood")
	good.until("end", idleEvent)
	if good.s.Connects() != 1 {
		t.Fatalf("the reading client reconnected %d times", good.s.Connects()-1)
	}
	equalStreams(t, withIDs(t, good.got), busStream(t, env, s.ID))
	eventually(t, "slow client disconnected", func() bool {
		return strings.Contains(metricsText(t, g), "floe_gateway_sse_slow_disconnects_total 1")
	})
	slow.conn.SetReadDeadline(time.Now().Add(waitLimit))
	if _, err := io.Copy(io.Discard, slow.body); err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("slow client's connection was not closed: %v", err)
	}
}

// A client whose buffer never fills but that takes no write for
// WriteTimeout is cut off as slow too, and counted with them.
func TestClientTakingNoWriteIsCountedSlow(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	startEngine(t, env, func(e *fakeEngine) { e.Deltas = 480; e.DeltaBytes = 16 << 10 })
	g := startGateway(t, env, "", func(c *gateway.Config) {
		c.ClientBuffer = 4096 // more than the flood: only the write timeout can cut it off
		c.WriteTimeout = time.Second
		c.DetachSSE = true
	})
	s := createSession(t, g.Alice, client.CreateSession{})
	silent, err := dialRaw(strings.TrimPrefix(g.URL, "http://"), s.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.close()
	submit(t, g.Alice, s.ID, "flood")
	eventually(t, "silent client cut off as slow", func() bool {
		return strings.Contains(metricsText(t, g), "floe_gateway_sse_slow_disconnects_total 1")
	})
	silent.conn.SetReadDeadline(time.Now().Add(waitLimit))
	if _, err := io.Copy(io.Discard, silent.body); err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("silent client's connection was not closed: %v", err)
	}
}

// A detached stream ends when its client goes away (the socket reader
// notices), releasing its place at the tail, and when the gateway closes.
func TestDetachedStreamEndsWithItsClient(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g := startGateway(t, env, "", func(c *gateway.Config) { c.DetachSSE = true })
	s := createSession(t, g.Alice, client.CreateSession{})
	addr := strings.TrimPrefix(g.URL, "http://")
	c1, err := dialRaw(addr, s.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c1.next(time.Now().Add(waitLimit)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "one client", func() bool { return strings.Contains(metricsText(t, g), "floe_gateway_sse_clients 1") })
	c1.close()
	eventually(t, "no client after it left", func() bool { return strings.Contains(metricsText(t, g), "floe_gateway_sse_clients 0") })
	c2, err := dialRaw(addr, s.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c2.close()
	if _, _, err := c2.next(time.Now().Add(waitLimit)); err != nil {
		t.Fatal(err)
	}
	g.release()
	g.release = func() {}
	c2.conn.SetReadDeadline(time.Now().Add(waitLimit))
	if _, err := io.Copy(io.Discard, c2.body); err != nil {
		t.Fatalf("stream after the gateway closed: %v, want a complete response", err)
	}
}

package gateway_test

import (
	"context"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

// fanoutHost is the index of the server the gateway's whole-stream
// consumer (the SSE fan-out) lives on, or -1 when there is none.
func fanoutHost(ctx context.Context, t testing.TB, cl *bustest.Cluster, js jetstream.JetStream) int {
	t.Helper()
	st, err := js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		t.Fatal(err)
	}
	host := -1
	for ci := range st.ListConsumers(ctx).Info() {
		whole := ci.Config.FilterSubject == omni.SessionSubjects ||
			(len(ci.Config.FilterSubjects) == 1 && ci.Config.FilterSubjects[0] == omni.SessionSubjects)
		if whole && ci.Cluster != nil {
			host = cl.Index(ci.Cluster.Leader)
		}
	}
	return host
}

// When the server the gateway's SSE fan-out consumer lives on is killed
// (-9: its peers get no notice and do not mark it offline for minutes),
// the live messages stored after the kill still reach every attached SSE
// client within seconds, each once, ids strictly increasing: whether the
// gateway's own connection was to that server (it reconnects elsewhere)
// or to another one (the heartbeats stop).
func TestSSEFanoutSurvivesTheLossOfItsConsumersServer(t *testing.T) {
	t.Run("gateway elsewhere", func(t *testing.T) { fanoutThroughLoss(t, false) })
	t.Run("gateway on it", func(t *testing.T) { fanoutThroughLoss(t, true) })
}

func fanoutThroughLoss(t *testing.T, gatewayOnHost bool) {
	cl := bustest.Start3(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conns := make([]*nats.Conn, 3)
	for i := range conns {
		conns[i] = cl.Connect(i)
	}
	cl.Setup(bus.Config{Replicas: 3, Memory: true})

	// Placement is random: start gateways (each on its own connection)
	// until the fan-out's consumer is where the case wants it.
	var (
		g          *client.Client
		sid        string
		streams    []*collector
		on, host   int
		release    func()
		publishers []jetstream.JetStream
	)
	for i := range conns {
		js, _ := jetstream.New(conns[i])
		publishers = append(publishers, js)
	}
	for attempt := 0; g == nil; attempt++ {
		if attempt == 30 {
			t.Fatal("no fan-out consumer placed as wanted in 30 tries")
		}
		on = attempt % 3
		nc := cl.Connect(on)
		hctx, hcancel := context.WithTimeout(ctx, 20*time.Second)
		h, rel, err := gateway.NewHandler(hctx, nc, testConfig(t.TempDir()), zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel))
		hcancel()
		if err != nil {
			t.Fatalf("NewHandler: %v", err)
		}
		srv := httptest.NewServer(h)
		c := client.New(srv.URL, client.WithToken(aliceToken))
		if sid == "" {
			sid = createSession(t, c, client.CreateSession{}).ID
		}
		var cols []*collector
		for range 3 {
			col := openStream(t, c, sid, "")
			col.next() // snapshot: the client is on the fan-out
			cols = append(cols, col)
		}
		host = fanoutHost(ctx, t, cl, publishers[on])
		if host >= 0 && (host == on) == gatewayOnHost {
			g, streams = c, cols
			release = func() { srv.CloseClientConnections(); rel(); srv.Close(); nc.Close() }
			continue
		}
		for _, col := range cols {
			col.close()
		}
		srv.CloseClientConnections()
		rel()
		srv.Close()
		nc.Close()
	}
	defer release()
	t.Logf("gateway on %s, fan-out consumer on %s", cl.Servers[on].Name(), cl.Servers[host].Name())

	// Publishes through a server that stays up, retrying (with the
	// message's id) while the stream elects a leader; returns when stored.
	jsPub := publishers[(host+1)%3]
	var stored []uint64
	publish := func(i int) {
		t.Helper()
		m := omni.Partial(omni.TypeText, omni.EventDelta, "d"+strconv.Itoa(i)+" ", "", "")
		for {
			msg, _ := bus.SessionMsg(sid, &m, "")
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			ack, err := jsPub.PublishMsg(pctx, msg, jetstream.WithMsgID(sid+"-"+strconv.Itoa(i)))
			pcancel()
			if err == nil {
				stored = append(stored, ack.Sequence)
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("message %d never stored: %v", i, err)
			}
		}
	}
	// Each stream's ids after its snapshot, read on a goroutine of its own.
	var mu sync.Mutex
	ids := make([][]uint64, len(streams))
	var wg sync.WaitGroup
	readCtx, stopReading := context.WithCancel(ctx)
	for k, col := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case ev, ok := <-col.s.C:
					if !ok {
						return
					}
					if ev.ID == "" {
						continue
					}
					_, tail, _ := strings.Cut(ev.ID, "-")
					seq, err := strconv.ParseUint(tail, 10, 64)
					if err != nil {
						continue
					}
					mu.Lock()
					ids[k] = append(ids[k], seq)
					mu.Unlock()
				case <-readCtx.Done():
					return
				}
			}
		}()
	}
	defer func() { stopReading(); wg.Wait() }()
	all := func(n int) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range ids {
			if len(s) < n {
				return false
			}
		}
		return true
	}
	for i := range 5 {
		publish(i)
	}
	bustest.Eventually(t, 20*time.Second, "the first 5 messages on every stream", func() bool { return all(5) })

	killedAt := time.Now()
	cl.Isolate(host)
	for i := 5; i < 10; i++ {
		publish(i)
	}
	storedAt := time.Now()
	// The bound of bus.Tail's own test (2–7 s measured there).
	for deadline := time.Now().Add(15 * time.Second); !all(10); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			mu.Lock()
			defer mu.Unlock()
			for k, col := range streams {
				t.Logf("stream %d (%d connects): ids %v", k, col.s.Connects(), ids[k])
			}
			for _, s := range cl.Servers {
				t.Logf("%s: %d routes", s.Name(), s.NumRoutes())
			}
			t.Fatalf("the messages stored after the kill (%v) did not reach every stream within 15 s", stored)
		}
	}
	if n := cl.Servers[host].NumRoutes(); n != 0 {
		t.Fatalf("the killed server has %d routes again: it was not isolated", n)
	}
	t.Logf("stored %v after the kill, on every stream %v after that", storedAt.Sub(killedAt).Round(10*time.Millisecond), time.Since(storedAt).Round(10*time.Millisecond))
	time.Sleep(500 * time.Millisecond) // nothing more may come
	mu.Lock()
	defer mu.Unlock()
	for k, s := range ids {
		if len(s) != len(stored) {
			t.Fatalf("stream %d: ids %v, want %v", k, s, stored)
		}
		for i := range s {
			if s[i] != stored[i] {
				t.Fatalf("stream %d: ids %v, want %v", k, s, stored)
			}
		}
	}
}

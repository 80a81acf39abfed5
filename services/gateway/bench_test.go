package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// stampOf extracts the publish time (unix ns) a benchmark delta carries in
// its text, "t<ns> ".
func stampOf(data []byte) (int64, bool) {
	i := bytes.Index(data, []byte(`"text":"t`))
	if i < 0 {
		return 0, false
	}
	rest := data[i+len(`"text":"t`):]
	j := bytes.IndexByte(rest, ' ')
	if j < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	return n, err == nil
}

// latencies collects publish→receive latencies.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(ds []time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, ds...)
	l.mu.Unlock()
}

func (l *latencies) report(b *testing.B, events int, elapsed time.Duration) {
	slices.Sort(l.d)
	pct := func(p float64) float64 {
		if len(l.d) == 0 {
			return 0
		}
		return float64(l.d[int(p*float64(len(l.d)-1))].Microseconds())
	}
	b.ReportMetric(float64(events)/elapsed.Seconds(), "events/s")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
	b.ReportMetric(0, "ns/op")
}

// publishPartials publishes n partial_text deltas on each Session, paced at
// rate messages per second in total, asynchronously (as the engine does).
func publishPartials(b *testing.B, env *bustest.Env, sids []string, n, rate int) {
	b.Helper()
	js, _ := jetstream.New(env.Conn, jetstream.WithPublishAsyncMaxPending(4096))
	var interval time.Duration
	if rate > 0 {
		interval = time.Second / time.Duration(rate)
	}
	next := time.Now()
	for i := range n {
		for _, sid := range sids {
			m := omni.Partial(omni.TypeText, omni.EventDelta, "t"+strconv.FormatInt(time.Now().UnixNano(), 10)+" "+strings.Repeat("x", 40), "", "")
			msg, _ := bus.SessionMsg(sid, &m, "")
			for {
				_, err := js.PublishMsgAsync(msg)
				if err == nil {
					break
				}
				if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
					b.Fatal(err)
				}
				<-js.PublishAsyncComplete() // let the acks catch up
			}
			if interval > 0 {
				next = next.Add(interval)
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
			}
		}
		_ = i
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(waitLimit):
		b.Fatal("publish acks missing")
	}
}

// fanoutShapes are the benchmarked Sessions × clients, published either
// paced (rate partials per second over all Sessions: latency under a steady
// load) or as fast as possible (rate 0: throughput).
var fanoutShapes = []struct{ sessions, clients, rate int }{
	{1, 1, 4000}, {1, 20, 4000}, {10, 5, 4000}, {20, 10, 2000},
	{1, 1, 0}, {1, 20, 0}, {10, 5, 0}, {20, 10, 0},
}

func shapeName(sessions, clients, rate int) string {
	r := "max"
	if rate > 0 {
		r = strconv.Itoa(rate)
	}
	return fmt.Sprintf("sessions=%d/clients=%d/rate=%s", sessions, clients, r)
}

// BenchmarkSSEFanout measures M Sessions × N SSE clients receiving
// partials through the gateway (real HTTP on loopback, client package
// parser): delivered events per second and publish→client latency.
func BenchmarkSSEFanout(b *testing.B) {
	for _, shape := range fanoutShapes {
		b.Run(shapeName(shape.sessions, shape.clients, shape.rate), func(b *testing.B) {
			env := newBus(b)
			g := startGateway(b, env, "", nil)
			var sids []string
			var wg sync.WaitGroup
			lat := &latencies{}
			n := max(b.N, 50)
			for range shape.sessions {
				s := createSession(b, g.Alice, client.CreateSession{})
				sids = append(sids, s.ID)
				for range shape.clients {
					ctx, cancel := context.WithCancel(context.Background())
					b.Cleanup(cancel)
					st, err := g.Alice.Stream(ctx, s.ID, "")
					if err != nil {
						b.Fatal(err)
					}
					<-st.C // snapshot: the client is live
					wg.Add(1)
					go func() {
						defer wg.Done()
						ds := make([]time.Duration, 0, n)
						for ev := range st.C {
							if ts, ok := stampOf(ev.Data); ok {
								ds = append(ds, time.Duration(time.Now().UnixNano()-ts))
								if len(ds) == n {
									break
								}
							}
						}
						lat.add(ds)
						cancel()
					}()
				}
			}
			b.ResetTimer()
			start := time.Now()
			publishPartials(b, env, sids, n, shape.rate)
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			lat.report(b, n*shape.sessions*shape.clients, elapsed)
		})
	}
}

// BenchmarkBareJetStreamFanout is the baseline: the same messages read by
// M×N ordered JetStream consumers directly, no HTTP.
func BenchmarkBareJetStreamFanout(b *testing.B) {
	for _, shape := range fanoutShapes {
		b.Run(shapeName(shape.sessions, shape.clients, shape.rate), func(b *testing.B) {
			env := newBus(b)
			nc := bustest.Connect(b, env.Server)
			js, _ := jetstream.New(nc)
			var sids []string
			var wg sync.WaitGroup
			lat := &latencies{}
			n := max(b.N, 50)
			for i := range shape.sessions {
				sid := omni.NewSessionID(time.Now(), fmt.Sprintf("%08x", i))
				sids = append(sids, sid)
				for range shape.clients {
					cons, err := js.OrderedConsumer(context.Background(), omni.SessionsStream, jetstream.OrderedConsumerConfig{
						FilterSubjects: bus.Filters(sid, omni.ClientClasses), DeliverPolicy: jetstream.DeliverNewPolicy})
					if err != nil {
						b.Fatal(err)
					}
					it, err := cons.Messages()
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(it.Stop)
					wg.Add(1)
					go func() {
						defer wg.Done()
						ds := make([]time.Duration, 0, n)
						for len(ds) < n {
							m, err := it.Next()
							if err != nil {
								return
							}
							if ts, ok := stampOf(m.Data()); ok {
								ds = append(ds, time.Duration(time.Now().UnixNano()-ts))
							}
						}
						lat.add(ds)
					}()
				}
			}
			b.ResetTimer()
			start := time.Now()
			publishPartials(b, env, sids, n, shape.rate)
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			lat.report(b, n*shape.sessions*shape.clients, elapsed)
		})
	}
}

// BenchmarkIdleSSEConnectionMemory opens idle SSE connections (raw TCP
// clients that read the headers and the snapshot) and reports the process's
// heap and goroutines per connection: the gateway handler, its ordered
// consumer (client and in-process server side) and the test's raw client.
func BenchmarkIdleSSEConnectionMemory(b *testing.B) {
	env := newBus(b)
	g := startGateway(b, env, "", nil)
	s := createSession(b, g.Alice, client.CreateSession{})
	const conns = 200
	// One measurement whatever b.N: the figure is per connection.
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	var open []net.Conn
	for range conns {
		conn, err := net.Dial("tcp", strings.TrimPrefix(g.URL, "http://"))
		if err != nil {
			b.Fatal(err)
		}
		open = append(open, conn)
		fmt.Fprintf(conn, "GET /api/sessions/%s/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n\r\n", s.ID, aliceToken)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("stream: %v", err)
		}
		if _, err := br.ReadString('\n'); err != nil { // the snapshot's first line
			b.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(int64(after.HeapInuse)-int64(before.HeapInuse))/conns, "heap-B/conn")
	b.ReportMetric(float64(runtime.NumGoroutine()-g0)/conns, "goroutines/conn")
	b.ReportMetric(0, "ns/op")
	for _, c := range open {
		c.Close()
	}
}

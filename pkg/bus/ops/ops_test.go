package ops_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/bus/ops"
)

func TestRegisterAnswersPingInfoAndStatus(t *testing.T) {
	env := bustest.Start(t, bus.Config{Memory: true})
	srv, err := ops.Register(env.Conn, "tracer", "test tracer", func() any { return map[string]int{"pending": 3} })
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	nc := bustest.Connect(t, env.Server)
	msg, err := nc.Request("$SRV.INFO.floe-tracer", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		t.Fatal(err)
	}
	if info.Name != "floe-tracer" || info.Version == "" || len(info.Endpoints) != 1 || info.Endpoints[0].Subject != ops.StatusSubject("tracer") {
		t.Fatalf("info = %+v", info)
	}
	msg, err = nc.Request(ops.StatusSubject("tracer"), nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Data) != `{"pending":3}` {
		t.Fatalf("status = %s", msg.Data)
	}
}

func TestMustRegisterSharesSeriesAndServeMetricsServesThem(t *testing.T) {
	reg := ops.NewRegistry()
	a := ops.MustRegister(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "floe_test_total", Help: "t"}))
	b := ops.MustRegister(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "floe_test_total", Help: "t"}))
	if a != b {
		t.Fatal("a second registration under the same name got its own counter")
	}
	a.Add(2)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ops.ServeMetrics(ctx, addr, reg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	var body string
	bustest.Eventually(t, 10*time.Second, "metrics served", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == 200
	})
	for _, want := range []string{"floe_test_total 2", "go_goroutines", "process_resident_memory_bytes"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

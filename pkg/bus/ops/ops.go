// Package ops is what every Floe service shows operators: its Prometheus
// series, served on /metrics, and its registration as a NATS micro service
// (`nats micro ls`, `nats micro stats`, `nats micro info`) with a status
// endpoint.
package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Version is Floe's version for the micro registration: the main module's
// version when it was built from one, else 0.0.0 (a development build).
func Version() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; len(v) > 1 && v[0] == 'v' && v != "(devel)" {
			return v[1:]
		}
	}
	return "0.0.0"
}

// StatusSubject is the subject of a service's status endpoint: every
// instance answers (no queue group), so `nats req --replies 0` lists them.
func StatusSubject(service string) string { return "floe.status." + service }

// Register registers the running service as the NATS micro service
// floe-<service> with a status endpoint answering status() as JSON. Stop
// the returned service when the service stops (closing nc also does).
func Register(nc *nats.Conn, service, description string, status func() any) (micro.Service, error) {
	srv, err := micro.AddService(nc, micro.Config{
		Name:        "floe-" + service,
		Version:     Version(),
		Description: description,
	})
	if err != nil {
		return nil, fmt.Errorf("ops: register %s as a micro service: %w", service, err)
	}
	err = srv.AddEndpoint("status", micro.HandlerFunc(func(req micro.Request) {
		b, err := json.Marshal(status())
		if err != nil {
			req.Error("500", err.Error(), nil)
			return
		}
		req.Respond(b)
	}), micro.WithEndpointSubject(StatusSubject(service)), micro.WithEndpointQueueGroupDisabled())
	if err != nil {
		srv.Stop()
		return nil, fmt.Errorf("ops: %s status endpoint: %w", service, err)
	}
	return srv, nil
}

// NewRegistry returns a registry with the Go runtime and process
// collectors, what each service process serves on /metrics.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// MustRegister registers c on reg, or returns the collector already
// registered under its name, so two instances on one registry (floe serve
// runs every service in one process) share their series. A nil reg
// registers nothing (the series still count, unserved).
func MustRegister[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if old, ok := are.ExistingCollector.(C); ok {
				return old
			}
		}
		panic(err)
	}
	return c
}

// ServeMetrics serves g on http://addr/metrics until ctx ends.
func ServeMetrics(ctx context.Context, addr string, g prometheus.Gatherer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("ops: metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("ops: metrics: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	hs.Shutdown(sctx)
	<-served
	return nil
}

// Command gateway runs Floe's HTTP gateway alone against an external NATS:
// the entry point of a gateway container image (run several behind a load
// balancer; an SSE client resumes on any replica with Last-Event-ID). It is
// `floe gateway` without the rest of the binary. Flags beat FLOE_*
// variables, which beat defaults:
//
//	gateway --nats nats://n1:4222,nats://n2:4222 --home /data --http 0.0.0.0:7364
//
// Settings: --nats (FLOE_NATS_URL, required), --home (FLOE_HOME, required:
// Traces are read from <home>/traces, shared with the tracer; default
// Workspaces are created under <home>/workspaces, shared with the
// toolrunners), --http (FLOE_HTTP_ADDR, default 127.0.0.1:7364), --model
// (FLOE_MODEL, default scripted:demo), --log-level (FLOE_LOG_LEVEL), and
// FLOE_API_TOKEN: bearer tokens, comma-separated, required off loopback.
//
// Credentials: --nats-creds FILE (FLOE_NATS_CREDS), or --nats-user NAME
// (FLOE_NATS_USER) whose password comes from FLOE_NATS_PASSWORD or
// --nats-password-file FILE (FLOE_NATS_PASSWORD_FILE), never from a flag.
// Replies come on _INBOX.gateway.>, the prefix deploy/nats/auth.conf grants
// the gateway user. It waits until the JetStream layout exists (`floe
// setup`).
package main

import (
	"context"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus/svc"
	"floe.dev/pkg/telemetry"
	"floe.dev/services/gateway"
)

func main() {
	svc.Service[gateway.Config]{
		Name:     "gateway",
		FromEnv:  gateway.FromEnv,
		Flags:    (*gateway.Config).Flags,
		Validate: (*gateway.Config).Validate,
		Prepare: func(cfg *gateway.Config, m *svc.Main) {
			cfg.DetachSSE, cfg.Metrics, cfg.Gatherer = true, m.Metrics(), m.Metrics()
		},
		Run: func(ctx context.Context, nc *nats.Conn, cfg gateway.Config, log zerolog.Logger) error {
			return telemetry.Run(ctx, "floe-gateway", os.Getenv, func(tel *telemetry.Provider) error {
				cfg.Telemetry = tel
				return gateway.Run(ctx, nc, cfg, log)
			})
		},
	}.Exit()
}

// Command engine runs Floe's engine alone against an external NATS: the
// entry point of an engine container image. It is `floe engine` without the
// rest of the binary. Flags beat FLOE_* variables, which beat defaults:
//
//	engine --nats nats://n1:4222,nats://n2:4222 [--pool gpu]
//
// Settings: --nats (FLOE_NATS_URL, required), --home (FLOE_HOME: Traces
// shared with the tracer speed up resuming), --pool (FLOE_POOL), --log-level
// (FLOE_LOG_LEVEL), FLOE_ENGINE_ACK_WAIT_MS (how long a dead engine's Task
// waits before another engine takes it), FLOE_HEARTBEAT_TIMEOUT_MS (a
// silent tool job fails as lost after it), FLOE_RETRY_BASE_MS,
// FLOE_RETRY_CAP_MS, FLOE_RETRY_MAX, FLOE_REQUEST_TIMEOUT_MS, the
// provider variables (protocol.md §8), FLOE_HOOKS, and the sandbox of hook
// commands: --sandbox (FLOE_SANDBOX), --sandbox-network
// (FLOE_SANDBOX_NETWORK) and the other FLOE_SANDBOX_* and FLOE_TOOL_*
// variables, as the toolrunner reads them.
//
// Credentials: --nats-creds FILE (FLOE_NATS_CREDS), or --nats-user NAME
// (FLOE_NATS_USER) whose password comes from FLOE_NATS_PASSWORD or
// --nats-password-file FILE (FLOE_NATS_PASSWORD_FILE), never from a flag.
// Replies come on _INBOX.engine.>, the prefix deploy/nats/auth.conf grants
// the engine user. The engine does not create the JetStream layout: it
// waits until `floe setup` (or any `floe` process allowed to) has.
package main

import (
	"context"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus/svc"
	"floe.dev/pkg/telemetry"
	"floe.dev/services/engine"
)

func main() {
	svc.Service[engine.Config]{
		Name:     "engine",
		FromEnv:  engine.FromEnv,
		Flags:    (*engine.Config).Flags,
		Validate: (*engine.Config).Validate,
		Prepare: func(cfg *engine.Config, m *svc.Main) {
			// Hook commands run confined like tools: Floe's listeners this
			// engine knows of besides its NATS servers (which Run adds) are
			// closed to them.
			cfg.Hooks.Sandbox.DenyAddrs(os.Getenv("FLOE_HTTP_ADDR"), os.Getenv("FLOE_METRICS_ADDR"))
			cfg.Metrics = m.Metrics()
		},
		Run: func(ctx context.Context, nc *nats.Conn, cfg engine.Config, log zerolog.Logger) error {
			return telemetry.Run(ctx, "floe-engine", os.Getenv, func(tel *telemetry.Provider) error {
				cfg.Telemetry = tel
				return engine.Run(ctx, nc, cfg, log)
			})
		},
	}.Exit()
}

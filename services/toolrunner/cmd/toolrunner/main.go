// Command toolrunner runs one Floe tool runner alone against an external
// NATS: the entry point of a toolrunner container image (run as many as you
// like; they share each pool's work queue). It is `floe toolrunner` without
// the rest of the binary. Flags beat FLOE_* variables, which beat defaults:
//
//	toolrunner --nats nats://n1:4222,nats://n2:4222 [--pool gpu] [--concurrency 8]
//
// Settings: --nats (FLOE_NATS_URL, required), --pool (FLOE_POOL),
// --concurrency (FLOE_TOOL_CONCURRENCY), --mcp-config (FLOE_MCP_CONFIG),
// --log-level (FLOE_LOG_LEVEL), --sandbox (FLOE_SANDBOX) and
// --sandbox-network (FLOE_SANDBOX_NETWORK); the other FLOE_SANDBOX_* and
// FLOE_TOOL_* limits are read by sandbox.ConfigFromEnv.
// Tools run `bash -lc` in the Session's Workspace, which must be the same
// path on every runner (a shared volume).
//
// Credentials: --nats-creds FILE (FLOE_NATS_CREDS), or --nats-user NAME
// (FLOE_NATS_USER) whose password comes from FLOE_NATS_PASSWORD or
// --nats-password-file FILE (FLOE_NATS_PASSWORD_FILE), never from a flag.
// Replies come on _INBOX.toolrunner.>, the prefix deploy/nats/auth.conf
// grants the toolrunner user. It waits until the JetStream layout exists
// (`floe setup`).
package main

import (
	"context"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus/svc"
	"floe.dev/pkg/telemetry"
	"floe.dev/services/toolrunner"
)

func main() {
	svc.Service[toolrunner.Config]{
		Name:     "toolrunner",
		FromEnv:  toolrunner.FromEnv,
		Flags:    (*toolrunner.Config).Flags,
		Validate: (*toolrunner.Config).Validate,
		Prepare: func(cfg *toolrunner.Config, m *svc.Main) {
			// Floe's listeners this runner knows of besides its NATS
			// servers, which Run adds.
			cfg.Sandbox.DenyAddrs(os.Getenv("FLOE_HTTP_ADDR"), os.Getenv("FLOE_METRICS_ADDR"))
			cfg.Metrics = m.Metrics()
		},
		Run: func(ctx context.Context, nc *nats.Conn, cfg toolrunner.Config, log zerolog.Logger) error {
			return telemetry.Run(ctx, "floe-toolrunner", os.Getenv, func(tel *telemetry.Provider) error {
				cfg.Telemetry = tel
				return toolrunner.Run(ctx, nc, cfg, log)
			})
		},
	}.Exit()
}

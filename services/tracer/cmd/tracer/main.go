// Command tracer runs Floe's tracer alone against an external NATS: the
// entry point of a tracer container image. It is `floe tracer` without the
// rest of the binary. It writes every Session's Trace under
// $FLOE_HOME/traces (share that volume with the gateways, which serve
// history from it). One tracer writes a home at a time; a second one on the
// same home waits as a hot standby. Flags beat FLOE_* variables:
//
//	tracer --nats nats://n1:4222,nats://n2:4222 --home /data
//
// Settings: --nats (FLOE_NATS_URL, required), --home (FLOE_HOME, required),
// --log-level (FLOE_LOG_LEVEL).
//
// Credentials: --nats-creds FILE (FLOE_NATS_CREDS), or --nats-user NAME
// (FLOE_NATS_USER) whose password comes from FLOE_NATS_PASSWORD or
// --nats-password-file FILE (FLOE_NATS_PASSWORD_FILE), never from a flag.
// Replies come on _INBOX.tracer.>, the prefix deploy/nats/auth.conf grants
// the tracer user. It waits until the JetStream layout exists (`floe
// setup`).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus/svc"
	"floe.dev/services/tracer"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "tracer:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("tracer", flag.ContinueOnError)
	m := svc.NewMain("tracer", fs)
	cfg, err := tracer.FromEnv(os.Getenv)
	if err != nil {
		return err
	}
	cfg.Flags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	cfg.Metrics = m.Metrics()
	if err := cfg.Validate(); err != nil {
		return err
	}
	return m.Run(func(ctx context.Context, nc *nats.Conn, log zerolog.Logger) error {
		return tracer.Run(ctx, nc, cfg, log)
	})
}

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
	"os/signal"
	"syscall"
	"time"

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
	url := fs.String("nats", os.Getenv("FLOE_NATS_URL"), "NATS URL(s), comma-separated (FLOE_NATS_URL)")
	creds := fs.String("nats-creds", os.Getenv("FLOE_NATS_CREDS"), "NATS credentials file (FLOE_NATS_CREDS)")
	user := fs.String("nats-user", os.Getenv("FLOE_NATS_USER"), "NATS user (FLOE_NATS_USER); password from FLOE_NATS_PASSWORD or --nats-password-file")
	passwordFile := fs.String("nats-password-file", os.Getenv("FLOE_NATS_PASSWORD_FILE"), "file holding the NATS password (FLOE_NATS_PASSWORD_FILE)")
	level := fs.String("log-level", svc.EnvOr("FLOE_LOG_LEVEL", "info"), "debug, info, warn or error (FLOE_LOG_LEVEL)")
	home := fs.String("home", os.Getenv("FLOE_HOME"), "data root: Traces go to <home>/traces (FLOE_HOME, required)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *url == "" {
		return errors.New("--nats (or FLOE_NATS_URL) is required")
	}
	cfg := tracer.Config{Home: *home}
	if err := cfg.Validate(); err != nil {
		return err
	}
	lvl, err := zerolog.ParseLevel(*level)
	if err != nil {
		return fmt.Errorf("--log-level %q: %w", *level, err)
	}
	log := zerolog.New(os.Stderr).Level(lvl).With().Timestamp().Str("service", "tracer").Logger()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts, err := svc.AuthOptions(*creds, *user, *passwordFile)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(*url, append(opts, nats.Name("floe-tracer"), nats.CustomInboxPrefix("_INBOX.tracer"),
		nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))...)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", *url, err)
	}
	defer svc.Close(nc)
	svc.WaitLayout(ctx, nc, func(err error) {
		log.Warn().Err(err).Msg("waiting for the bus layout; run `floe setup`")
	})
	if ctx.Err() != nil {
		return nil
	}
	if err := tracer.Run(ctx, nc, cfg, log); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

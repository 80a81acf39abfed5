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
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"floe.dev/pkg/bus/svc"
	"floe.dev/services/gateway"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	url := fs.String("nats", os.Getenv("FLOE_NATS_URL"), "NATS URL(s), comma-separated (FLOE_NATS_URL)")
	creds := fs.String("nats-creds", os.Getenv("FLOE_NATS_CREDS"), "NATS credentials file (FLOE_NATS_CREDS)")
	user := fs.String("nats-user", os.Getenv("FLOE_NATS_USER"), "NATS user (FLOE_NATS_USER); password from FLOE_NATS_PASSWORD or --nats-password-file")
	passwordFile := fs.String("nats-password-file", os.Getenv("FLOE_NATS_PASSWORD_FILE"), "file holding the NATS password (FLOE_NATS_PASSWORD_FILE)")
	level := fs.String("log-level", svc.EnvOr("FLOE_LOG_LEVEL", "info"), "debug, info, warn or error (FLOE_LOG_LEVEL)")
	home := fs.String("home", os.Getenv("FLOE_HOME"), "data root shared with the tracer and toolrunners (FLOE_HOME, required)")
	addr := fs.String("http", svc.EnvOr("FLOE_HTTP_ADDR", gateway.DefaultAddr), "listen address (FLOE_HTTP_ADDR)")
	model := fs.String("model", svc.EnvOr("FLOE_MODEL", gateway.DefaultModel), "default model of new Sessions, provider:model_id (FLOE_MODEL)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if *url == "" {
		return errors.New("--nats (or FLOE_NATS_URL) is required")
	}
	cfg := gateway.Config{Addr: *addr, Home: *home, DefaultModel: *model}
	if tok := os.Getenv("FLOE_API_TOKEN"); tok != "" {
		cfg.Tokens = map[string]string{}
		for i, t := range strings.Split(tok, ",") {
			if t = strings.TrimSpace(t); t != "" {
				cfg.Tokens[t] = "user" + strconv.Itoa(i+1)
			}
		}
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	lvl, err := zerolog.ParseLevel(*level)
	if err != nil {
		return fmt.Errorf("--log-level %q: %w", *level, err)
	}
	log := zerolog.New(os.Stderr).Level(lvl).With().Timestamp().Logger()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts, err := svc.AuthOptions(*creds, *user, *passwordFile)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(*url, append(opts, nats.Name("floe-gateway"), nats.CustomInboxPrefix("_INBOX.gateway"),
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
	if err := gateway.Run(ctx, nc, cfg, log); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

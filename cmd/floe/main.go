// Command floe is Floe's single binary: `floe run` runs one Task with an
// embedded NATS and every service in-process; `floe serve` is the
// all-in-one server; `floe engine|toolrunner|tracer|gateway` run one service
// against an external NATS; `floe replay` prints a Session's stream.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/pkg/bus"
	"floe.dev/services/engine"
	"floe.dev/services/gateway"
	"floe.dev/services/toolrunner"
	"floe.dev/services/tracer"
)

const usage = `floe — an agent harness on NATS JetStream

Usage:
  floe run [flags] "prompt"        run one Task in-process (embedded NATS) and render it
  floe serve [flags]               all-in-one server: embedded JetStream + every service + HTTP gateway
  floe engine|toolrunner|tracer|gateway --nats URL [flags]
                                   one service against an external NATS
  floe setup --nats URL [--replicas N]
                                   create or update the JetStream layout on an external NATS
  floe replay <session-id> [--from-seq N]
                                   print a Session's stream from JetStream
  floe attach <session-id> [--url URL] [--follow]
                                   render a Session live from a gateway

Run 'floe <command> -h' for a command's flags. Environment: FLOE_HOME, FLOE_NATS_URL,
FLOE_NATS_LISTEN, FLOE_HTTP_ADDR, FLOE_MODEL, FLOE_API_TOKEN, FLOE_RETRY_BASE_MS,
FLOE_RETRY_CAP_MS, FLOE_RETRY_MAX, FLOE_REQUEST_TIMEOUT_MS, OPENAI_BASE_URL,
OPENAI_API_KEY, ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY; external NATS:
FLOE_NATS_CREDS, FLOE_NATS_USER, FLOE_NATS_PASSWORD, FLOE_NATS_PASSWORD_FILE,
FLOE_REPLICAS, FLOE_SETUP.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd, args := os.Args[1], os.Args[2:]
	var code int
	var err error
	switch cmd {
	case "run":
		code, err = cmdRun(ctx, stop, args)
	case "serve":
		err = cmdServe(ctx, args)
	case "engine", "toolrunner", "tracer", "gateway":
		err = cmdService(ctx, cmd, args)
	case "replay":
		err = cmdReplay(ctx, args)
	case "attach":
		code, err = cmdAttach(ctx, args)
	case "setup":
		err = cmdSetup(ctx, args)
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "floe: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "floe %s: %v\n", cmd, err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// common holds the settings every command shares: flag beats variable
// beats default.
type common struct {
	home      string
	natsURL   string
	listen    string
	httpAddr  string
	model     string
	logLevel  string
	retention string
	maxBytes  int64
	auth      natsAuth // credentials for an external NATS (natsauth.go)
	replicas  int
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func defaultHome() string {
	if h := os.Getenv("FLOE_HOME"); h != "" {
		return h
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".floe")
	}
	return ".floe"
}

// defaultModel picks FLOE_MODEL, else a configured provider, else the demo.
func defaultModel() string {
	if m := os.Getenv("FLOE_MODEL"); m != "" {
		return m
	}
	if os.Getenv("OPENAI_API_KEY") != "" {
		return "openai:gpt-4o-mini"
	}
	if os.Getenv("ANTHROPIC_API_KEY") != "" {
		return "anthropic:claude-sonnet-4-5"
	}
	return "scripted:demo"
}

func (c *common) register(fs *flag.FlagSet, listenDefault string) {
	fs.StringVar(&c.home, "home", defaultHome(), "data root: Traces, JetStream store, Workspaces (FLOE_HOME)")
	fs.StringVar(&c.natsURL, "nats", os.Getenv("FLOE_NATS_URL"), "external NATS URL instead of the embedded server (FLOE_NATS_URL)")
	fs.StringVar(&c.listen, "nats-listen", env("FLOE_NATS_LISTEN", listenDefault), "embedded server's client listener, host:port or off (FLOE_NATS_LISTEN)")
	fs.StringVar(&c.httpAddr, "http", env("FLOE_HTTP_ADDR", "127.0.0.1:7364"), "gateway bind address (FLOE_HTTP_ADDR)")
	fs.StringVar(&c.model, "model", defaultModel(), "model reference provider:model_id (FLOE_MODEL)")
	fs.StringVar(&c.logLevel, "log-level", env("FLOE_LOG_LEVEL", "info"), "log level: debug, info, warn, error")
	fs.StringVar(&c.retention, "retention", env("FLOE_RETENTION", ""), "FLOE_SESSIONS max age, e.g. 720h (default unlimited)")
	fs.Int64Var(&c.maxBytes, "retention-bytes", envInt("FLOE_RETENTION_BYTES", 0), "FLOE_SESSIONS max bytes (default unlimited)")
	fs.IntVar(&c.replicas, "replicas", int(envInt("FLOE_REPLICAS", 0)), "replicas of every stream and bucket: 1 on one server, 3 on a cluster (FLOE_REPLICAS; default: keep the existing layout's, else 1)")
	c.auth.register(fs)
}

func envInt(name string, def int64) int64 {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
	}
	return def
}

func (c *common) busConfig() (bus.Config, error) {
	var b bus.Config
	if c.retention != "" {
		d, err := time.ParseDuration(c.retention)
		if err != nil {
			return b, fmt.Errorf("retention %q: %w", c.retention, err)
		}
		b.MaxAge = d
	}
	b.MaxBytes = c.maxBytes
	b.Replicas = c.replicas
	return b, nil
}

func (c *common) logger() zerolog.Logger {
	lvl, err := zerolog.ParseLevel(c.logLevel)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	return zerolog.New(os.Stderr).Level(lvl).With().Timestamp().Logger()
}

func engineConfig(c *common) (*engine.Config, error) {
	cfg := engine.Config{RetryMax: 5, Home: c.home}
	if err := engine.EnvConfig(&cfg); err != nil {
		return nil, err
	}
	if err := engineKnobs(&cfg); err != nil {
		return nil, err
	}
	cfg.Defaults()
	return &cfg, nil
}

func toolrunnerConfig() *toolrunner.Config {
	cfg := toolrunner.Config{}
	cfg.Defaults()
	return &cfg
}

func tracerConfig(c *common) *tracer.Config {
	return &tracer.Config{Home: c.home}
}

func gatewayConfig(c *common) (*gateway.Config, error) {
	cfg := gateway.Config{Addr: c.httpAddr, Home: c.home, DefaultModel: c.model}
	cfg.Tokens = gateway.TokensFromList(os.Getenv("FLOE_API_TOKEN"))
	return &cfg, nil
}

package svc

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// Service is one standalone service main, C its Config. Every service's
// root package has the same four (DefaultConfig, FromEnv, Flags,
// Validate; see docs/architecture.md), so a main is this struct filled
// with them and Exit.
type Service[C any] struct {
	// Name is the service's name: the flag set's, the log's and the
	// connection's (floe-<Name>, replies on _INBOX.<Name>).
	Name string
	// FromEnv reads the service's FLOE_* variables over its defaults.
	FromEnv func(getenv func(string) string) (C, error)
	// Flags binds the service's own flags to the Config's fields.
	Flags func(*C, *flag.FlagSet)
	// Prepare, if set, completes the Config after the flags are parsed and
	// before Validate: the metrics registry, the listeners to keep from
	// tools.
	Prepare func(*C, *Main)
	// Validate fills defaults and reports the first unusable setting.
	Validate func(*C) error
	// Run runs the service until ctx ends (SIGINT or SIGTERM).
	Run func(ctx context.Context, nc *nats.Conn, cfg C, log zerolog.Logger) error
}

// Main runs the service with the command-line arguments args (without the
// program name): the shared flags (NewMain), FromEnv, the service's flags
// over it, parse, Prepare, Validate, then Main.Run (connect, wait for the
// layout, run until a signal). -h or --help prints the flags and returns
// nil; a flag that does not parse is printed with the usage to stderr and
// returned.
func (s Service[C]) Main(args []string) error {
	fs := flag.NewFlagSet(s.Name, flag.ContinueOnError)
	m := NewMain(s.Name, fs)
	cfg, err := s.FromEnv(os.Getenv)
	if err != nil {
		return err
	}
	s.Flags(&cfg, fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if s.Prepare != nil {
		s.Prepare(&cfg, m)
	}
	if err := s.Validate(&cfg); err != nil {
		return err
	}
	return m.Run(func(ctx context.Context, nc *nats.Conn, log zerolog.Logger) error {
		return s.Run(ctx, nc, cfg, log)
	})
}

// Exit runs Main with os.Args and exits: status 0 when the service stopped
// on a signal (or -h), else "<name>: <error>" on stderr and status 1.
func (s Service[C]) Exit() {
	os.Exit(s.exitCode(os.Args[1:], os.Stderr))
}

func (s Service[C]) exitCode(args []string, stderr io.Writer) int {
	if err := s.Main(args); err != nil {
		fmt.Fprintln(stderr, s.Name+":", err)
		return 1
	}
	return 0
}

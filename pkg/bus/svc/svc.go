// Package svc holds what every service main shares: NATS credentials from
// flags and environment (a password never from a flag), waiting for the
// JetStream layout an admin creates, and a bounded drain on exit.
package svc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
)

// EnvOr returns the variable's value, or def when it is unset or empty.
func EnvOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// AuthOptions turns the credentials settings into connect options; the
// password comes from FLOE_NATS_PASSWORD or passwordFile, never a flag.
func AuthOptions(creds, user, passwordFile string) ([]nats.Option, error) {
	var opts []nats.Option
	if creds != "" {
		if _, err := os.Stat(creds); err != nil {
			return nil, fmt.Errorf("nats credentials: %w", err)
		}
		opts = append(opts, nats.UserCredentials(creds))
	}
	password := os.Getenv("FLOE_NATS_PASSWORD")
	if passwordFile != "" {
		b, err := os.ReadFile(passwordFile)
		if err != nil {
			return nil, fmt.Errorf("nats password file: %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	switch {
	case user != "" && creds != "":
		return nil, errors.New("give either --nats-creds or --nats-user, not both")
	case user != "" && password == "":
		return nil, fmt.Errorf("nats user %q has no password: set FLOE_NATS_PASSWORD or --nats-password-file", user)
	case user == "" && password != "":
		return nil, errors.New("a NATS password is set but no user: set FLOE_NATS_USER or --nats-user")
	case user != "":
		opts = append(opts, nats.UserInfo(user, password))
	}
	return opts, nil
}

// WaitLayout waits until the JetStream layout exists or ctx ends; waiting
// is called once with the first error, so the caller can say why it waits.
func WaitLayout(ctx context.Context, nc *nats.Conn, waiting func(error)) {
	js, err := jetstream.New(nc)
	if err != nil {
		return // only fails on invalid options; Run reports the same
	}
	for attempt := 0; ; attempt++ {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := bus.Open(octx, js)
		cancel()
		if err == nil {
			return
		}
		if attempt == 0 && waiting != nil {
			waiting(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// Close flushes what is still buffered (at most 10 s) and closes nc.
func Close(nc *nats.Conn) {
	_ = nc.Drain()
	deadline := time.Now().Add(10 * time.Second)
	for nc.IsDraining() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	nc.Close()
}

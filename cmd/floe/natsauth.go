package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/bus/embed"
	"floe.dev/pkg/bus/svc"
	"floe.dev/services/engine"
)

// natsAuth is how a process authenticates to an external NATS: a
// credentials file (JWT + NKey seed), or a user whose password comes from
// FLOE_NATS_PASSWORD or a file. A password is never a flag value: argv is
// visible to every user of the machine.
type natsAuth struct {
	creds        string
	user         string
	passwordFile string
}

func (a *natsAuth) register(fs *flag.FlagSet) {
	fs.StringVar(&a.creds, "nats-creds", a.creds, "NATS credentials file, JWT and NKey seed (FLOE_NATS_CREDS)")
	fs.StringVar(&a.user, "nats-user", a.user, "NATS user; its password comes from FLOE_NATS_PASSWORD or --nats-password-file (FLOE_NATS_USER)")
	fs.StringVar(&a.passwordFile, "nats-password-file", a.passwordFile, "file holding the NATS user's password (FLOE_NATS_PASSWORD_FILE)")
}

// options returns the connect options of the configured credentials.
func (a *natsAuth) options() ([]nats.Option, error) {
	return svc.AuthOptions(a.creds, a.user, a.passwordFile)
}

// localNATS connects to the embedded server of a `floe serve` running on
// listen with this home, as user with the password that server keeps under
// home/nats (without one, unauthenticated: FLOE_NATS_AUTH=off).
func localNATS(home, listen, user string) (*nats.Conn, error) {
	var opts []nats.Option
	b, err := os.ReadFile(embed.PasswordFile(stack.CredentialsDir(home), user))
	switch {
	case err == nil:
		opts = append(opts, nats.UserInfo(user, strings.TrimRight(string(b), "\r\n")))
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("nats password of %s: %w", user, err)
	}
	return nats.Connect("nats://"+listen, opts...)
}

// engineKnobs applies the engine settings that only deployments and fault
// tests tune: FLOE_ENGINE_ACK_WAIT_MS (how long a Task of a dead engine
// waits before another engine takes it over) and FLOE_HEARTBEAT_TIMEOUT_MS
// (how long a running tool job may be silent before its call fails as
// lost).
func engineKnobs(c *engine.Config) error {
	for _, k := range []struct {
		name string
		dst  *time.Duration
	}{
		{"FLOE_ENGINE_ACK_WAIT_MS", &c.AckWait},
		{"FLOE_HEARTBEAT_TIMEOUT_MS", &c.HeartbeatTimeout},
	} {
		v := os.Getenv(k.name)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("%s=%q: want a positive number of milliseconds", k.name, v)
		}
		*k.dst = time.Duration(n) * time.Millisecond
	}
	if c.AckWait > 0 && c.AckWait < 300*time.Millisecond {
		return fmt.Errorf("FLOE_ENGINE_ACK_WAIT_MS=%d is below 300 ms: the engine acks progress every third of it", c.AckWait.Milliseconds())
	}
	return nil
}

// envBool reads a boolean variable (1/0, true/false, yes/no, on/off).
func envBool(name string, def bool) bool {
	switch strings.ToLower(strings.TrimSpace(os.Getenv(name))) {
	case "1", "true", "yes", "on":
		return true
	case "0", "false", "no", "off":
		return false
	}
	return def
}

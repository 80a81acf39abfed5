package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/bus/embed"
	"floe.dev/pkg/bus/svc"
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

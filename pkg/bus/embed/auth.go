package embed

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// The users of an authenticated embedded server: the roles of
// deploy/nats/auth.conf. Admin may do anything (`floe setup`, the stack's
// own connection); each service role holds least privilege and receives
// replies on _INBOX.<role> only; ops is read-only inspection with the nats
// CLI; hook is a NATS hook service, which only answers floe.hook.*.
const (
	UserAdmin      = "admin"
	UserEngine     = "engine"
	UserToolrunner = "toolrunner"
	UserTracer     = "tracer"
	UserGateway    = "gateway"
	UserOps        = "ops"
	UserHook       = "hook"
)

// Users lists every user an authenticated embedded server knows.
var Users = []string{UserAdmin, UserEngine, UserToolrunner, UserTracer, UserGateway, UserOps, UserHook}

// Credentials maps each of Users to its password.
type Credentials map[string]string

// PasswordFile is where LoadCredentials keeps user's password under dir.
func PasswordFile(dir, user string) string { return filepath.Join(dir, user+".password") }

// ContextFile is where WriteContexts writes user's nats CLI context under
// dir: use it as `nats --context <absolute path> …`.
func ContextFile(dir, user string) string { return filepath.Join(dir, user+".context.json") }

// LoadCredentials reads the passwords kept under dir ($FLOE_HOME/nats),
// generating on first use the ones that are missing: 32 random hex digits
// each, one file per user, mode 0600 in a 0700 directory. Files found with
// wider permissions are narrowed, so a password is never left readable by
// other users of the machine.
func LoadCredentials(dir string) (Credentials, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("embed: credentials directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("embed: credentials directory: %w", err)
	}
	creds := Credentials{}
	for _, u := range Users {
		p := PasswordFile(dir, u)
		b, err := os.ReadFile(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			pw := make([]byte, 16)
			if _, err := rand.Read(pw); err != nil {
				return nil, fmt.Errorf("embed: generate a password: %w", err)
			}
			b = []byte(hex.EncodeToString(pw))
			// O_EXCL: two processes starting at once never overwrite
			// each other's password.
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if errors.Is(err, fs.ErrExist) {
				if b, err = os.ReadFile(p); err != nil {
					return nil, fmt.Errorf("embed: read %s: %w", p, err)
				}
				break
			}
			if err != nil {
				return nil, fmt.Errorf("embed: write %s: %w", p, err)
			}
			_, werr := f.Write(append(b, '\n'))
			if cerr := f.Close(); werr == nil {
				werr = cerr
			}
			if werr != nil {
				return nil, fmt.Errorf("embed: write %s: %w", p, werr)
			}
		case err != nil:
			return nil, fmt.Errorf("embed: read %s: %w", p, err)
		}
		if err := os.Chmod(p, 0o600); err != nil {
			return nil, fmt.Errorf("embed: %w", err)
		}
		pw := strings.TrimRight(string(b), "\r\n")
		if len(pw) < 16 {
			return nil, fmt.Errorf("embed: the password in %s is shorter than 16 characters; delete the file to get a new one", p)
		}
		creds[u] = pw
	}
	return creds, nil
}

// WriteContexts writes, for each of users, a nats CLI context (0600) that
// connects to url as that user, and returns their paths.
func WriteContexts(dir, url string, creds Credentials, users ...string) ([]string, error) {
	var paths []string
	for _, u := range users {
		pw, ok := creds[u]
		if !ok {
			return nil, fmt.Errorf("embed: no password for user %q", u)
		}
		b, err := json.MarshalIndent(map[string]string{
			"description": "Floe's embedded NATS as " + u + " (written by floe serve)",
			"url":         url, "user": u, "password": pw,
		}, "", "  ")
		if err != nil {
			return nil, err
		}
		p := ContextFile(dir, u)
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
			return nil, fmt.Errorf("embed: write %s: %w", p, err)
		}
		if err := os.Rename(tmp, p); err != nil {
			return nil, fmt.Errorf("embed: write %s: %w", p, err)
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// users builds the server's user list: the roles' permissions for their
// passwords.
func (c Credentials) users() ([]*server.User, error) {
	var users []*server.User
	for _, u := range Users {
		pw := c[u]
		if pw == "" {
			return nil, fmt.Errorf("embed: no password for user %q", u)
		}
		users = append(users, &server.User{Username: u, Password: pw, Permissions: rolePermissions(u)})
	}
	return users, nil
}

// ConnectAs opens an in-process connection as user, with its reply subjects
// under _INBOX.<user> (where its permissions allow it to receive them).
// On a server without authentication it is Connect with that inbox prefix.
func (s *Server) ConnectAs(user string, opts ...nats.Option) (*nats.Conn, error) {
	base := []nats.Option{nats.CustomInboxPrefix("_INBOX." + user)}
	if s.creds != nil {
		pw, ok := s.creds[user]
		if !ok {
			return nil, fmt.Errorf("embed: unknown user %q", user)
		}
		base = append(base, nats.UserInfo(user, pw))
	}
	return s.Connect(append(base, opts...)...)
}

// Authenticated reports whether the server requires credentials.
func (s *Server) Authenticated() bool { return s.creds != nil }

// Credentials returns the server's users and passwords (nil without
// authentication).
func (s *Server) Credentials() Credentials { return s.creds }

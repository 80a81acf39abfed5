package embed

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

func startAuthed(t *testing.T) (*Server, Credentials, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "nats")
	creds, err := LoadCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(Options{StoreDir: t.TempDir(), Listen: "127.0.0.1:0", Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s, creds, dir
}

func TestClientsWithoutCredentialsAreRejected(t *testing.T) {
	s, creds, _ := startAuthed(t)
	url := s.ClientURL()
	// The attack: any local process connects to the port and reads or
	// drives every Session.
	for name, opts := range map[string][]nats.Option{
		"no credentials":     nil,
		"wrong password":     {nats.UserInfo(UserAdmin, "guess")},
		"unknown user":       {nats.UserInfo("root", creds[UserAdmin])},
		"another's password": {nats.UserInfo(UserAdmin, creds[UserOps])},
		"token instead":      {nats.Token(creds[UserAdmin])},
	} {
		nc, err := nats.Connect(url, append(opts, nats.Timeout(5*time.Second), nats.NoReconnect())...)
		if err == nil {
			nc.Close()
			t.Errorf("%s: connected to the authenticated port", name)
		} else if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
			t.Errorf("%s: %v, want an authorization violation", name, err)
		}
	}
	// Nor in-process without credentials.
	if nc, err := nats.Connect("", nats.InProcessServer(s.ns), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Error("an in-process connection without credentials was accepted")
	}

	// ops may inspect but not drive: publishing a Task is a violation.
	violations := make(chan error, 1)
	ops, err := nats.Connect(url, nats.UserInfo(UserOps, creds[UserOps]), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case violations <- err:
		default:
		}
	}))
	if err != nil {
		t.Fatalf("ops: %v", err)
	}
	defer ops.Close()
	if err := ops.Publish("floe.task.session-x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	ops.Flush()
	select {
	case err := <-violations:
		if !errors.Is(err, nats.ErrPermissionViolation) && !strings.Contains(err.Error(), "Permissions Violation") {
			t.Errorf("ops publishing a task: %v, want a permissions violation", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("ops published a Task without a permissions violation")
	}
	// The services connect in-process as their roles; admin by default.
	for _, u := range Users {
		nc, err := s.ConnectAs(u)
		if err != nil {
			t.Errorf("ConnectAs(%s): %v", u, err)
			continue
		}
		nc.Close()
	}
	if nc, err := s.Connect(); err != nil {
		t.Errorf("Connect (admin): %v", err)
	} else {
		nc.Close()
	}
}

func TestLoadCredentialsKeepsPasswordsPrivateAndStable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nats")
	a, err := LoadCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("dir mode = %v, %v; want 0700", fi.Mode().Perm(), err)
	}
	seen := map[string]bool{}
	for _, u := range Users {
		fi, err := os.Stat(PasswordFile(dir, u))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v; want 0600", u, fi.Mode().Perm(), err)
		}
		if len(a[u]) < 32 || seen[a[u]] {
			t.Errorf("%s: password %q is short or shared", u, a[u])
		}
		seen[a[u]] = true
	}
	os.Chmod(PasswordFile(dir, UserOps), 0o644)
	b, err := LoadCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range Users {
		if a[u] != b[u] {
			t.Errorf("%s: password changed across restarts", u)
		}
	}
	if fi, _ := os.Stat(PasswordFile(dir, UserOps)); fi.Mode().Perm() != 0o600 {
		t.Errorf("a widened password file stayed %v", fi.Mode().Perm())
	}
	paths, err := WriteContexts(dir, "nats://127.0.0.1:4222", b, UserOps)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(paths[0]); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("context file mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
}

func TestNonLoopbackListenerWithoutAuthIsRefused(t *testing.T) {
	for _, l := range []string{"0.0.0.0:0", ":0", "[::]:0", "192.0.2.1:4222"} {
		if s, err := Start(Options{StoreDir: t.TempDir(), Listen: l}); !errors.Is(err, ErrOpenListener) {
			if s != nil {
				s.Shutdown()
			}
			t.Errorf("Start(Listen %s, no auth) = %v, want ErrOpenListener", l, err)
		}
	}
	s, err := Start(Options{StoreDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("loopback without auth: %v", err)
	}
	s.Shutdown()
}

// The embedded server's roles are deploy/nats/auth.conf's, permission for
// permission.
func TestRolesMatchDeployAuthConf(t *testing.T) {
	for _, u := range Users {
		t.Setenv("FLOE_"+strings.ToUpper(u)+"_PASSWORD", "pw-"+u)
	}
	opts, err := server.ProcessConfigFile(filepath.Join("..", "..", "..", "deploy", "nats", "auth.conf"))
	if err != nil {
		t.Fatal(err)
	}
	conf := map[string]*server.Permissions{}
	for _, u := range opts.Users {
		conf[u.Username] = u.Permissions
	}
	if len(conf) != len(Users) {
		t.Errorf("auth.conf users %v, embedded users %v", slices.Sorted(maps.Keys(conf)), Users)
	}
	for _, u := range Users {
		want, got := conf[u], rolePermissions(u)
		if !samePerms(want, got) {
			t.Errorf("%s: embedded permissions differ from auth.conf:\n got %s\nwant %s", u, permString(got), permString(want))
		}
	}
}

func samePerms(a, b *server.Permissions) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return sameSubjects(a.Publish, b.Publish) && sameSubjects(a.Subscribe, b.Subscribe) &&
		(a.Response == nil) == (b.Response == nil) && (a.Response == nil || *a.Response == *b.Response)
}

func sameSubjects(a, b *server.SubjectPermission) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return slices.Equal(slices.Sorted(slices.Values(a.Allow)), slices.Sorted(slices.Values(b.Allow))) &&
		slices.Equal(slices.Sorted(slices.Values(a.Deny)), slices.Sorted(slices.Values(b.Deny)))
}

func permString(p *server.Permissions) string {
	if p == nil {
		return "<all>"
	}
	s := func(sp *server.SubjectPermission) string {
		if sp == nil {
			return "-"
		}
		return "allow " + strings.Join(sp.Allow, " ") + " deny " + strings.Join(sp.Deny, " ")
	}
	return "pub[" + s(p.Publish) + "] sub[" + s(p.Subscribe) + "]" + map[bool]string{true: " responses", false: ""}[p.Response != nil]
}

// The engine asks a NATS hook service on floe.hook.<point> (protocol.md §7
// "Hooks"): with the roles on, its request must reach a service and come
// back. Without the permission the publish was a silent violation, so
// every NATS hook under `floe serve` timed out (10 s) as "hook failed".
// The service runs as the hook user, which may answer and nothing more.
func TestEngineReachesANATSHookService(t *testing.T) {
	s, creds, _ := startAuthed(t)
	// The hook user: a hook service of the deployment.
	violations := make(chan string, 16)
	svc, err := nats.Connect(s.ClientURL(), nats.UserInfo(UserHook, creds[UserHook]),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case violations <- err.Error():
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	if _, err := svc.QueueSubscribe("floe.hook.pre_tool_use", "policy", func(m *nats.Msg) {
		m.Respond([]byte(`{"decision":"deny","reason":"` + m.Header.Get("Floe-Hook-Name") + `"}`))
	}); err != nil {
		t.Fatal(err)
	}
	if err := svc.Flush(); err != nil {
		t.Fatal(err)
	}
	eng, err := s.ConnectAs(UserEngine)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	m := nats.NewMsg("floe.hook.pre_tool_use")
	m.Header.Set("Floe-Hook-Name", "policy")
	m.Data = []byte(`{"hook":"pre_tool_use"}`)
	reply, err := eng.RequestMsg(m, 10*time.Second)
	if err != nil {
		t.Fatalf("engine's hook request: %v", err)
	}
	if got := string(reply.Data); got != `{"decision":"deny","reason":"policy"}` {
		t.Fatalf("hook answer %q", got)
	}

	// Least privilege: the hook user answers hook requests and does
	// nothing else. Each attempt is a permissions violation naming its
	// subject; the answer above still went through (a reply).
	for _, a := range []struct{ verb, subject string }{
		{"publish", "floe.task.session-x"},
		{"publish", "floe.session.session-x.model"},
		{"publish", "floe.ctl.session-x.abort"},
		{"publish", "floe.hook.pre_tool_use"},
		{"publish", "$JS.API.STREAM.INFO.FLOE_SESSIONS"},
		{"publish", "$KV.floe_sessions.session-x"},
		{"subscribe", "floe.session.>"},
		{"subscribe", "floe.ctl.*.*"},
		{"subscribe", "_INBOX.engine.>"},
		{"subscribe", "$JS.API.>"},
	} {
		var err error
		if a.verb == "subscribe" {
			_, err = svc.Subscribe(a.subject, func(*nats.Msg) {})
		} else {
			err = svc.Publish(a.subject, []byte("forged"))
		}
		if err != nil {
			t.Fatal(err)
		}
		svc.Flush()
		select {
		case v := <-violations:
			if !strings.Contains(v, "Permissions Violation") || !strings.Contains(v, a.subject) {
				t.Errorf("hook user: %s %s: %s, want a permissions violation on it", a.verb, a.subject, v)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("hook user: %s %s: no permissions violation", a.verb, a.subject)
		}
	}
}

package gateway_test

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

// createErr creates a Session and returns the API error (nil on 201).
func createErr(t *testing.T, c *client.Client, req client.CreateSession) (*client.Session, error) {
	t.Helper()
	return c.CreateSession(ctxT(t), req)
}

func TestWorkspaceOutsideTheRootsIsRefused(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g := startGateway(t, env, "", nil)
	root := filepath.Join(g.Home, "workspaces")
	outside := t.TempDir() // not under Home, nor the user's home
	if err := os.MkdirAll(filepath.Join(root, "ok"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "link-out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "ok"), filepath.Join(root, "link-in")); err != nil {
		t.Fatal(err)
	}
	for _, ws := range []string{
		"/",
		"/etc",
		outside,
		filepath.Join(root, "link-out"), // a link inside a root to outside
		filepath.Join(root, "..", "..", "..", ".."), // climbs out
		filepath.Join(outside, "new"),               // would be created outside
		filepath.Join(root, "missing"),              // inside, but never created
		"relative/dir",
	} {
		_, err := createErr(t, g.Alice, client.CreateSession{Workspace: ws})
		if !client.IsCode(err, omni.CodeBadRequest) {
			t.Errorf("workspace %q: %v, want 400 bad_request", ws, err)
		}
	}
	for _, p := range []string{filepath.Join(outside, "new"), filepath.Join(root, "missing")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s was created (%v); the gateway creates only default Workspaces", p, err)
		}
	}
	s, err := createErr(t, g.Alice, client.CreateSession{Workspace: filepath.Join(root, "link-in")})
	if err != nil || s.Workspace != filepath.Join(root, "ok") {
		t.Errorf("workspace through a link inside the root = %+v, %v; want its resolved path", s, err)
	}

	// Configured roots replace the defaults, and "/" is never a root.
	g2 := startGateway(t, env, "", func(c *gateway.Config) { c.WorkspaceRoots = []string{outside} })
	if _, err := createErr(t, g2.Alice, client.CreateSession{Workspace: outside}); err != nil {
		t.Errorf("workspace = a configured root: %v", err)
	}
	if _, err := createErr(t, g2.Alice, client.CreateSession{Workspace: filepath.Join(g2.Home, "workspaces")}); !client.IsCode(err, omni.CodeBadRequest) {
		t.Errorf("workspace under the replaced default root: %v, want 400", err)
	}
	cfg := testConfig(t.TempDir())
	cfg.WorkspaceRoots = []string{"/"}
	if err := cfg.Validate(); err == nil {
		t.Error(`Validate accepted the workspace root "/"`)
	}
}

func TestScriptedModelIsNotAFileReadPrimitive(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	scripts := t.TempDir()
	good := filepath.Join(scripts, "good.json")
	if err := os.WriteFile(good, []byte(`{"requests":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(scripts, "fifo.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(scripts, "big.json")
	if f, err := os.Create(big); err != nil {
		t.Fatal(err)
	} else {
		f.Truncate(2 << 30) // sparse
		f.Close()
	}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("root:SECRETHASH\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(scripts, "link.json")); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, env, "", func(c *gateway.Config) { c.ScriptsDir = scripts })
	for _, model := range []string{
		"scripted:/dev/zero",
		"scripted:" + fifo,
		"scripted:fifo.json",
		"scripted:/etc/shadow",
		"scripted:" + secret,
		"scripted:link.json", // a link in the directory to outside
		"scripted:../" + filepath.Base(filepath.Dir(secret)) + "/secret",
		"scripted:" + big,
		"scripted:missing.json",
	} {
		_, err := createErr(t, g.Alice, client.CreateSession{Model: model})
		if !client.IsCode(err, omni.CodeBadRequest) {
			t.Errorf("model %q: %v, want 400 bad_request", model, err)
		} else if strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), "root:") {
			t.Errorf("model %q: error %q echoes the file", model, err)
		}
	}
	for model, want := range map[string]string{"scripted:demo": "scripted:demo", "scripted:good.json": "scripted:" + good, "scripted:" + good: "scripted:" + good} {
		s, err := createErr(t, g.Alice, client.CreateSession{Model: model})
		if err != nil || s.Model != want {
			t.Errorf("model %q = %+v, %v; want 201 with model %q", model, s, err, want)
		}
	}

	// Without FLOE_SCRIPTS_DIR only the demo plays.
	g2 := startGateway(t, env, "", nil)
	if _, err := createErr(t, g2.Alice, client.CreateSession{Model: "scripted:" + good}); !client.IsCode(err, omni.CodeBadRequest) {
		t.Errorf("script without a scripts directory: %v, want 400", err)
	}
	if _, err := createErr(t, g2.Alice, client.CreateSession{Model: "scripted:demo"}); err != nil {
		t.Errorf("scripted:demo without a scripts directory: %v", err)
	}
}

func TestStalledRequestsAreCutOff(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	nc := bustest.Connect(t, env.Server)
	addr := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	logs := &bustest.Buffer{}
	go func() {
		done <- gateway.Run(ctx, nc, gateway.Config{Addr: addr, Home: t.TempDir(), Tokens: map[string]string{aliceToken: "alice"},
			ReadHeaderTimeout: 300 * time.Millisecond, ReadBodyTimeout: 300 * time.Millisecond}, zerolog.New(logs).Level(zerolog.DebugLevel))
	}()
	t.Cleanup(func() { cancel(); <-done })
	c := client.New("http://"+addr, client.WithToken(aliceToken))
	eventually(t, "gateway up", func() bool { return c.Health(context.Background()) == nil })

	// answer sends what and then stalls; it returns what the server sent
	// until it closed the connection.
	answer := func(what string) string {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, what); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(waitLimit)) // the test's bound, not the server's
		b, err := io.ReadAll(conn)
		if err != nil {
			t.Fatalf("after %q the server kept the stalled connection open: %v; got %q", what, err, b)
		}
		return string(b)
	}
	if got := answer("POST /api/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: app"); strings.Contains(got, " 201 ") {
		t.Errorf("stalled headers answered %q", got)
	}
	got := answer("POST /api/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + aliceToken +
		"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"title\":\"")
	if !strings.HasPrefix(got, "HTTP/1.1 408 ") || !strings.Contains(got, omni.CodeRequestTimeout) {
		t.Errorf("stalled body answered %q, want 408 %s", got, omni.CodeRequestTimeout)
	}
	// A client that hangs up mid-body.
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(conn, "POST /api/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "+aliceToken+
		"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"title\":\"")
	conn.Close()

	if list, err := c.ListSessions(ctxT(t)); err != nil || len(list) != 0 {
		t.Errorf("sessions after stalled requests = %v, %v; want none", list, err)
	}
	eventually(t, "the disconnects logged", func() bool { return strings.Count(logs.String(), "client disconnected") >= 2 })
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"level":"error"`) || strings.Contains(line, `"level":"warn"`) {
			t.Errorf("a client's disconnect logged above debug: %s", line)
		}
	}
}

func TestPromptOverTheBusLimitIs413BeforeQueueing(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	g := startGateway(t, env, "", nil)
	ctx := ctxT(t)
	s := createSession(t, g.Alice, client.CreateSession{})
	// The body fits the 8 MiB cap; the prompt message the engine would
	// publish (envelope and escaping added) does not fit the bus's 8 MiB.
	body := `{"input":[{"type":"text","text":"` + strings.Repeat("a", gateway.DefaultMaxBody-100) + `"}]}`
	if len(body) > gateway.DefaultMaxBody {
		t.Fatal("test body over the cap")
	}
	status, code := raw(t, "POST", g.URL+"/api/sessions/"+s.ID+"/tasks", aliceToken, "application/json", []byte(body))
	if status != 413 || code != omni.CodeTooLarge {
		t.Errorf("huge prompt = %d %s, want 413 %s", status, code, omni.CodeTooLarge)
	}
	// Escaping counts: 1.5 MiB of control characters is 9 MiB of JSON.
	body = `{"input":[{"type":"text","text":"` + strings.Repeat(`\u0001`, 1<<20+512<<10) + `"}]}`
	if status, code := raw(t, "POST", g.URL+"/api/sessions/"+s.ID+"/tasks", aliceToken, "application/json", []byte(body)); status != 413 {
		t.Errorf("prompt that grows when escaped = %d %s, want 413", status, code)
	}
	got, err := g.Alice.GetSession(ctx, s.ID)
	if err != nil || got.State != omni.StateIdle {
		t.Errorf("session after 413 = %+v, %v; want idle", got, err)
	}
	st, err := env.JS.Stream(ctx, omni.TasksStream)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Errorf("tasks queued after 413: %+v, %v", info, err)
	}
	// A large prompt that fits is accepted. Its own deadline: under -race
	// on a busy machine the two 8 MiB bodies above can take most of ctx's
	// 20 s, and this is not a timing test.
	bigCtx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := g.Alice.SubmitTask(bigCtx, s.ID, client.TaskRequest{Input: []client.InputPart{{Type: client.InputText, Text: strings.Repeat("b", 4<<20)}}}); err != nil {
		t.Errorf("4 MiB prompt: %v, want 202", err)
	}
}

package protoe2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"floe.dev/cmd/floe/internal/proctest"
	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/bus"
	"floe.dev/services/engine"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
	"floe.dev/services/toolrunner"
	"floe.dev/services/tracer"
)

// waitLimit bounds each wait of the harness; the node tests bound their own.
const waitLimit = 45 * time.Second

const token = "tok-protocols-e2e"

// clientsDir returns the node_modules holding the stock clients.
func clientsDir(t *testing.T) string {
	t.Helper()
	dir, set := os.LookupEnv("FLOE_PROTOCOL_CLIENTS")
	if !set {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "floe-npm", "protocols")
	}
	mods := filepath.Join(dir, "node_modules")
	for _, pkg := range []string{"@ag-ui/client", "@a2a-js/sdk"} {
		if _, err := os.Stat(filepath.Join(mods, pkg, "package.json")); err != nil {
			if set {
				t.Fatalf("FLOE_PROTOCOL_CLIENTS=%s: %s is not installed there (scripts/test installs it)", dir, pkg)
			}
			t.Skipf("the stock clients are not installed (%v): run scripts/test, or npm install --prefix %s @ag-ui/client@1.0.0 @a2a-js/sdk@1.3.0", err, dir)
		}
	}
	return mods
}

// replica is one more gateway on the stack's bus, run as `floe gateway`
// runs it, with its own NATS connection.
type replica struct {
	addr   string
	cancel context.CancelFunc
	done   chan error
	nc     *nats.Conn
}

func startReplica(t *testing.T, st *stack.Stack, cfg gateway.Config) (*replica, error) {
	nc, err := st.Server.Connect(nats.Name("floe-gateway-replica"))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &replica{addr: cfg.Addr, cancel: cancel, done: make(chan error, 1), nc: nc}
	go func() { g.done <- gateway.Run(ctx, nc, cfg, zerolog.Nop()) }()
	if err := waitHealthy("http://"+cfg.Addr, g.done); err != nil {
		cancel()
		nc.Close()
		return nil, err
	}
	return g, nil
}

func (g *replica) stop() {
	if g == nil || g.cancel == nil {
		return
	}
	g.cancel()
	g.cancel = nil
	select {
	case <-g.done:
	case <-time.After(waitLimit):
		panic("gateway replica did not stop")
	}
	g.nc.Close()
}

func waitHealthy(url string, done <-chan error) error {
	c := client.New(url, client.WithHTTPClient(&http.Client{Timeout: 2 * time.Second}))
	deadline := time.Now().Add(waitLimit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := c.Health(ctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case err := <-done:
			return fmt.Errorf("gateway stopped: %w", err)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not healthy: %w", url, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// slowScript streams a long text slowly, then a tool call, then an answer:
// long enough to cut a connection or cancel mid-run.
func slowScript() any {
	return map[string]any{
		"requests": []any{
			map[string]any{"steps": []any{
				map[string]any{"text": strings.Repeat("Floe streams this answer slowly. ", 12), "chunks": 30, "delay_ms": 60},
				map[string]any{"tool_call": map[string]any{"name": "exec_command", "id": "call_slow",
					"arguments": map[string]any{"description": "say hi", "cmd": "echo hi"}}},
			}},
			map[string]any{"steps": []any{map[string]any{"text": "The command said hi. Done.", "chunks": 6, "delay_ms": 40}}},
		},
		"after_last": "final_text",
		"final_text": "Nothing more to say.",
	}
}

// subagentScript delegates to a subagent. The scripted model counts
// requests per Session, so parent and child play the same entries: entry 0
// asks for a subagent (the child's own attempt hits the depth limit), entry
// 1 answers.
func subagentScript() any {
	return map[string]any{"requests": []any{
		map[string]any{"steps": []any{
			map[string]any{"thinking": "Delegate."},
			map[string]any{"tool_call": map[string]any{"name": "run_subagent", "id": "sub",
				"arguments": map[string]any{"description": "helper", "prompt": "count the files"}}},
		}},
		map[string]any{"steps": []any{map[string]any{"text": "There are no files.", "chunks": 3}}},
	}}
}

// env is a whole Floe with two gateway replicas, A (the stack's) and B,
// on one embedded nats-server.
type env struct {
	a, b     string // base URLs
	slow     string // the slow script's model reference
	subagent string // the subagent script's model reference
	ctl      string // POST ctl+"/restart-b" restarts replica B
	restarts func() int
}

func start(t *testing.T) *env {
	var err error
	home := t.TempDir()
	t.Setenv("HOME", home) // the tools' login shell loads no profile of the machine
	ws := filepath.Join(home, "ws")
	scripts := t.TempDir()
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	slow := filepath.Join(scripts, "slow.json")
	b, _ := json.Marshal(slowScript())
	if err := os.WriteFile(slow, b, 0o644); err != nil {
		t.Fatal(err)
	}

	sub := filepath.Join(scripts, "subagent.json")
	b, _ = json.Marshal(subagentScript())
	if err := os.WriteFile(sub, b, 0o644); err != nil {
		t.Fatal(err)
	}

	eng := engine.Config{RetryMax: 5, RetryBase: 20 * time.Millisecond, RetryCap: 100 * time.Millisecond, HeartbeatTimeout: 5 * time.Second, Home: home}
	tr := toolrunner.Config{RunnerID: "runner-0"}
	gwCfg := func(addr string) gateway.Config {
		return gateway.Config{Addr: addr, Home: home, Tokens: map[string]string{token: "e2e"}, ShutdownTimeout: 5 * time.Second,
			ScriptsDir: scripts, Heartbeat: 2 * time.Second}
	}
	var st *stack.Stack
	var addrA string
	for attempt := 0; ; attempt++ {
		addrA = proctest.FreeAddr(t)
		cfg := gwCfg(addrA)
		st, err = stack.Start(context.Background(), stack.Options{
			Home: home, Listen: "off", Bus: bus.Config{Memory: true},
			Engine: &eng, Toolrunner: &tr, Tracer: &tracer.Config{Home: home}, Gateway: &cfg,
		}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		if waitHealthy("http://"+addrA, nil) == nil {
			break
		}
		st.Stop()
		if attempt == 2 {
			t.Fatalf("the stack's gateway did not come up")
		}
	}
	t.Cleanup(st.Stop)

	var mu sync.Mutex
	var b2 *replica
	addrB := proctest.FreeAddr(t)
	if b2, err = startReplica(t, st, gwCfg(addrB)); err != nil {
		t.Fatalf("replica B: %v", err)
	}
	t.Cleanup(func() { mu.Lock(); defer mu.Unlock(); b2.stop() })
	restarts := 0
	// The node tests restart replica B through this endpoint: stop, then a
	// new gateway on the same address, answered once it is healthy.
	ctl := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/restart-b" {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		b2.stop()
		var err error
		for range 40 { // the old listener may take a moment to close
			if b2, err = startReplica(t, st, gwCfg(addrB)); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		restarts++
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(ctl.Close)

	return &env{a: "http://" + addrA, b: "http://" + addrB, slow: "scripted:" + slow, subagent: "scripted:" + sub, ctl: ctl.URL,
		restarts: func() int { mu.Lock(); defer mu.Unlock(); return restarts }}
}

func TestStockClients(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	mods := clientsDir(t)
	e := start(t)
	dir := t.TempDir()
	if err := os.Symlink(mods, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("testdata/*.test.mjs")
	if err != nil || len(files) == 0 {
		t.Fatalf("no node tests in testdata: %v", err)
	}
	var args []string
	for _, f := range append(files, "testdata/helpers.mjs") {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, filepath.Base(f))
		if err := os.WriteFile(dst, src, 0o644); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(f, ".test.mjs") {
			args = append(args, dst)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append([]string{"--test", "--test-concurrency=1", "--test-reporter=spec"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"FLOE_A="+e.a, "FLOE_B="+e.b, "FLOE_TOKEN="+token,
		"FLOE_CONTROL="+e.ctl, "FLOE_SLOW_MODEL="+e.slow, "FLOE_SUBAGENT_MODEL="+e.subagent, "SUPPRESS_TRANSFORMATION_WARNINGS=true")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("node --test:\n%s", out.String())
	if err != nil {
		t.Fatalf("the stock-client tests failed: %v", err)
	}
	if e.restarts() == 0 {
		t.Errorf("the node tests never restarted replica B")
	}
}

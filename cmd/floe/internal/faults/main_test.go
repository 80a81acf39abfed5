package faults

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"floe.dev/cmd/floe/internal/proctest"
)

// bins are the binaries TestMain builds once for every test.
var bins struct {
	floe       string // the all-in-one binary: floe engine|toolrunner|tracer|gateway|serve|setup
	natsServer string
	engine     string // services/<name>/cmd/<name>: the per-service container mains
	toolrunner string
	tracer     string
	gateway    string
}

// repoRoot is the Go workspace root (scripts/, deploy/).
var repoRoot string

// goEnv pins the Go caches of this machine for children whose HOME moves.
var goEnv []string

func TestMain(m *testing.M) {
	proctest.ExitIfShort("faults")
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	root, err := filepath.Abs(filepath.Join("..", "..", "..", ".."))
	if err != nil {
		return 0, err
	}
	repoRoot = root
	dir, err := os.MkdirTemp("", "floe-faults-bin-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	// One `go build` for every binary: it builds the packages in parallel
	// and names each binary after its package (nats-server/v2 → nats-server).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+string(filepath.Separator),
		"floe.dev/cmd/floe",
		"github.com/nats-io/nats-server/v2",
		"floe.dev/services/engine/cmd/engine",
		"floe.dev/services/toolrunner/cmd/toolrunner",
		"floe.dev/services/tracer/cmd/tracer",
		"floe.dev/services/gateway/cmd/gateway",
	)
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("go build: %v\n%s", err, out)
	}
	// Children get a HOME of their own; keep the Go caches where they are,
	// so a script that runs go (build, install) does not start cold.
	out, err := exec.CommandContext(ctx, "go", "env", "GOCACHE", "GOMODCACHE", "GOPATH").Output()
	if err != nil {
		return 0, fmt.Errorf("go env: %w", err)
	}
	for i, v := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		goEnv = append(goEnv, []string{"GOCACHE", "GOMODCACHE", "GOPATH"}[i]+"="+v)
	}
	bins.floe = filepath.Join(dir, "floe")
	bins.natsServer = filepath.Join(dir, "nats-server")
	bins.engine = filepath.Join(dir, "engine")
	bins.toolrunner = filepath.Join(dir, "toolrunner")
	bins.tracer = filepath.Join(dir, "tracer")
	bins.gateway = filepath.Join(dir, "gateway")
	for _, b := range []string{bins.floe, bins.natsServer, bins.engine, bins.toolrunner, bins.tracer, bins.gateway} {
		if _, err := os.Stat(b); err != nil {
			return 0, fmt.Errorf("built binary missing: %w", err)
		}
	}
	return m.Run(), nil
}

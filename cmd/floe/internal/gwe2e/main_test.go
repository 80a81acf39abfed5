package gwe2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// floeBin is the floe binary built once for the multi-process tests.
var floeBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "floe-gwe2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	floeBin = filepath.Join(dir, "floe")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	out, err := exec.CommandContext(ctx, "go", "build", "-o", floeBin, "floe.dev/cmd/floe").CombinedOutput()
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "go build floe: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

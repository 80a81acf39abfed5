// Package proctest holds the helpers the multi-process tests share: build
// the floe binary once, pick a free loopback address, collect a child
// process's output. Only tests import it.
package proctest

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"floe.dev/pkg/bus/bustest"
)

// ExitIfShort ends a multi-process suite's TestMain before it builds
// anything when the tests run with -short: those suites build and start
// real floe processes and take minutes on two cores. CI runs them; -short
// is for local loops.
func ExitIfShort(suite string) {
	flag.Parse()
	if testing.Short() {
		fmt.Printf("%s: skipped under -short (multi-process suite)\n", suite)
		os.Exit(0)
	}
}

// BuildFloe builds the floe binary into dir (bounded to five minutes) and
// returns its path.
func BuildFloe(dir string) (string, error) {
	bin := filepath.Join(dir, "floe")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "floe.dev/cmd/floe").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build floe: %v\n%s", err, out)
	}
	return bin, nil
}

// Buffer collects a process's output; safe for concurrent use.
type Buffer = bustest.Buffer

// FreeAddr returns a 127.0.0.1 address with a port free right now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

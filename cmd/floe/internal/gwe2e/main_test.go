package gwe2e

import (
	"fmt"
	"os"
	"testing"

	"floe.dev/cmd/floe/internal/proctest"
)

// floeBin is the floe binary built once for the multi-process tests.
var floeBin string

func TestMain(m *testing.M) {
	if os.Getenv(noLandlockEnv) != "" { // a wrapper, not the tests
		err := execWithoutLandlock(os.Args[1:])
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	proctest.ExitIfShort("gwe2e")
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "floe-gwe2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if floeBin, err = proctest.BuildFloe(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

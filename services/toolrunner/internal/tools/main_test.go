package tools

import (
	"os"
	"testing"
)

// TestMain gives exec_command's login shells an empty HOME: the machine's
// shell profile (slow, stateful, chatty) must not reach the tests.
func TestMain(m *testing.M) {
	if dir := os.Getenv(swapperEnv); dir != "" {
		swapForever(dir) // the attacker process of the confinement race test
		return
	}
	home, err := os.MkdirTemp("", "tools-home-")
	if err != nil {
		panic(err)
	}
	os.Setenv("HOME", home)
	// No goleak here yet: the sandboxes these tests open leave
	// pkg/sandbox's spawner thread and PID-namespace waiters running
	// (found by goleak.VerifyTestMain; for the sandbox's owner).
	code := m.Run()
	os.RemoveAll(home)
	os.Exit(code)
}

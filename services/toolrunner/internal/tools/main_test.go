package tools

import (
	"os"
	"testing"

	"go.uber.org/goleak"
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
	// goleak fails the package's tests when a goroutine outlives them:
	// every Sandbox a test opens is closed, the default one here.
	goleak.VerifyTestMain(closingDefault{m}, goleak.Cleanup(func(code int) {
		os.RemoveAll(home)
		os.Exit(code)
	}))
}

// closingDefault closes the default sandbox after the tests, before
// goleak looks for goroutines left running.
type closingDefault struct{ m *testing.M }

func (c closingDefault) Run() int {
	code := c.m.Run()
	closeDefaultSandbox()
	return code
}

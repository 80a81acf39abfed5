package main

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"
)

// A service StopIdle did not wait for may log after the command closed
// its log file: the line is dropped, never a "zerolog: could not write
// event" on the terminal (what failed TestChatBadInput under load).
func TestLogAfterCloseIsDropped(t *testing.T) {
	c := &common{home: t.TempDir(), logLevel: "info"}
	log, closeLog, err := c.fileLogger("test")
	if err != nil {
		t.Fatal(err)
	}
	var failed atomic.Int32
	prev := zerolog.ErrorHandler
	zerolog.ErrorHandler = func(error) { failed.Add(1) }
	t.Cleanup(func() { zerolog.ErrorHandler = prev })
	log.Info().Msg("before")
	closeLog()
	log.Info().Msg("late")
	closeLog() // twice is fine
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d failed log writes after close", n)
	}
	b, err := os.ReadFile(filepath.Join(c.home, "logs", "floe-test.log"))
	if err != nil || !strings.Contains(string(b), "before") || strings.Contains(string(b), "late") {
		t.Fatalf("log file %q (%v)", b, err)
	}
}

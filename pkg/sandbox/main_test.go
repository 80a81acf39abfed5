package sandbox

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them: every
// Sandbox a test opens is closed, and Close ends what it started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

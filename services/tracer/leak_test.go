package tracer_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them: the
// tracer's Run must wait for everything it starts.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

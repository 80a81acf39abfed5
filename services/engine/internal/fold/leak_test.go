package fold

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them:
// whoever starts a goroutine waits for it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

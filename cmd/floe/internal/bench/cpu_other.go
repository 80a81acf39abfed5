//go:build !unix

package bench

import "time"

// processCPU is 0 where getrusage is not available.
func processCPU() time.Duration { return 0 }

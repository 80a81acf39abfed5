//go:build !linux

package scripted

import "time"

// threadCPU is 0 here: ModelCPU counts nothing on this system.
func threadCPU() time.Duration { return 0 }

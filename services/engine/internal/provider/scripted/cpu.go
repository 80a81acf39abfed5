package scripted

import (
	"runtime"
	"sync/atomic"
	"time"
)

// modelCPU is the CPU time every scripted model of this process spent on
// its own token estimate (estimate), in nanoseconds.
var modelCPU atomic.Int64

// ModelCPU is the CPU time the scripted models of this process spent
// estimating the tokens of the requests they were sent: work a real
// model does on its side, which a benchmark running a scripted model in
// its own process measures with Floe's unless it subtracts this (0 where
// the thread's CPU clock is not read: see threadCPU).
func ModelCPU() time.Duration { return time.Duration(modelCPU.Load()) }

// countCPU starts counting the calling goroutine's CPU time into modelCPU
// and returns the function that stops. The goroutine stays on its thread
// meanwhile, so the thread's CPU clock is its own.
func countCPU() func() {
	runtime.LockOSThread()
	t0 := threadCPU()
	return func() {
		if t0 > 0 {
			modelCPU.Add(int64(threadCPU() - t0))
		}
		runtime.UnlockOSThread()
	}
}

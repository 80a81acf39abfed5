package scripted

import (
	"runtime"
	"sync/atomic"
	"time"
)

// modelCPU and modelTime are the CPU time and the time every scripted
// model of this process spent on its own token estimate (estimate), in
// nanoseconds.
var modelCPU, modelTime atomic.Int64

// ModelCPU is the CPU time the scripted models of this process spent
// estimating the tokens of the requests they were sent: work a real
// model does on its side, which a benchmark running a scripted model in
// its own process measures with Floe's unless it subtracts this (0 where
// the thread's CPU clock is not read: see threadCPU).
func ModelCPU() time.Duration { return time.Duration(modelCPU.Load()) }

// ModelTime is the time the same estimates took (they are on the path of
// the request: a Task waits for them).
func ModelTime() time.Duration { return time.Duration(modelTime.Load()) }

// countCPU starts counting the calling goroutine's CPU time into modelCPU
// (and the time into modelTime) and returns the function that stops. The goroutine stays on its thread
// meanwhile, so the thread's CPU clock is its own.
func countCPU() func() {
	runtime.LockOSThread()
	w0, t0 := time.Now(), threadCPU()
	return func() {
		if t0 > 0 {
			modelCPU.Add(int64(threadCPU() - t0))
		}
		modelTime.Add(int64(time.Since(w0)))
		runtime.UnlockOSThread()
	}
}

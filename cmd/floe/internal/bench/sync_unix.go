//go:build unix

package bench

import "syscall"

// syncDisks asks the kernel to write back every dirty page (sync(2)), so
// that a scenario does not pay for the writeback of the one before it.
func syncDisks() { syscall.Sync() }

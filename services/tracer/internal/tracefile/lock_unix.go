//go:build unix

package tracefile

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockFile takes an exclusive flock on path, without waiting. flock locks
// belong to the open file, so a second Store in the same process conflicts
// too, and the kernel drops the lock when a killed tracer's descriptors
// close.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("tracefile: open lock %s: %w", path, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, fmt.Errorf("tracefile: lock %s: %w", path, err)
	}
	return f, nil
}

// unlockFile releases the lock by closing its file.
func unlockFile(f *os.File) error {
	if err := f.Close(); err != nil {
		return fmt.Errorf("tracefile: release lock: %w", err)
	}
	return nil
}

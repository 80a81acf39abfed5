//go:build !unix

package tracefile

import (
	"fmt"
	"os"
)

// lockFile opens path without locking it: on systems without flock the
// operator must make sure one tracer runs per home.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("tracefile: open lock %s: %w", path, err)
	}
	return f, nil
}

// unlockFile closes the lock file.
func unlockFile(f *os.File) error {
	if err := f.Close(); err != nil {
		return fmt.Errorf("tracefile: release lock: %w", err)
	}
	return nil
}

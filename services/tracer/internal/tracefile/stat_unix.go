//go:build unix

package tracefile

import (
	"os"
	"syscall"
)

// removed reports whether the open file fi describes has been unlinked
// (deleted, or replaced by a rename over its path): it has no links left.
func removed(_ string, fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Nlink == 0
}

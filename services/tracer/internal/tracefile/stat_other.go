//go:build !unix

package tracefile

import "os"

// removed reports whether path no longer names the open file fi describes.
func removed(path string, fi os.FileInfo) bool {
	cur, err := os.Stat(path)
	return err != nil || !os.SameFile(cur, fi)
}

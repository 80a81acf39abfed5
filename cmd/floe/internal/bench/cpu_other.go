//go:build !unix

package bench

import (
	"io/fs"
	"time"
)

// processCPU is 0 where getrusage is not available.
func processCPU() time.Duration { return 0 }

// diskBytes is the file's size where its allocated blocks are not known.
func diskBytes(info fs.FileInfo) int64 { return info.Size() }

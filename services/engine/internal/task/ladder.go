package task

import (
	"context"
	"errors"
	"sync"
	"time"

	"floe.dev/pkg/bus/retry"
	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// ladder is the reconnect ladder, one for every model request of a Task:
// the agent loop's requests (Runner.request) and a compaction's
// (compactor.summarize). Attempt n counts from 1 (2 when the Task takes
// over a request a dead engine left open). An attempt that ends with a
// status that retries (anything but completed, aborted and auth) while
// n <= max is retried after base·2^(n-1), capped at cap, a wait that
// retry-now cuts short; the attempt's request_end reports that wait
// (retry_in_ms), and 0 when no retry follows. A user abort, an engine stop
// or a lost lease during the wait ends the ladder aborted.
//
// Concurrency: climb runs on the agent loop's goroutine; retryNow is
// called by the control inbox's goroutine. mu guards skip, the channel of
// the wait in progress (nil when none).
type ladder struct {
	base, cap time.Duration
	max       int
	// errMax, when above zero, is the retry bound the last attempt's
	// error set (model.Error.MaxRetries); noteErr sets it per attempt,
	// on the agent loop's goroutine like climb.
	errMax int

	mu   sync.Mutex
	skip chan struct{}
}

func newLadder(s Settings) *ladder {
	return &ladder{base: s.RetryBase, cap: s.RetryCap, max: s.RetryMax}
}

// retryIn reports whether attempt n, ended with status, is retried, and
// the wait before the retry.
func (l *ladder) retryIn(n int, status string) (time.Duration, bool) {
	switch status {
	case omni.StatusCompleted, omni.StatusAborted, omni.StatusAuth, statusShutdown:
		return 0, false
	}
	if n > l.max || l.errMax > 0 && n > l.errMax {
		return 0, false
	}
	return l.backoffFor(n), true
}

// noteErr takes the retry bound of an attempt's error (none: the
// ladder's own).
func (l *ladder) noteErr(err error) {
	l.errMax = 0
	var me *model.Error
	if errors.As(err, &me) && me.MaxRetries > 0 {
		l.errMax = me.MaxRetries
	}
}

// climb runs attempts first, first+1, … of one request until one is not
// retried: try runs attempt n and returns its status, and final when the
// attempt ends the ladder whatever its status (an answer that cannot be
// used, an abort while it waited for its calls' outputs, an engine
// stopping mid-stream). climb returns the last status and attempt number;
// the status is aborted when the wait before a retry was (actx ended).
func (l *ladder) climb(actx context.Context, first int, try func(n int) (status string, final bool)) (string, int) {
	for n := first; ; n++ {
		status, final := try(n)
		wait, retry := l.retryIn(n, status)
		if final || !retry {
			return status, n
		}
		if !l.sleep(actx, wait) {
			return omni.StatusAborted, n
		}
	}
}

// backoffFor is the wait after failed attempt n: base·2^(n-1), capped.
func (l *ladder) backoffFor(n int) time.Duration { return retry.Nth(l.base, l.cap, n) }

// sleep waits d, or less when retry-now arrives; false on abort.
func (l *ladder) sleep(actx context.Context, d time.Duration) bool {
	skip := make(chan struct{})
	l.mu.Lock()
	l.skip = skip
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.skip = nil
		l.mu.Unlock()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-skip:
	case <-actx.Done():
		return false
	}
	return true
}

// retryNow skips the current reconnect wait; false when none is running.
func (l *ladder) retryNow() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.skip == nil {
		return false
	}
	close(l.skip)
	l.skip = nil
	return true
}

// waiting reports whether a wait is running (one retry-now would skip).
func (l *ladder) waiting() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.skip != nil
}

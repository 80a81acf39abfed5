package task

import (
	"context"
	"time"

	"floe.dev/pkg/omni"
)

// The reconnect ladder, one for every model request of a Task: the
// agent loop's requests (request) and a compaction's (summarize). Attempt
// n counts from 1 (2 when the Task takes over a request a dead engine left
// open). An attempt that ends with a status that retries (anything but
// completed, aborted and auth) while n <= RetryMax is retried after
// base·2^(n-1), capped at RetryCap, a wait that retry-now cuts short; the
// attempt's request_end reports that wait (retry_in_ms), and 0 when no
// retry follows. A user abort, an engine stop or a lost lease during the
// wait ends the ladder aborted.

// retryIn reports whether attempt n, ended with status, is retried, and
// the wait before the retry.
func (r *Runner) retryIn(n int, status string) (time.Duration, bool) {
	switch status {
	case omni.StatusCompleted, omni.StatusAborted, omni.StatusAuth, statusShutdown:
		return 0, false
	}
	if n > r.d.Settings.RetryMax {
		return 0, false
	}
	return r.backoffFor(n), true
}

// climb runs attempts first, first+1, … of one request until one is not
// retried: try runs attempt n and returns its status, and final when the
// attempt ends the ladder whatever its status (an answer that cannot be
// used, an abort while it waited for its calls' outputs, an engine
// stopping mid-stream). climb returns the last status and attempt number;
// the status is aborted when the wait before a retry was (actx ended).
func (r *Runner) climb(actx context.Context, first int, try func(n int) (status string, final bool)) (string, int) {
	for n := first; ; n++ {
		status, final := try(n)
		wait, retry := r.retryIn(n, status)
		if final || !retry {
			return status, n
		}
		if !r.sleepBackoff(actx, wait) {
			return omni.StatusAborted, n
		}
	}
}

// backoffFor is the wait after failed attempt n: base·2^(n-1), capped.
func (r *Runner) backoffFor(n int) time.Duration {
	d := r.d.Settings.RetryBase
	for i := 1; i < n && d < r.d.Settings.RetryCap; i++ {
		d *= 2
	}
	if d > r.d.Settings.RetryCap {
		d = r.d.Settings.RetryCap
	}
	return d
}

// sleepBackoff waits d, or less when retry-now arrives; false on abort.
func (r *Runner) sleepBackoff(actx context.Context, d time.Duration) bool {
	skip := make(chan struct{})
	r.mu.Lock()
	r.backoff = skip
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.backoff = nil
		r.mu.Unlock()
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
func (r *Runner) retryNow() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.backoff == nil {
		return false
	}
	close(r.backoff)
	r.backoff = nil
	return true
}

package task

import (
	"context"
	"testing"
	"time"

	"floe.dev/pkg/omni"
)

func testLadder() *ladder {
	return newLadder(Settings{RetryBase: 10 * time.Millisecond, RetryCap: 35 * time.Millisecond, RetryMax: 3})
}

func TestLadderRetryIn(t *testing.T) {
	l := testLadder()
	tests := []struct {
		name   string
		n      int
		status string
		wait   time.Duration
		retry  bool
	}{
		{"completed", 1, omni.StatusCompleted, 0, false},
		{"aborted", 1, omni.StatusAborted, 0, false},
		{"auth", 1, omni.StatusAuth, 0, false},
		{"shutdown", 1, statusShutdown, 0, false},
		{"first failure", 1, omni.StatusTimeout, 10 * time.Millisecond, true},
		{"doubles", 2, omni.StatusTimeout, 20 * time.Millisecond, true},
		{"capped", 3, omni.StatusTimeout, 35 * time.Millisecond, true},
		{"past max", 4, omni.StatusTimeout, 0, false},
	}
	for _, tt := range tests {
		wait, retry := l.retryIn(tt.n, tt.status)
		if wait != tt.wait || retry != tt.retry {
			t.Errorf("%s: retryIn(%d, %s) = %v, %v; want %v, %v", tt.name, tt.n, tt.status, wait, retry, tt.wait, tt.retry)
		}
	}
}

func TestLadderClimbsUntilAnAttemptIsNotRetried(t *testing.T) {
	l := testLadder()
	var tried []int
	status, n := l.climb(context.Background(), 2, func(n int) (string, bool) {
		tried = append(tried, n)
		if n < 3 {
			return omni.StatusTimeout, false
		}
		return omni.StatusCompleted, false
	})
	if status != omni.StatusCompleted || n != 3 || len(tried) != 2 || tried[0] != 2 {
		t.Fatalf("climb from 2 = %s at %d after %v; want completed at 3 after [2 3]", status, n, tried)
	}
	status, n = l.climb(context.Background(), 1, func(int) (string, bool) { return omni.StatusTimeout, true })
	if status != omni.StatusTimeout || n != 1 {
		t.Fatalf("climb with a final attempt = %s at %d; want timeout at 1", status, n)
	}
	status, n = l.climb(context.Background(), 1, func(int) (string, bool) { return omni.StatusTimeout, false })
	if status != omni.StatusTimeout || n != 4 {
		t.Fatalf("climb always failing = %s at %d; want timeout at 4 (RetryMax 3)", status, n)
	}
}

func TestLadderRetryNowCutsTheWaitShort(t *testing.T) {
	l := newLadder(Settings{RetryBase: time.Hour, RetryCap: time.Hour, RetryMax: 1})
	if l.retryNow() {
		t.Fatal("retryNow with no wait running = true")
	}
	done := make(chan bool)
	go func() { done <- l.sleep(context.Background(), time.Hour) }()
	deadline := time.Now().Add(10 * time.Second)
	for !l.retryNow() {
		if time.Now().After(deadline) {
			t.Fatal("the wait never became skippable")
		}
		time.Sleep(time.Millisecond)
	}
	if !<-done {
		t.Fatal("a wait cut short by retry-now reported an abort")
	}
}

func TestLadderAbortDuringTheWaitEndsAborted(t *testing.T) {
	l := newLadder(Settings{RetryBase: time.Hour, RetryCap: time.Hour, RetryMax: 5})
	ctx, cancel := context.WithCancel(context.Background())
	tries := 0
	go func() {
		for !l.waiting() {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	status, n := l.climb(ctx, 1, func(int) (string, bool) { tries++; return omni.StatusTimeout, false })
	if status != omni.StatusAborted || n != 1 || tries != 1 {
		t.Fatalf("climb aborted in its wait = %s at %d after %d tries; want aborted at 1 after 1", status, n, tries)
	}
}

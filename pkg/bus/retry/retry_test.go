package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestNthDoublesUpToTheCap(t *testing.T) {
	tests := []struct {
		first, most time.Duration
		n           int
		want        time.Duration
	}{
		{20 * time.Millisecond, 80 * time.Millisecond, 1, 20 * time.Millisecond},
		{20 * time.Millisecond, 80 * time.Millisecond, 2, 40 * time.Millisecond},
		{20 * time.Millisecond, 80 * time.Millisecond, 3, 80 * time.Millisecond},
		{20 * time.Millisecond, 80 * time.Millisecond, 9, 80 * time.Millisecond},
		{10 * time.Millisecond, 35 * time.Millisecond, 3, 35 * time.Millisecond},
		{2 * time.Second, 30 * time.Second, 5, 30 * time.Second},
		{2 * time.Second, 30 * time.Second, 4, 16 * time.Second},
		{time.Second, 500 * time.Millisecond, 1, 500 * time.Millisecond}, // first above the cap
		{0, time.Second, 3, 0},
	}
	for _, tt := range tests {
		if got := Nth(tt.first, tt.most, tt.n); got != tt.want {
			t.Errorf("Nth(%v, %v, %d) = %v, want %v", tt.first, tt.most, tt.n, got, tt.want)
		}
	}
}

func TestDoRetriesUntilSuccess(t *testing.T) {
	tries := 0
	var waits []time.Duration
	got, err := Do(context.Background(), Exponential(time.Millisecond, 4*time.Millisecond), time.Minute, func() (int, error) {
		tries++
		if tries < 4 {
			return 0, errors.New("not yet")
		}
		return 42, nil
	}, func(_ error, d time.Duration) { waits = append(waits, d) })
	if got != 42 || err != nil || tries != 4 {
		t.Fatalf("Do = %d, %v after %d tries; want 42, nil after 4", got, err, tries)
	}
	want := []time.Duration{time.Millisecond, 2 * time.Millisecond, 4 * time.Millisecond}
	if len(waits) != len(want) || waits[0] != want[0] || waits[1] != want[1] || waits[2] != want[2] {
		t.Fatalf("waits %v, want %v", waits, want)
	}
}

func TestDoStopsOnPermanentErrors(t *testing.T) {
	refused := errors.New("refused")
	tries := 0
	_, err := Do(context.Background(), Exponential(time.Millisecond, time.Millisecond), 0, func() (int, error) {
		tries++
		return 0, Permanent(refused)
	}, nil)
	if err != refused || tries != 1 {
		t.Fatalf("Do = %v after %d tries; want the permanent error after 1", err, tries)
	}
}

func TestDoGivesUpAfterWithin(t *testing.T) {
	fail := errors.New("down")
	start := time.Now()
	tries := 0
	_, err := Do(context.Background(), Exponential(5*time.Millisecond, 5*time.Millisecond), 30*time.Millisecond, func() (int, error) {
		tries++
		return 0, fail
	}, nil)
	if err != fail || tries < 2 || time.Since(start) > 10*time.Second {
		t.Fatalf("Do = %v after %d tries; want the last error after a few", err, tries)
	}
}

func TestDoEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	tries := 0
	got, err := Do(ctx, Constant(time.Hour), 0, func() (int, error) {
		tries++
		cancel(errors.New("aborted by user"))
		return 7, errors.New("not yet")
	}, nil)
	if !errors.Is(err, context.Canceled) || got != 7 || tries != 1 {
		t.Fatalf("Do = %d, %v after %d tries; want 7, context.Canceled after 1", got, err, tries)
	}
}

func TestSleepEndsWithTheContext(t *testing.T) {
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("Sleep = %v, want nil", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep with an ended ctx = %v, want context.Canceled", err)
	}
	if err := Sleep(ctx, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep(0) with an ended ctx = %v, want context.Canceled", err)
	}
	if err := Sleep(context.Background(), -time.Second); err != nil {
		t.Fatalf("Sleep(-1s) = %v, want nil", err)
	}
}

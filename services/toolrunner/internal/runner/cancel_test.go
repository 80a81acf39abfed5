package runner

import (
	"fmt"
	"testing"
	"time"
)

func TestCancelMemoryRemembersCallsAndSessions(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)
	c := newCancelMemory(10*time.Minute, 100)
	c.addCall("s1", "a", t0)
	c.addSession("s2", t0)

	tests := []struct {
		name     string
		sid, id  string
		storedAt time.Time
		now      time.Time
		want     bool
	}{
		{"cancelled call", "s1", "a", t0.Add(-time.Second), t0.Add(time.Second), true},
		{"cancelled call queued later", "s1", "a", t0.Add(time.Second), t0.Add(time.Second), true},
		{"other call", "s1", "b", t0.Add(-time.Second), t0.Add(time.Second), false},
		{"same call id in another session", "s3", "a", t0.Add(-time.Second), t0.Add(time.Second), false},
		{"session job queued before the cancel", "s2", "x", t0.Add(-time.Second), t0.Add(time.Second), true},
		{"session job queued at the cancel", "s2", "x", t0, t0.Add(time.Second), true},
		{"session job queued after the cancel", "s2", "x", t0.Add(time.Millisecond), t0.Add(time.Second), false},
		{"session job without a store time", "s2", "x", time.Time{}, t0.Add(time.Second), true},
	}
	for _, tt := range tests {
		if got := c.has(tt.sid, tt.id, tt.storedAt, tt.now); got != tt.want {
			t.Errorf("%s: has(%s, %s) = %v, want %v", tt.name, tt.sid, tt.id, got, tt.want)
		}
	}

	// Forgotten after the TTL.
	later := t0.Add(11 * time.Minute)
	if c.has("s1", "a", t0, later) || c.has("s2", "x", t0, later) {
		t.Errorf("cancels remembered past their TTL")
	}
	if len(c.order) != 0 || len(c.calls) != 0 || len(c.sessions) != 0 {
		t.Errorf("memory not emptied: %d entries, %d calls, %d sessions", len(c.order), len(c.calls), len(c.sessions))
	}
}

func TestCancelMemoryIsBounded(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)
	c := newCancelMemory(time.Hour, 10)
	for i := range 25 {
		c.addCall("s", fmt.Sprint(i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	if len(c.order) != 10 || len(c.calls) != 10 {
		t.Fatalf("%d entries, %d calls, want 10", len(c.order), len(c.calls))
	}
	now := t0.Add(time.Second)
	if c.has("s", "14", t0, now) || !c.has("s", "15", t0, now) || !c.has("s", "24", t0, now) {
		t.Errorf("kept the wrong entries: want 15…24")
	}

	// Cancelling a call again keeps it for the newer cancel's lifetime.
	c = newCancelMemory(time.Minute, 10)
	c.addCall("s", "a", t0)
	c.addCall("s", "a", t0.Add(50*time.Second))
	if !c.has("s", "a", t0, t0.Add(90*time.Second)) {
		t.Errorf("re-cancelled call forgotten with its first cancel")
	}
}

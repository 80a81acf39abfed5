package omni

import (
	"testing"
)

func TestSessionCreatedRejectsOtherIDs(t *testing.T) {
	for _, id := range []string{
		"", "session-2026-11-29-20-59-59", "session-2026-11-29-20-59-59-0123ABCD", "session-2026-11-29-20-59-59-0123abc",
		"session-2026-13-29-20-59-59-0123abcd", "session-2026-11-29-25-59-59-0123abcd", "x-session-2026-11-29-20-59-59-0123abcd",
		"session-2026-11-29-20-59-59-0123abcd-", "my-session",
	} {
		if tm, ok := SessionCreated(id); ok {
			t.Errorf("SessionCreated(%q) = %v, true; want false", id, tm)
		}
	}
}

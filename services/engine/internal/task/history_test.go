package task

import (
	"testing"

	"floe.dev/pkg/omni"
)

func TestHistoryModelContextInsertsCarryOverWhereItHappened(t *testing.T) {
	h := newHistory()
	for _, text := range []string{"one", "two"} {
		m := omni.UserText(text)
		h.apply(&m)
	}
	got := h.modelContext([]omni.CarryItem{{At: 0, Text: "c0"}, {At: 1, Text: "c1"}, {At: 2, Text: "c2"}}, "extra")
	var texts []string
	for _, m := range got {
		texts = append(texts, m.Payload.Text)
	}
	want := []string{"c0", "one", "c1", "two", "c2", "extra"}
	if len(texts) != len(want) {
		t.Fatalf("modelContext = %q, want %q", texts, want)
	}
	for i := range want {
		if texts[i] != want[i] {
			t.Fatalf("modelContext = %q, want %q", texts, want)
		}
	}
	if n := len(h.messages()); n != 2 {
		t.Fatalf("messages after modelContext = %d, want 2 (carry-over is never folded)", n)
	}
	h.reset()
	if n := len(h.modelContext(nil, "")); n != 0 {
		t.Fatalf("modelContext after reset = %d messages, want 0", n)
	}
}

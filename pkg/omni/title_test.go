package omni

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestPromptTitle(t *testing.T) {
	long := strings.Repeat("word ", 30)
	tests := []struct {
		name, in, want string
	}{
		{"short", "Why is CI slow?", "Why is CI slow?"},
		{"first visible line", "\n  \n  Fix the   tracer\tplease\nand more", "Fix the tracer please"},
		{"blank", " \n\t\n", ""},
		{"control characters dropped", "a\x00b\x1bc", "abc"},
		{"cut at a word", long, strings.TrimSpace(strings.Repeat("word ", 12)) + "…"},
		{"no space to cut at", strings.Repeat("x", 80), strings.Repeat("x", 60) + "…"},
		{"runes, not bytes", strings.Repeat("é", 70), strings.Repeat("é", 60) + "…"},
	}
	for _, tt := range tests {
		got := PromptTitle(tt.in)
		if got != tt.want {
			t.Errorf("%s: PromptTitle(%q) = %q, want %q", tt.name, tt.in, got, tt.want)
		}
		if n := utf8.RuneCountInString(got); n > promptTitleLen+1 {
			t.Errorf("%s: %d runes", tt.name, n)
		}
	}
}

package anthropic

import "strings"

// DefaultContextWindow is the context window of a model the table does not
// know; every current Claude model has 200k tokens by default.
const DefaultContextWindow = 200000

// contextWindows maps model id prefixes to context windows in tokens for the
// models that differ from the default; the longest matching prefix wins.
var contextWindows = []struct {
	prefix string
	tokens int64
}{
	{"claude-2.0", 100000},
	{"claude-instant", 100000},
}

func contextWindow(modelID string) int64 {
	id := strings.ToLower(modelID)
	best, tokens := -1, int64(DefaultContextWindow)
	for _, w := range contextWindows {
		if strings.HasPrefix(id, w.prefix) && len(w.prefix) > best {
			best, tokens = len(w.prefix), w.tokens
		}
	}
	return tokens
}

package openai

import "strings"

// DefaultContextWindow is the context window of a model the table does not
// know.
const DefaultContextWindow = 128000

// contextWindows maps model id prefixes to context windows in tokens; the
// longest matching prefix wins.
var contextWindows = []struct {
	prefix string
	tokens int64
}{
	{"gpt-5", 400000},
	{"gpt-4.1", 1047576},
	{"gpt-4o", 128000},
	{"gpt-4-turbo", 128000},
	{"gpt-4", 8192},
	{"gpt-3.5-turbo", 16385},
	{"o1", 200000},
	{"o3", 200000},
	{"o4-mini", 200000},
	{"deepseek-chat", 128000},
	{"deepseek-reasoner", 128000},
}

func contextWindow(modelID string) int64 {
	id := strings.ToLower(modelID)
	if i := strings.LastIndexByte(id, '/'); i >= 0 {
		id = id[i+1:]
	}
	best, tokens := -1, int64(DefaultContextWindow)
	for _, w := range contextWindows {
		if strings.HasPrefix(id, w.prefix) && len(w.prefix) > best {
			best, tokens = len(w.prefix), w.tokens
		}
	}
	return tokens
}

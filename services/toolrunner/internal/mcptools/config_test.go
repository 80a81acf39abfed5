package mcptools

import (
	"strings"
	"testing"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"TOKEN": "t0k", "EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	tests := []struct {
		in, want, wantErr string
	}{
		{"plain", "plain", ""},
		{"Bearer ${TOKEN}", "Bearer t0k", ""},
		{"${TOKEN}${TOKEN}-x", "t0kt0k-x", ""},
		{"a${EMPTY}b", "ab", ""},
		{"$TOKEN and $ {x}", "$TOKEN and $ {x}", ""},
		{"${MISSING}", "", "${MISSING} is not set"},
		{"${TOKEN", "", "unclosed"},
		{"${}", "", "empty"},
	}
	for _, tt := range tests {
		got, err := expand(tt.in, lookup)
		switch {
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("expand(%q) error = %v, want %q", tt.in, err, tt.wantErr)
		case tt.wantErr == "" && (err != nil || got != tt.want):
			t.Errorf("expand(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestParseAcceptsBothTransports(t *testing.T) {
	c, err := Parse([]byte(`{"servers": {
		"files": {"command": "npx", "args": ["-y", "x"], "env": {"K": "${V}"}, "permission": "r", "timeout_ms": 5000},
		"remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${T}"}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Names(); strings.Join(got, ",") != "files,remote" {
		t.Errorf("Names() = %v", got)
	}
	if c.Servers["files"].Transport() != "stdio" || c.Servers["remote"].Transport() != "http" {
		t.Errorf("transports %q %q", c.Servers["files"].Transport(), c.Servers["remote"].Transport())
	}
}

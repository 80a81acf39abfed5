package gateway_test

import (
	"maps"
	"testing"

	"floe.dev/services/gateway"
)

func TestTokensFromListGivesEachTokenItsOwnPrincipal(t *testing.T) {
	tests := []struct {
		in   string
		want map[string]string
	}{
		{"", nil},
		{" , ", nil},
		{"a", map[string]string{"a": "user1"}},
		{"a, b ,,c", map[string]string{"a": "user1", "b": "user2", "c": "user4"}},
	}
	for _, tt := range tests {
		if got := gateway.TokensFromList(tt.in); !maps.Equal(got, tt.want) {
			t.Errorf("TokensFromList(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

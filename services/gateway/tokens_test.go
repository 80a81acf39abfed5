package gateway_test

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

func hashed(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return "token-" + hex.EncodeToString(sum[:6])
}

func TestTokensFromListNamesEveryPrincipalStably(t *testing.T) {
	tests := []struct {
		in   string
		want map[string]string
	}{
		{"", nil},
		{" , ", nil},
		{"alice:", nil},
		{"a", map[string]string{"a": hashed("a")}},
		{"alice:tok1,bob:tok2", map[string]string{"tok1": "alice", "tok2": "bob"}},
		{" alice : tok1 , tok3,,bob:tok2", map[string]string{"tok1": "alice", "tok2": "bob", "tok3": hashed("tok3")}},
		{"ci:t1,ci:t2", map[string]string{"t1": "ci", "t2": "ci"}},
		{"svc:with:colon", map[string]string{"with:colon": "svc"}},
		{"not a name:tok", map[string]string{"not a name:tok": hashed("not a name:tok")}},
	}
	for _, tt := range tests {
		if got := gateway.TokensFromList(tt.in); !maps.Equal(got, tt.want) {
			t.Errorf("TokensFromList(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestTokensFromListReorderingKeepsPrincipals(t *testing.T) {
	// The attack: today's positional names (user1, user2) hand alice's
	// Sessions to whoever is listed first after an edit of the list.
	for _, pair := range [][2]string{
		{"alice:tok1,bob:tok2", "bob:tok2,alice:tok1"},
		{"tokA,tokB", "tokB,tokA"},
		{"tokA,tokB", "tokB,tokC,tokA"},
	} {
		a, b := gateway.TokensFromList(pair[0]), gateway.TokensFromList(pair[1])
		for tok, p := range a {
			if q, ok := b[tok]; ok && q != p {
				t.Errorf("%q: token %s is %s, after reordering to %q it is %s", pair[0], tok, p, pair[1], q)
			}
		}
	}
}

func TestReorderedTokenListKeepsSessionOwnership(t *testing.T) {
	t.Parallel()
	env := newBus(t)
	const unnamedA, unnamedB = "tok-unnamed-a", "tok-unnamed-b"
	g := startGateway(t, env, "", func(c *gateway.Config) {
		c.Tokens = gateway.TokensFromList("alice:" + aliceToken + ",bob:" + bobToken + "," + unnamedA + "," + unnamedB)
	})
	ctx := ctxT(t)
	alice := createSession(t, g.Alice, client.CreateSession{})
	ua := client.New(g.URL, client.WithToken(unnamedA))
	ub := client.New(g.URL, client.WithToken(unnamedB))
	sa := createSession(t, ua, client.CreateSession{})

	// The operator edits the list: new order, one token dropped in between.
	g.cfg.Tokens = gateway.TokensFromList(unnamedB + ",bob:" + bobToken + ",alice:" + aliceToken + "," + unnamedA)
	g.swap(t)

	if _, err := g.Alice.GetSession(ctx, alice.ID); err != nil {
		t.Errorf("alice after reordering: %v, want her session", err)
	}
	if _, err := g.Bob.GetSession(ctx, alice.ID); !client.IsCode(err, omni.CodeNotFound) {
		t.Errorf("bob after reordering: %v, want 404 for alice's session", err)
	}
	if _, err := ua.GetSession(ctx, sa.ID); err != nil {
		t.Errorf("unnamed token A after reordering: %v, want its session", err)
	}
	if _, err := ub.GetSession(ctx, sa.ID); !client.IsCode(err, omni.CodeNotFound) {
		t.Errorf("unnamed token B after reordering: %v, want 404 for A's session", err)
	}
}

func TestClientTokenIsTheFirstEntrysToken(t *testing.T) {
	for in, want := range map[string]string{"": "", " ,alice:tok1,bob:tok2": "tok1", "bare, alice:x": "bare"} {
		if got := gateway.ClientToken(in); got != want {
			t.Errorf("ClientToken(%q) = %q, want %q", in, got, want)
		}
	}
}

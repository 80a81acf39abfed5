package wirecache

import (
	"fmt"
	"testing"

	"floe.dev/pkg/omni"
)

func msgs(n int) []*omni.Message {
	out := make([]*omni.Message, n)
	for i := range out {
		out[i] = new(omni.UserText(fmt.Sprint(i)))
	}
	return out
}

func TestLookupMatchesTheSameMessages(t *testing.T) {
	c := New(0, 0)
	ctx := msgs(4)
	c.Store("s", &Prefix{Msgs: ctx[:2], Wire: []byte(`{}`)})
	if p := c.Lookup("s", ctx); p == nil || len(p.Msgs) != 2 {
		t.Fatalf("Lookup of a context that begins with the prefix = %v, want it", p)
	}
	same := append([]*omni.Message{new(*ctx[0])}, ctx[1:]...)
	if p := c.Lookup("s", same); p == nil {
		t.Errorf("Lookup with an equal message at another address = nil, want the prefix")
	}
	other := append([]*omni.Message{new(omni.UserText("other"))}, ctx[1:]...)
	if p := c.Lookup("s", other); p != nil {
		t.Errorf("Lookup with another message first = %v, want nil", p)
	}
	if p := c.Lookup("s", ctx[:1]); p != nil {
		t.Errorf("Lookup of a context shorter than the prefix = %v, want nil", p)
	}
	if p := c.Lookup("other", ctx); p != nil {
		t.Errorf("Lookup of another Session = %v, want nil", p)
	}
	c.Store("s", nil)
	if p := c.Lookup("s", ctx); p != nil {
		t.Errorf("Lookup after Store(nil) = %v, want nil", p)
	}
	var none *Cache
	if p := none.Lookup("s", ctx); p != nil {
		t.Errorf("nil Cache Lookup = %v, want nil", p)
	}
	none.Store("s", &Prefix{})
}

func TestStoreBoundsSessionsAndBytes(t *testing.T) {
	c := New(2, 10)
	ctx := msgs(1)
	for _, sid := range []string{"a", "b", "c"} {
		c.Store(sid, &Prefix{Msgs: ctx, Wire: []byte("xx")})
	}
	if c.Lookup("a", ctx) != nil || c.Lookup("b", ctx) == nil || c.Lookup("c", ctx) == nil {
		t.Errorf("after 3 Sessions in a Cache of 2: want the oldest gone, the others kept")
	}
	c.Lookup("b", ctx) // b is now the most recently used
	c.Store("d", &Prefix{Msgs: ctx, Wire: []byte("123456789")})
	if c.Lookup("b", ctx) != nil || c.Lookup("c", ctx) != nil || c.Lookup("d", ctx) == nil {
		t.Errorf("a Prefix of 9 bytes in a Cache of 10 with 4 held: want the others gone")
	}
	c.Store("e", &Prefix{Msgs: ctx, Wire: make([]byte, 11)})
	if c.Lookup("e", ctx) != nil || c.Lookup("d", ctx) == nil {
		t.Errorf("a Prefix larger than the Cache: want it not kept and nothing else dropped")
	}
	if c.held != 9 || len(c.m) != 1 || c.order.Len() != 1 {
		t.Errorf("held %d bytes in %d entries (%d in order), want 9 in 1", c.held, len(c.m), c.order.Len())
	}
}

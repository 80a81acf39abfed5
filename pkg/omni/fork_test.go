package omni

import (
	"strings"
	"testing"
)

func TestForkMetaCarriesForkedFromAndReplacesAnOlderOne(t *testing.T) {
	parent := SessionMeta(Meta{SessionID: "session-a", Provider: "scripted", ModelID: "demo", SystemPrompt: "sys", Workspace: "/w"})
	first := ForkMeta(&parent, "session-b", ForkedFrom{SessionID: "session-a", Seq: 42})
	b := MustMarshal(&first)
	if !strings.Contains(string(b), `"forked_from":{"session_id":"session-a","seq":42}`) {
		t.Fatalf("ForkMeta = %s, want forked_from", b)
	}
	m, err := Decode(b)
	if err != nil {
		t.Fatalf("Decode(%s): %v", b, err)
	}
	if f, ok := m.Payload.ForkedFrom(); !ok || f.SessionID != "session-a" || f.Seq != 42 || f.Record != nil || m.Payload.SessionID != "session-b" || m.Payload.SystemPrompt != "sys" {
		t.Errorf("decoded fork head = %+v, forked_from %+v %v", m.Payload.Meta(), f, ok)
	}
	second := ForkMeta(&m, "session-c", ForkedFrom{SessionID: "session-b", Seq: 7})
	b = MustMarshal(&second)
	if strings.Count(string(b), "forked_from") != 1 || !strings.Contains(string(b), `"session_id":"session-b","seq":7`) {
		t.Errorf("fork of a fork = %s, want one forked_from naming session-b", b)
	}
	if _, ok := parent.Payload.ForkedFrom(); ok {
		t.Error("a plain session_meta reports forked_from")
	}
}

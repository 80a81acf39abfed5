package omni

import "testing"

func TestGuards(t *testing.T) {
	tests := []struct {
		name                                   string
		m                                      Message
		meta, event, partial, complete, nested bool
	}{
		{"session_meta", SessionMeta(Meta{SessionID: "s"}), true, false, false, false, false},
		{"text", UserText("x"), false, false, false, true, false},
		{"partial", Partial(TypeText, EventDelta, "x", "", ""), false, false, true, false, false},
		{"event", RequestBegin(), false, true, false, false, false},
		{"nested partial", Partial(TypeThinking, EventStart, "x", "", "").WithOrigin("c"), false, false, true, false, true},
	}
	for _, tc := range tests {
		m := tc.m
		got := [5]bool{m.IsSessionMeta(), m.IsEvent(), m.IsPartial(), m.IsComplete(), m.IsNested()}
		want := [5]bool{tc.meta, tc.event, tc.partial, tc.complete, tc.nested}
		if got != want {
			t.Errorf("guards(%s) = %v, want %v (meta, event, partial, complete, nested)", tc.name, got, want)
		}
	}
}

func TestPartialAndCompleteTypesMapBothWays(t *testing.T) {
	for _, c := range []string{TypeText, TypeThinking, TypeToolCall, TypeToolCallOutput} {
		p := PartialType(c)
		if !IsPartialType(p) || CompleteType(p) != c || IsPartialType(c) {
			t.Errorf("PartialType(%q) = %q, CompleteType of it = %q; want a partial that maps back", c, p, CompleteType(p))
		}
	}
	for _, typ := range []string{TypeImageURL, TypeRequestBegin, "", "partial_image"} {
		if PartialType(typ) != "" || CompleteType(typ) != "" || IsPartialType(typ) {
			t.Errorf("PartialType/CompleteType/IsPartialType(%q) found a mapping, want none", typ)
		}
	}
}

func TestContentAndSetContent(t *testing.T) {
	tests := []struct {
		typ string
		get func(*Payload) string
	}{
		{TypeText, func(p *Payload) string { return p.Text }},
		{TypePartialText, func(p *Payload) string { return p.Text }},
		{TypeThinking, func(p *Payload) string { return p.Thinking }},
		{TypePartialThinking, func(p *Payload) string { return p.Thinking }},
		{TypeToolCall, func(p *Payload) string { return p.Arguments }},
		{TypePartialToolCall, func(p *Payload) string { return p.Arguments }},
		{TypeToolCallOutput, func(p *Payload) string { return p.Output }},
		{TypePartialToolCallOutput, func(p *Payload) string { return p.Output }},
		{TypeImageURL, func(p *Payload) string { return "" }},
	}
	for _, tc := range tests {
		p := Payload{Type: tc.typ}
		p.SetContent("c")
		want := "c"
		if tc.typ == TypeImageURL {
			want = ""
		}
		if p.Content() != want || tc.get(&p) != want {
			t.Errorf("SetContent/Content(%s) = %q, want %q", tc.typ, p.Content(), want)
		}
	}
}

func TestPartialBuilderRoles(t *testing.T) {
	out := Partial(TypeToolCallOutput, EventDelta, "x", "exec", "c1")
	if out.Payload.Role != RoleUser || out.Payload.Name != "" || out.Payload.Output != "x" {
		t.Errorf("Partial(tool_call_output) = role %q name %q output %q, want user, no name, x", out.Payload.Role, out.Payload.Name, out.Payload.Output)
	}
	tc := Partial(TypeToolCall, EventStart, "{", "exec", "c1")
	if tc.Payload.Role != RoleAssistant || tc.Payload.Name != "exec" || tc.Payload.Arguments != "{" {
		t.Errorf("Partial(tool_call) = role %q name %q args %q, want assistant, exec, {", tc.Payload.Role, tc.Payload.Name, tc.Payload.Arguments)
	}
}

func TestFixedStrings(t *testing.T) {
	if got := MaxTurnsNotice(25); got != "[reached max turns (25); stopping]" {
		t.Errorf("MaxTurnsNotice(25) = %q", got)
	}
	if got := Block(TagSummary, "s"); got != "[summary]\ns\n[/summary]" {
		t.Errorf("Block(summary, s) = %q, want [summary]\\ns\\n[/summary]", got)
	}
	if got := (Usage{1, 2, 3, 4}).Add(Usage{10, 20, 30, 40}); got != (Usage{11, 22, 33, 44}) {
		t.Errorf("Usage.Add = %+v, want {11 22 33 44}", got)
	}
}

func TestWithOriginPrependsAndDoesNotShare(t *testing.T) {
	base := RequestBegin().WithOrigin("inner")
	a := base.WithOrigin("outer-a")
	b := base.WithOrigin("outer-b")
	if got := a.Origin; len(got) != 2 || got[0] != "outer-a" || got[1] != "inner" {
		t.Errorf("WithOrigin(outer-a) = %q, want [outer-a inner]", got)
	}
	if b.Origin[0] != "outer-b" || len(base.Origin) != 1 {
		t.Errorf("WithOrigin shared state: b = %q, base = %q", b.Origin, base.Origin)
	}
}

func TestMetaRoundTrip(t *testing.T) {
	meta := Meta{SessionID: "s", Provider: "p", ModelID: "m", ModelContextWindow: 9, SystemPrompt: "sp", Workspace: "/w", Source: "subagent", AgentState: "x"}
	m := SessionMeta(meta)
	if got := m.Payload.Meta(); got != meta {
		t.Errorf("SessionMeta(x).Payload.Meta() = %+v, want %+v", got, meta)
	}
}

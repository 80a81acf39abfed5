package omni

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func addAll(a *Aggregator, ms ...Message) {
	for i := range ms {
		a.Add(&ms[i])
	}
}

func TestAggregatorZeroValueIsEmpty(t *testing.T) {
	var a Aggregator
	if got := a.Open(); len(got) != 0 || a.Len() != 0 {
		t.Errorf("zero Aggregator: Open() = %v, Len() = %d; want none, 0", got, a.Len())
	}
}

func TestAggregatorFoldsStartDeltaStop(t *testing.T) {
	var a Aggregator
	addAll(&a, Partial(TypeText, EventStart, "Hel", "", ""), Partial(TypeText, EventDelta, "lo, ", "", ""), Partial(TypeText, EventDelta, "", "", ""), Partial(TypeText, EventDelta, "wörld", "", ""))
	open := a.Open()
	if len(open) != 1 || a.Len() != 1 {
		t.Fatalf("Open() = %d fragments, Len() = %d; want 1, 1", len(open), a.Len())
	}
	f := open[0]
	if f.Payload.Type != TypePartialText || f.Payload.EventType != EventStart || f.Payload.Text != "Hello, wörld" || f.Payload.Role != RoleAssistant {
		t.Errorf("Open()[0] = %s %s %q role %s, want partial_text start \"Hello, wörld\" assistant", f.Payload.Type, f.Payload.EventType, f.Payload.Text, f.Payload.Role)
	}
	if err := f.Validate(); err != nil {
		t.Errorf("Open()[0].Validate() = %v, want nil", err)
	}
	a.Add(new(Partial(TypeText, EventStop, "!", "", "")))
	if got := a.Open(); len(got) != 0 || a.Len() != 0 {
		t.Errorf("after stop: Open() = %v, Len() = %d; want none, 0", got, a.Len())
	}
}

func TestAggregatorOpenKeepsOriginAndStartOrder(t *testing.T) {
	var a Aggregator
	tc := Partial(TypeToolCall, EventStart, `{"cmd":`, "exec", "call_1").WithOrigin("s-child")
	addAll(&a,
		Partial(TypeThinking, EventStart, "hm", "", ""),
		tc,
		Partial(TypeToolCallOutput, EventStart, "out", "", "call_0"),
		Partial(TypeThinking, EventDelta, "m", "", ""),
		Partial(TypeToolCall, EventDelta, `"ls"}`, "", "call_1").WithOrigin("s-child"),
		Partial(TypeToolCall, EventDelta, `IGNORED`, "", "call_1"), // same id, other origin: no segment
	)
	open := a.Open()
	var got []string
	for _, m := range open {
		got = append(got, fmt.Sprintf("%s|%s|%s|%q", strings.Join(m.Origin, "/"), m.Payload.Type, m.Payload.ToolCallID, m.Payload.Content()))
	}
	want := []string{`|partial_thinking||"hmm"`, `s-child|partial_tool_call|call_1|"{\"cmd\":\"ls\"}"`, `|partial_tool_call_output|call_0|"out"`}
	if !slices.Equal(got, want) {
		t.Errorf("Open() = %q, want %q", got, want)
	}
	if open[1].Payload.Name != "exec" || ClassOf(&open[1]) != ClassNested {
		t.Errorf("Open()[1] name %q class %s, want exec, nested", open[1].Payload.Name, ClassOf(&open[1]))
	}
}

func TestAggregatorCompleteMessageClosesItsSegment(t *testing.T) {
	var a Aggregator
	addAll(&a,
		Partial(TypeToolCall, EventStart, "{", "exec", "call_1"),
		Partial(TypeToolCall, EventStart, "{", "exec", "call_2"),
		Partial(TypeText, EventStart, "a", "", ""),
		Partial(TypeText, EventStart, "b", "", "").WithOrigin("s-1"),
	)
	addAll(&a, ToolCall("exec", "{}", "call_1"), Text(RoleAssistant, "a"))
	var ids []string
	for _, m := range a.Open() {
		ids = append(ids, m.Payload.ToolCallID+strings.Join(m.Origin, "/"))
	}
	if want := []string{"call_2", "s-1"}; !slices.Equal(ids, want) {
		t.Errorf("after complete tool_call call_1 and text: open = %q, want %q", ids, want)
	}
}

func TestAggregatorRestartReplacesSegment(t *testing.T) {
	var a Aggregator
	addAll(&a, Partial(TypeText, EventStart, "old", "", ""), Partial(TypeThinking, EventStart, "t", "", ""), Partial(TypeText, EventStart, "new", "", ""))
	open := a.Open()
	if len(open) != 2 || open[1].Payload.Text != "new" || open[0].Payload.Type != TypePartialThinking {
		t.Errorf("Open() after restart = %v, want thinking then text \"new\"", open)
	}
}

func TestAggregatorIgnoresOrphansAndEvents(t *testing.T) {
	var a Aggregator
	addAll(&a,
		Partial(TypeText, EventDelta, "orphan", "", ""),
		Partial(TypeText, EventStop, "orphan", "", ""),
		RequestBegin(), ApprovalDecision(DecisionAllow, "call_1"),
		SessionMeta(Meta{SessionID: "s"}),
		Message{Type: KindModel, Payload: Payload{Type: TypePartialText, EventType: "bogus"}},
	)
	if a.Len() != 0 {
		t.Errorf("Len() = %d after orphans and events, want 0", a.Len())
	}
}

func TestAggregatorOriginsDoNotCollide(t *testing.T) {
	var a Aggregator
	addAll(&a,
		Partial(TypeText, EventStart, "x", "", "").WithOrigin("b").WithOrigin("a"),
		Partial(TypeText, EventStart, "y", "", "").WithOrigin("a/b"),
		Partial(TypeToolCall, EventStart, "z", "", "|text|"),
	)
	if a.Len() != 3 {
		t.Errorf("Len() = %d for origins [a b], [a/b] and a tool call, want 3 separate segments", a.Len())
	}
}

func TestAggregatorOpenDoesNotAliasState(t *testing.T) {
	var a Aggregator
	a.Add(new(Partial(TypeText, EventStart, "x", "", "").WithOrigin("s-1")))
	first := a.Open()
	first[0].Payload.Text = "changed"
	first[0].Origin[0] = "changed"
	if got := a.Open()[0]; got.Payload.Text != "x" || got.Origin[0] != "s-1" {
		t.Errorf("Open() after changing an earlier result = %q %q, want \"x\" [s-1]", got.Payload.Text, got.Origin)
	}
}

// segment is one scripted stream segment for the property test.
type segment struct {
	typ, id string
	origin  []string
	frags   []Message // start, deltas, then stop and/or complete
	whole   string
}

func randText(r *rand.Rand) string {
	const alphabet = "ab{}\"\\ \n😀é<>"
	runes := []rune(alphabet)
	var sb strings.Builder
	for range r.IntN(4) {
		sb.WriteRune(runes[r.IntN(len(runes))])
	}
	return sb.String()
}

func randSegments(r *rand.Rand) []*segment {
	types := []string{TypeText, TypeThinking, TypeToolCall, TypeToolCallOutput}
	origins := [][]string{nil, {"s-a"}, {"s-a", "s-b"}, {"s-c"}}
	seen := map[string]bool{}
	var segs []*segment
	for i := range 2 + r.IntN(4) {
		s := &segment{typ: types[r.IntN(len(types))], origin: origins[r.IntN(len(origins))]}
		if s.typ == TypeToolCall || s.typ == TypeToolCallOutput {
			s.id = fmt.Sprintf("call_%d", r.IntN(3))
		}
		key := strings.Join(s.origin, "/") + "|" + s.typ + "|" + s.id
		if seen[key] {
			s.origin = []string{fmt.Sprintf("s-%d", i)} // unique
		}
		seen[key] = true
		frag := func(ev string) Message {
			c := randText(r)
			s.whole += c
			m := Partial(s.typ, ev, c, "tool", s.id)
			for j := len(s.origin) - 1; j >= 0; j-- {
				m = m.WithOrigin(s.origin[j])
			}
			return m
		}
		s.frags = append(s.frags, frag(EventStart))
		for range r.IntN(5) {
			s.frags = append(s.frags, frag(EventDelta))
		}
		ending := r.IntN(3)
		if ending != 2 {
			s.frags = append(s.frags, frag(EventStop))
		}
		if ending != 0 {
			c := Model(Payload{Type: s.typ, Role: RoleAssistant, Name: "tool", ToolCallID: s.id})
			c.Payload.SetContent(s.whole)
			for j := len(s.origin) - 1; j >= 0; j-- {
				c = c.WithOrigin(s.origin[j])
			}
			s.frags = append(s.frags, c)
		}
		segs = append(segs, s)
	}
	return segs
}

// TestAggregatorOpenPlusRemainingDeltasEqualsComplete is the late-joiner
// property: at every cut point of a random interleaving, each open fragment's
// content followed by the contents of that segment's remaining partials
// equals the complete content.
func TestAggregatorOpenPlusRemainingDeltasEqualsComplete(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		segs := randSegments(r)
		// A random interleaving that keeps each segment's order.
		type step struct {
			seg *segment
			m   Message
		}
		var seq []step
		total := 0
		for _, s := range segs {
			total += len(s.frags)
		}
		next := make([]int, len(segs))
		for range total {
			var live []int
			for i, s := range segs {
				if next[i] < len(s.frags) {
					live = append(live, i)
				}
			}
			i := live[r.IntN(len(live))]
			seq = append(seq, step{segs[i], segs[i].frags[next[i]]})
			next[i]++
		}
		for cut := 0; cut <= len(seq); cut++ {
			var a Aggregator
			started := map[*segment]int{}
			closed := map[*segment]bool{}
			for i := range seq[:cut] {
				a.Add(&seq[i].m)
				if seq[i].m.Payload.EventType == EventStart {
					started[seq[i].seg] = i
				}
				if seq[i].m.Payload.EventType == EventStop || !seq[i].m.IsPartial() {
					closed[seq[i].seg] = true
				}
			}
			var wantOrder []*segment
			for _, s := range segs {
				if _, ok := started[s]; ok && !closed[s] {
					wantOrder = append(wantOrder, s)
				}
			}
			slices.SortFunc(wantOrder, func(x, y *segment) int { return started[x] - started[y] })
			open := a.Open()
			if len(open) != len(wantOrder) {
				t.Fatalf("trial %d cut %d: Open() = %d fragments, want %d", trial, cut, len(open), len(wantOrder))
			}
			for k, f := range open {
				s := wantOrder[k]
				if f.Payload.Type != PartialType(s.typ) || f.Payload.ToolCallID != s.id || !slices.Equal(f.Origin, s.origin) || f.Payload.EventType != EventStart {
					t.Fatalf("trial %d cut %d: Open()[%d] = %s %s %q %s, want %s start %q %q", trial, cut, k,
						f.Payload.Type, f.Payload.EventType, f.Payload.ToolCallID, f.Origin, PartialType(s.typ), s.id, s.origin)
				}
				got := f.Payload.Content()
				for _, st := range seq[cut:] {
					if st.seg == s && st.m.IsPartial() {
						got += st.m.Payload.Content()
					}
				}
				if got != s.whole {
					t.Fatalf("trial %d cut %d: Open()[%d] content + remaining deltas = %q, want %q", trial, cut, k, got, s.whole)
				}
			}
		}
	}
}

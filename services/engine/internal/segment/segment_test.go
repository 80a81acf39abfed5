package segment

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
)

// checkStream asserts the streaming discipline over emitted messages:
// segments never overlap, each is start → delta* → stop followed at once
// by its complete message, whose content equals the concatenated deltas.
// It returns the complete messages.
func checkStream(t *testing.T, msgs []omni.Message) []omni.Message {
	t.Helper()
	var open *omni.Message
	var content strings.Builder
	stopped := false
	var completes []omni.Message
	for i, m := range msgs {
		p := m.Payload
		if m.IsPartial() {
			switch p.EventType {
			case omni.EventStart:
				if open != nil {
					t.Fatalf("msg %d: start of %s while %s open", i, p.Type, open.Payload.Type)
				}
				mm := m
				open, stopped = &mm, false
				content.Reset()
			case omni.EventDelta, omni.EventStop:
				if open == nil || stopped || open.Payload.Type != p.Type || open.Payload.ToolCallID != p.ToolCallID {
					t.Fatalf("msg %d: %s %s outside its segment", i, p.Type, p.EventType)
				}
			}
			content.WriteString(p.Content())
			if p.EventType == omni.EventStop {
				stopped = true
			}
			continue
		}
		if open == nil || !stopped || omni.PartialType(p.Type) != open.Payload.Type {
			t.Fatalf("msg %d: complete %s not right after its stop", i, p.Type)
		}
		if content.String() != p.Content() {
			t.Fatalf("msg %d: deltas %q != complete %q", i, content.String(), p.Content())
		}
		if p.Type == omni.TypeToolCall && (p.Name == "" || p.ToolCallID == "") {
			t.Fatalf("msg %d: tool_call without name or id", i)
		}
		completes = append(completes, m)
		open = nil
	}
	if open != nil {
		t.Fatalf("segment %s left open", open.Payload.Type)
	}
	return completes
}

type blockSpec struct {
	typ, name, id string
	chunks        []string
}

// genScript makes random blocks and a random interleaving of their deltas,
// the way providers stream parallel tool calls.
func genScript(r *rand.Rand) ([]blockSpec, []model.Delta) {
	n := 1 + r.IntN(5)
	blocks := make([]blockSpec, n)
	types := []string{omni.TypeText, omni.TypeThinking, omni.TypeToolCall}
	for i := range blocks {
		b := blockSpec{typ: types[r.IntN(3)]}
		if b.typ == omni.TypeToolCall {
			b.name = fmt.Sprintf("tool%d", i)
			if r.IntN(3) > 0 {
				b.id = fmt.Sprintf("id%d", i)
			}
		}
		for c := r.IntN(5); c >= 0; c-- {
			b.chunks = append(b.chunks, fmt.Sprintf("<%d:%d é>", i, c))
		}
		blocks[i] = b
	}
	next := make([]int, n)
	var deltas []model.Delta
	for {
		var live []int
		for i := range blocks {
			if next[i] <= len(blocks[i].chunks) {
				live = append(live, i)
			}
		}
		if len(live) == 0 {
			return blocks, deltas
		}
		i := live[r.IntN(len(live))]
		b := blocks[i]
		d := model.Delta{Block: i, Type: b.typ}
		if next[i] < len(b.chunks) {
			d.Text = b.chunks[next[i]]
		} else {
			d.End = true
		}
		if b.typ == omni.TypeToolCall && (next[i] > 0 || r.IntN(2) == 0) {
			d.Name, d.ToolCallID = b.name, b.id
		}
		if d.End {
			d.Name, d.ToolCallID = b.name, b.id
		}
		next[i]++
		deltas = append(deltas, d)
	}
}

// Property: for generated scripts with interleaved blocks, the emitted
// stream keeps the discipline and every block's content is exact.
func TestSegmenterDisciplineProperty(t *testing.T) {
	for seed := uint64(0); seed < 500; seed++ {
		r := rand.New(rand.NewPCG(seed, seed*7+1))
		blocks, deltas := genScript(r)
		var out []omni.Message
		ids := &model.IDAllocator{}
		s := New(func(m *omni.Message) error { out = append(out, *m); return nil }, ids)
		for _, d := range deltas {
			if err := s.Add(d); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Finish(""); err != nil {
			t.Fatal(err)
		}
		completes := checkStream(t, out)
		if len(completes) != len(blocks) {
			t.Fatalf("seed %d: %d completes, want %d", seed, len(completes), len(blocks))
		}
		want := map[string]int{}
		for _, b := range blocks {
			want[b.typ+"|"+strings.Join(b.chunks, "")]++
		}
		for _, c := range completes {
			k := c.Payload.Type + "|" + c.Payload.Content()
			if want[k] == 0 {
				t.Fatalf("seed %d: unexpected complete %q", seed, k)
			}
			want[k]--
		}
	}
}

func TestSegmenterFailureClosesOpenSegments(t *testing.T) {
	var out []omni.Message
	s := New(func(m *omni.Message) error { out = append(out, *m); return nil }, &model.IDAllocator{})
	_ = s.Add(model.Delta{Block: 0, Type: omni.TypeText, Text: "partial ans"})
	_ = s.Add(model.Delta{Block: 1, Type: omni.TypeToolCall, Name: "exec_command", ToolCallID: "c1", Text: `{"cmd":`})
	if err := s.Finish(omni.StatusTimeout); err != nil {
		t.Fatal(err)
	}
	completes := checkStream(t, out)
	if len(completes) != 2 {
		t.Fatalf("%d completes, want 2", len(completes))
	}
	for _, c := range completes {
		if c.Payload.StopReason != omni.StatusTimeout {
			t.Errorf("%s stop_reason = %q, want timeout", c.Payload.Type, c.Payload.StopReason)
		}
	}
}

func TestSegmenterAssignsMissingToolCallIDs(t *testing.T) {
	var out []omni.Message
	ids := &model.IDAllocator{}
	ids.Observe("call_1")
	s := New(func(m *omni.Message) error { out = append(out, *m); return nil }, ids)
	_ = s.Add(model.Delta{Block: 0, Type: omni.TypeToolCall, Name: "read_file", Text: "{}", End: true})
	_ = s.Finish("")
	c := checkStream(t, out)
	if c[0].Payload.ToolCallID != "call_2" {
		t.Fatalf("id = %q, want call_2", c[0].Payload.ToolCallID)
	}
}

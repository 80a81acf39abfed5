package gwe2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// A late joiner's view while a Task runs, as the protocol's clients build it:
// connect SSE first and buffer, fetch /messages, drop buffered events the
// cursor covers, apply the rest. The tool's output segment is held open
// (the command waits for a file) when /messages is read, so the answer has
// a live fragment. The joined view equals the full stream: the complete
// messages are the Session's, in order, byte for byte, and every segment
// open at the cursor (fragment + later deltas) equals its complete message.
func TestMessagesWhileRunningJoinWithStream(t *testing.T) {
	e := start(t)
	ws := filepath.Join(e.ws, "messages")
	ref := script(t, obj{"requests": []any{
		obj{"steps": []any{obj{"text": "An earlier answer.", "chunks": 2}}},
		obj{"steps": []any{
			obj{"thinking": "Plan: run the tool.", "chunks": 3},
			obj{"text": "Running it now.", "chunks": 4},
			obj{"tool_call": obj{"name": "exec_command", "id": "call_gate",
				"arguments": obj{"description": "gated", "cmd": "echo first-half; while [ ! -f go.txt ]; do sleep 0.05; done; echo second-half"}}},
		}},
		obj{"expect_tool_outputs": []string{"call_gate"}, "steps": []any{obj{"text": longText("after", 40), "chunks": 20, "delay_ms": 5}}},
	}})
	sid := e.session(e.c, client.CreateSession{Model: ref, Workspace: ws})
	// An earlier Task, so the history has Trace records too.
	c := stream(t, e.c, sid, "")
	c.until("the earlier task's end", idleOf(submit(t, e.c, sid, "earlier")))
	task := submit(t, e.c, sid, "run the gated tool")
	c.until("the tool's first output", func(ev client.Event) bool {
		m, ok := msgOf(ev)
		return ok && m.Payload.Type == omni.TypePartialToolCallOutput && strings.Contains(m.Payload.Output, "first-half")
	})
	hist, err := e.c.Messages(ctxT(t), sid)
	if err != nil {
		t.Fatal(err)
	}
	if hist.Live == nil {
		t.Fatalf("/messages while running has no live part")
	}
	if err := os.WriteFile(filepath.Join(ws, "go.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c.until("the task's end", idleOf(task))

	// The client's join.
	var complete [][]byte // complete messages: history, then the stream's after the cursor
	open := map[string]*strings.Builder{}
	key := func(m *omni.Message) string {
		typ := m.Payload.Type
		if ct := omni.CompleteType(typ); ct != "" {
			typ = ct
		}
		return strings.Join(m.Origin, "/") + "|" + typ + "|" + m.Payload.ToolCallID
	}
	for _, raw := range hist.Messages {
		m, err := omni.Decode(raw)
		if err != nil {
			t.Fatalf("history message %s: %v", raw, err)
		}
		if m.Type != omni.KindSessionMeta {
			complete = append(complete, raw)
		}
	}
	gateOpen := false
	for _, raw := range hist.Live.Fragments {
		m, err := omni.Decode(raw)
		if err != nil || !m.IsPartial() || m.Payload.EventType != omni.EventStart {
			t.Fatalf("live fragment %s is not a partial start (%v)", raw, err)
		}
		b := &strings.Builder{}
		b.WriteString(m.Payload.Content())
		open[key(&m)] = b
		gateOpen = gateOpen || (m.Payload.ToolCallID == "call_gate" && strings.Contains(m.Payload.Output, "first-half"))
	}
	if !gateOpen {
		t.Fatalf("no open fragment of the gated tool's output in %s", hist.Live.Fragments)
	}
	checked := 0
	for _, ev := range c.got {
		if ev.ID == "" || ev.Event == client.EventServer || seqOf(t, ev.ID) <= cursorSeq(t, hist.Live) {
			continue
		}
		m, ok := msgOf(ev)
		if !ok {
			t.Fatalf("undecodable event %s", ev.Data)
		}
		k := key(&m)
		switch {
		case m.IsPartial():
			if m.Payload.EventType == omni.EventStart {
				open[k] = &strings.Builder{}
			}
			b := open[k]
			if b == nil {
				t.Fatalf("after the cursor, %s continues a segment the client never saw start", label(ev))
			}
			b.WriteString(m.Payload.Content())
		case m.Type == omni.KindModel:
			if b := open[k]; b != nil {
				if b.String() != m.Payload.Content() {
					t.Fatalf("segment %s joined to %q, complete message says %q", k, b.String(), m.Payload.Content())
				}
				delete(open, k)
				checked++
			}
			complete = append(complete, ev.Data)
		default:
			complete = append(complete, ev.Data)
		}
	}
	if len(open) != 0 {
		t.Fatalf("segments never completed: %v", open)
	}
	if checked < 2 { // the gated output and the second answer at least
		t.Fatalf("only %d segments joined", checked)
	}
	var want [][]byte
	for _, sm := range e.busMsgs(sid, omni.ClientClasses, untilIdle(task)) {
		if sm.Class == omni.ClassModel || sm.Class == omni.ClassEvent {
			if m, _ := omni.Decode(sm.Data); !m.IsPartial() {
				want = append(want, sm.Data)
			}
		}
	}
	if len(complete) != len(want) {
		t.Fatalf("the join has %d complete messages, the stream %d", len(complete), len(want))
	}
	for i := range want {
		if !bytes.Equal(complete[i], want[i]) {
			t.Fatalf("complete message %d: join %s, stream %s", i, complete[i], want[i])
		}
	}
}

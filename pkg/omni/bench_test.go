package omni

import (
	"encoding/json"
	"strings"
	"testing"
)

// plainMessage is the same envelope as a plain struct for encoding/json, the
// baseline the hand-written codec is measured against.
type plainMessage struct {
	Timestamp string       `json:"timestamp"`
	Type      string       `json:"type"`
	Payload   plainPayload `json:"payload"`
	Origin    []string     `json:"origin,omitempty"`
}

type plainPayload struct {
	Type       string `json:"type"`
	Role       string `json:"role,omitempty"`
	Text       string `json:"text,omitempty"`
	Output     string `json:"output,omitempty"`
	ToolCallID string `json:"tool_call_id,omitempty"`
	EventType  string `json:"event_type,omitempty"`
	StopReason string `json:"stop_reason,omitempty"`
}

func benchPartial() Message {
	m := Partial(TypeText, EventDelta, "Hello, this is a streamed delta of a few words.", "", "")
	m.Timestamp = testStamp
	return m
}

func benchToolOutput() Message {
	line := "func main() {\tfmt.Println(\"hello, <world> & co\") } // ok\n"
	out := strings.Repeat(line, 4096/len(line)+1)[:4096]
	m := ToolCallOutput("toolu_01A", out, StatusFailed)
	m.Timestamp = testStamp
	return m
}

func plainOf(m *Message) plainMessage {
	p := &m.Payload
	return plainMessage{Timestamp: m.Timestamp, Type: string(m.Type), Payload: plainPayload{
		Type: p.Type, Role: p.Role, Text: p.Text, Output: p.Output, ToolCallID: p.ToolCallID, EventType: p.EventType, StopReason: p.StopReason,
	}}
}

func benchEncode(b *testing.B, m Message) {
	b.ReportAllocs()
	b.SetBytes(int64(len(MustMarshal(&m))))
	for b.Loop() {
		if _, err := Marshal(&m); err != nil {
			b.Fatal(err)
		}
	}
}

func benchDecode(b *testing.B, m Message) {
	data := MustMarshal(&m)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	var out Message
	for b.Loop() {
		if err := Unmarshal(data, &out); err != nil {
			b.Fatal(err)
		}
	}
}

func benchEncodeJSON(b *testing.B, m Message) {
	p := plainOf(&m)
	data, _ := json.Marshal(p)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := json.Marshal(&p); err != nil {
			b.Fatal(err)
		}
	}
}

func benchDecodeJSON(b *testing.B, m Message) {
	data := MustMarshal(&m)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		var out plainMessage
		if err := json.Unmarshal(data, &out); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodePartial(b *testing.B)    { benchEncode(b, benchPartial()) }
func BenchmarkDecodePartial(b *testing.B)    { benchDecode(b, benchPartial()) }
func BenchmarkEncodeToolOutput(b *testing.B) { benchEncode(b, benchToolOutput()) }
func BenchmarkDecodeToolOutput(b *testing.B) { benchDecode(b, benchToolOutput()) }

func BenchmarkEncodePartialEncodingJSON(b *testing.B)    { benchEncodeJSON(b, benchPartial()) }
func BenchmarkDecodePartialEncodingJSON(b *testing.B)    { benchDecodeJSON(b, benchPartial()) }
func BenchmarkEncodeToolOutputEncodingJSON(b *testing.B) { benchEncodeJSON(b, benchToolOutput()) }
func BenchmarkDecodeToolOutputEncodingJSON(b *testing.B) { benchDecodeJSON(b, benchToolOutput()) }

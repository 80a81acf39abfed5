package omni

import (
	"encoding/json"
	"testing"
)

func TestMCPConnectEventsEncodeAsTheOriginalWritesThem(t *testing.T) {
	begin := MCPConnectBegin([]string{"everything", "files"})
	end := MCPConnectEnd([]MCPConnectResult{
		{Server: "everything", Transport: "stdio", Status: StatusCompleted, DurationMs: 12, Tools: 3},
		{Server: "files", Transport: "http", Status: StatusFailed, DurationMs: 5, Error: "connect: refused <x>"},
	})
	tests := []struct {
		m    Message
		want string
	}{
		{begin, `{"type":"mcp_connect_begin","servers":["everything","files"]}`},
		{end, `{"type":"mcp_connect_end","status":"failed","results":[{"server":"everything","transport":"stdio","status":"completed","duration_ms":12,"tools":3},{"server":"files","transport":"http","status":"failed","duration_ms":5,"tools":0,"error":"connect: refused <x>"}]}`},
		{MCPConnectEnd(nil), `{"type":"mcp_connect_end","status":"completed","results":[]}`},
	}
	for _, tt := range tests {
		b, err := Marshal(&tt.m)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		var env struct{ Payload json.RawMessage }
		if err := json.Unmarshal(b, &env); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if string(env.Payload) != tt.want {
			t.Errorf("payload = %s, want %s", env.Payload, tt.want)
		}
		back, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(%s): %v", b, err)
		}
		again, _ := Marshal(&back)
		if string(again) != string(b) {
			t.Errorf("round trip = %s, want %s", again, b)
		}
		if back.Payload.Type == TypeMCPConnectEnd {
			var rs []MCPConnectResult
			if err := json.Unmarshal(back.Payload.Field("results"), &rs); err != nil {
				t.Errorf("results field: %v", err)
			}
		}
	}
}

func TestToolCallOutputImages(t *testing.T) {
	m := ToolCallOutputImages("c1", "see", "", []string{"data:image/png;base64,AAAA"})
	if got := m.Payload.ImageURLs(); len(got) != 1 || got[0] != "data:image/png;base64,AAAA" {
		t.Errorf("ImageURLs() = %q", got)
	}
	if m := ToolCallOutputImages("c1", "x", "", nil); m.Payload.Images != nil {
		t.Errorf("images set without images: %s", m.Payload.Images)
	}
}

package omni

import (
	"bytes"
	"encoding/json"
	"slices"
)

// MCP connection events (protocol.md §7 "MCP servers"): a Task start reports the
// toolrunners' connections to the deployment's MCP servers, before
// tool_list_ready, as the original harness writes them.
const (
	TypeMCPConnectBegin = "mcp_connect_begin" // {servers: [name…]}
	TypeMCPConnectEnd   = "mcp_connect_end"   // {status, results: [MCPConnectResult…]}
)

// MCPConnectResult is one server's outcome in mcp_connect_end and in a tool
// runner's ToolList.
type MCPConnectResult struct {
	Server     string `json:"server" msgpack:"server"`
	Transport  string `json:"transport" msgpack:"transport"` // stdio | http
	Status     string `json:"status" msgpack:"status"`       // completed | failed
	DurationMs int64  `json:"duration_ms" msgpack:"duration_ms"`
	Tools      int    `json:"tools" msgpack:"tools"` // how many tools it offers
	Error      string `json:"error,omitempty" msgpack:"error,omitempty"`
}

// ToolList is a tool runner's answer on floe.toollist.<pool>: the union of
// its built-in and MCP tools, and how each configured MCP server connected
// (empty when none is configured). Servers names the configured MCP
// servers, sorted.
type ToolList struct {
	Runner  string             `msgpack:"runner"`
	Tools   []ToolSpec         `msgpack:"tools"`
	MCP     []MCPConnectResult `msgpack:"mcp,omitempty"`
	Servers []string           `msgpack:"servers,omitempty"`
	// Sandbox is the confinement of the answering runner's tools (protocol.md
	// §7); nil from a runner that predates it.
	Sandbox *SandboxInfo `msgpack:"sandbox,omitempty"`
}

// SandboxInfo is a runner's tool confinement in effect: Backend is
// landlock, bwrap or off; Network is on or off.
type SandboxInfo struct {
	Backend string `msgpack:"backend" json:"backend"`
	Network string `msgpack:"network" json:"network"`
}

// ToolListRequest is the optional body of a request on floe.toollist.<pool>
// (an empty body asks for everything). With ServersOnly the runner answers
// at once with Runner and Servers, connecting nothing: the engine names the
// servers in mcp_connect_begin before the connecting starts.
type ToolListRequest struct {
	ServersOnly bool `msgpack:"servers_only"`
}

// MCPConnectBegin builds mcp_connect_begin{servers}.
func MCPConnectBegin(servers []string) Message {
	if servers == nil {
		servers = []string{}
	}
	return Event(withExtra(Payload{Type: TypeMCPConnectBegin}, "servers", servers))
}

// MCPConnectEnd builds mcp_connect_end{status, results}: status is
// completed when every server connected, else failed.
func MCPConnectEnd(results []MCPConnectResult) Message {
	status := StatusCompleted
	for _, r := range results {
		if r.Status != StatusCompleted {
			status = StatusFailed
		}
	}
	if results == nil {
		results = []MCPConnectResult{}
	}
	return Event(withExtra(Payload{Type: TypeMCPConnectEnd, Status: status}, "results", results))
}

// withExtra adds a field the codec does not model, after the known ones
// that are set (type first).
func withExtra(p Payload, key string, v any) Payload {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic("omni: encode " + key + ": " + err.Error()) // only plain data is passed
	}
	// A new payloadRaw: the one p may share with its copies never changes.
	raw := &payloadRaw{}
	if p.raw != nil {
		raw.extra = slices.Clone(p.raw.extra)
		raw.usage = p.raw.usage
	}
	for i := range fields {
		if p.isSet(i) {
			raw.order = append(raw.order, fieldRef(i))
		}
	}
	for i := range raw.extra {
		raw.order = append(raw.order, extraBase+fieldRef(i))
	}
	raw.order = append(raw.order, extraBase+fieldRef(len(raw.extra)))
	raw.extra = append(raw.extra, rawField{key: `"` + key + `"`, value: bytes.TrimSpace(buf.Bytes())})
	p.raw = raw
	return p
}

// Field returns the raw JSON value of a payload field the codec does not
// model (such as mcp_connect_end's results), or nil.
func (p *Payload) Field(key string) json.RawMessage {
	if p.raw == nil {
		return nil
	}
	for _, x := range p.raw.extra {
		if x.key == `"`+key+`"` {
			return x.value
		}
	}
	return nil
}

// ToolCallOutputImages is ToolCallOutput with images (data URLs).
func ToolCallOutputImages(toolCallID, output, stopReason string, images []string) Message {
	m := ToolCallOutput(toolCallID, output, stopReason)
	if len(images) > 0 {
		raw, _ := json.Marshal(images) // strings always encode
		m.Payload.Images = raw
	}
	return m
}

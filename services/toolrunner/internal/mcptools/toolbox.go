// Package mcptools makes tools of Model Context Protocol servers (protocol.md §7
// "MCP servers"): the FLOE_MCP_CONFIG file, one connection per server and
// toolrunner (a stdio server is a child process of the runner, started on
// first need, restarted with backoff, stopped at Close), the servers' tools
// as mcp__<server>__<tool> with their input schemas, and a Toolbox that
// offers and executes them beside the built-in tools under the same rules
// (argument check, timeout, output cap, one complete result).
package mcptools

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"floe.dev/pkg/omni"
	"floe.dev/services/toolrunner/internal/tools"
)

// Source values of omni.ToolSpec.
const SourceBuiltin = "builtin"

// SourceOf returns the Source of a server's tools: "mcp:<server>".
func SourceOf(server string) string { return "mcp:" + server }

// Toolbox is the set of tools one runner offers: the built-in registry and,
// optionally, MCP servers. It is safe for concurrent use.
type Toolbox struct {
	builtin *tools.Registry
	mcp     *Manager // nil: no MCP servers
}

// NewToolbox returns a Toolbox of builtin and m's servers (m may be nil).
func NewToolbox(builtin *tools.Registry, m *Manager) *Toolbox {
	if m != nil && len(m.servers) == 0 {
		m = nil
	}
	return &Toolbox{builtin: builtin, mcp: m}
}

// List returns every tool the runner offers, built-in first, and one
// connect result per configured MCP server (none without servers).
// Listing connects the servers not yet connected.
func (b *Toolbox) List(ctx context.Context) ([]omni.ToolSpec, []omni.MCPConnectResult) {
	var specs []omni.ToolSpec
	for _, s := range b.builtin.Specs() {
		specs = append(specs, specOf(s, SourceBuiltin))
	}
	if b.mcp == nil {
		return specs, nil
	}
	ts, results := b.mcp.List(ctx)
	for _, t := range ts {
		specs = append(specs, specOf(t.spec, SourceOf(t.Server())))
	}
	return specs, results
}

// Servers names the configured MCP servers, sorted (nil for none).
func (b *Toolbox) Servers() []string {
	if b.mcp == nil {
		return nil
	}
	return b.mcp.Servers()
}

// Execute runs one call: a built-in tool through the registry, an MCP tool
// through its server (connected first if needed). An unknown tool or an
// unreachable server is a failed Result, never an error.
func (b *Toolbox) Execute(ctx context.Context, call tools.Call, emit tools.Emit) tools.Result {
	if _, ok := b.builtin.Lookup(call.Name); ok || b.mcp == nil || !IsToolName(call.Name) {
		if !ok {
			return b.unknown(call.Name, "")
		}
		return b.builtin.Execute(ctx, call, emit)
	}
	t, err := b.mcp.Lookup(ctx, call.Name)
	if err != nil {
		return b.unknown(call.Name, err.Error())
	}
	return b.builtin.ExecuteChecked(ctx, t, call, emit)
}

func (b *Toolbox) unknown(name, why string) tools.Result {
	names := b.builtin.Names()
	if b.mcp != nil {
		for _, s := range b.mcp.servers {
			s.mu.Lock()
			for _, t := range s.tools {
				names = append(names, t.spec.Name)
			}
			s.mu.Unlock()
		}
	}
	slices.Sort(names[len(b.builtin.Names()):])
	msg := fmt.Sprintf("unknown tool %q; available: %s", name, strings.Join(names, ", "))
	if why != "" {
		msg = fmt.Sprintf("cannot run %q: %s", name, why)
	}
	return tools.Result{Output: msg, Failed: true}
}

// Close stops the MCP servers (see Manager.Close).
func (b *Toolbox) Close() {
	if b.mcp != nil {
		b.mcp.Close()
	}
}

// Package mcptest gives floe's tests MCP servers: the reference server
// @modelcontextprotocol/server-everything (installed with npm by
// scripts/mcp-everything, once per scripts/test run) and a small Go SDK
// server over Streamable HTTP.
package mcptest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Everything returns the entry point of the reference server (run it as
// `node ENTRY stdio` or `node ENTRY streamableHttp` with PORT set),
// installing it first if needed. It skips the test only when npm is not
// installed.
func Everything(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "../../../../scripts/mcp-everything")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, script).Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 3 {
		t.Skip("npm is not installed: this test runs the reference MCP server @modelcontextprotocol/server-everything, which npm installs")
	}
	if err != nil {
		var stderr []byte
		if ee != nil {
			stderr = ee.Stderr
		}
		t.Fatalf("installing the reference MCP server with %s: %v: %s", script, err, stderr)
	}
	return strings.TrimSpace(string(out))
}

// Server serves, on 127.0.0.1 until the test ends, a Go SDK MCP server
// over Streamable HTTP with two tools: echo {text} (read-only; answers
// "session=<MCP session id> text=<text>" after 150 ms, so a caller can tell
// which client connection ran it) and write (no read-only hint; answers
// "wrote"). It returns the endpoint URL.
func Server(t testing.TB) string {
	t.Helper()
	s := sdk.NewServer(&sdk.Implementation{Name: "floe-mcptest", Version: "1"}, nil)
	s.AddTool(&sdk.Tool{Name: "echo", Description: "Echoes text.", Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
		InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`)},
		func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			time.Sleep(150 * time.Millisecond)
			var a struct{ Text string }
			_ = json.Unmarshal(req.Params.Arguments, &a)
			return text("session=" + req.Session.ID() + " text=" + a.Text), nil
		})
	s.AddTool(&sdk.Tool{Name: "write", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) { return text("wrote"), nil })
	srv := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, nil))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

func text(s string) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: s}}}
}

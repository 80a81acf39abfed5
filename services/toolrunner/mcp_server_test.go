package toolrunner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// stdioServerVar, when set, makes the test binary an MCP server on stdio
// (see TestMain): the stdio tests run it as their server's command.
const stdioServerVar = "FLOE_TEST_MCP_STDIO"

// tinyPNG is a 1×1 PNG.
var tinyPNG = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc\xf8\xff\xff?\x00\x05\xfe\x02\xfe\xa7\x35\x81\x84\x00\x00\x00\x00IEND\xaeB`\x82")

// goServer records what the test server saw.
type goServer struct {
	mu        sync.Mutex
	cancelled []string // tools whose handler saw its context end
	started   int      // hang calls that reached the handler
	sessions  map[string]int
}

func (g *goServer) noteCancel(tool string) {
	g.mu.Lock()
	g.cancelled = append(g.cancelled, tool)
	g.mu.Unlock()
}

func (g *goServer) cancels() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.cancelled...)
}

func (g *goServer) hangs() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.started
}

func text(s string) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: s}}}
}

// newGoServer is the edge-case server: echo (read-only), fail (isError),
// image, hang (never answers), flood (a huge answer after many progress
// lines), progress, pid, env, slow. With badSchema it offers one tool
// whose input schema is not a usable JSON Schema.
func newGoServer(g *goServer, badSchema bool) *sdk.Server {
	s := sdk.NewServer(&sdk.Implementation{Name: "floe-test", Version: "1"}, nil)
	obj := json.RawMessage(`{"type":"object"}`)
	if badSchema {
		s.AddTool(&sdk.Tool{Name: "ok", InputSchema: obj}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return text("ok"), nil
		})
		s.AddTool(&sdk.Tool{Name: "broken", InputSchema: json.RawMessage(`{"type":"object","properties":{"x":{"$ref":"#/$defs/missing"}}}`)},
			func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) { return text("never"), nil })
		return s
	}
	progress := func(ctx context.Context, req *sdk.CallToolRequest, i, n int, msg string) {
		if tok := req.Params.GetProgressToken(); tok != nil {
			_ = req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{ProgressToken: tok, Progress: float64(i), Total: float64(n), Message: msg})
		}
	}
	s.AddTool(&sdk.Tool{Name: "echo", Description: "Echoes text.", Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true},
		InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string","minLength":1}},"required":["text"],"additionalProperties":false}`)},
		func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			var a struct{ Text string }
			_ = json.Unmarshal(req.Params.Arguments, &a)
			if g != nil {
				g.mu.Lock()
				if g.sessions == nil {
					g.sessions = map[string]int{}
				}
				g.sessions[req.Session.ID()]++
				g.mu.Unlock()
			}
			return text("echo: " + a.Text), nil
		})
	s.AddTool(&sdk.Tool{Name: "fail", InputSchema: obj}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: "it broke"}}}, nil
	})
	s.AddTool(&sdk.Tool{Name: "image", InputSchema: obj}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "a picture"}, &sdk.ImageContent{Data: tinyPNG, MIMEType: "image/png"}}}, nil
	})
	s.AddTool(&sdk.Tool{Name: "hang", InputSchema: obj}, func(ctx context.Context, _ *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		if g != nil {
			g.mu.Lock()
			g.started++
			g.mu.Unlock()
		}
		<-ctx.Done()
		if g != nil {
			g.noteCancel("hang")
		}
		return nil, ctx.Err()
	})
	s.AddTool(&sdk.Tool{Name: "flood", InputSchema: obj}, func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		for i := 1; i <= 200; i++ {
			progress(ctx, req, i, 200, strings.Repeat("p", 100))
		}
		return text(strings.Repeat("x", 1<<20)), nil
	})
	s.AddTool(&sdk.Tool{Name: "progress", InputSchema: obj}, func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		for i := 1; i <= 3; i++ {
			progress(ctx, req, i, 3, fmt.Sprintf("step %d", i))
			time.Sleep(30 * time.Millisecond)
		}
		return text("finished"), nil
	})
	s.AddTool(&sdk.Tool{Name: "pid", InputSchema: obj}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return text(fmt.Sprint(os.Getpid())), nil
	})
	s.AddTool(&sdk.Tool{Name: "grow", InputSchema: obj}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		s.AddTool(&sdk.Tool{Name: "grown", InputSchema: obj}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return text("new tool"), nil
		})
		return text("added"), nil
	})
	s.AddTool(&sdk.Tool{Name: "env", InputSchema: obj}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return text("secret=" + os.Getenv("FLOE_TEST_SECRET") + " leaked=" + os.Getenv("FLOE_TEST_MCP_EXPANDED")), nil
	})
	return s
}

// serveStdio runs the edge-case server on stdin/stdout until stdin closes.
func serveStdio() {
	if err := newGoServer(nil, false).Run(context.Background(), &sdk.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "test MCP server:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// httpServer serves s over Streamable HTTP on 127.0.0.1 until the test ends.
func httpServer(t *testing.T, s *sdk.Server) string {
	t.Helper()
	srv := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, nil))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// mcpConfig writes an MCP config file and returns its path.
func mcpConfig(t *testing.T, servers map[string]any) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"servers": servers})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "mcp.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

package mcptools

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/telemetry"
	"floe.dev/services/toolrunner/internal/argschema"
	"floe.dev/services/toolrunner/internal/tools"
)

// toolPrefix starts the name of every MCP tool: mcp__<server>__<tool>.
const toolPrefix = "mcp__"

// ToolName returns the name the model sees for a server's tool.
func ToolName(server, tool string) string { return toolPrefix + server + "__" + tool }

// IsToolName reports whether name has the shape of an MCP tool's name.
func IsToolName(name string) bool { return strings.HasPrefix(name, toolPrefix) }

// modelToolName is what every model API accepts as a tool name.
var modelToolName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// Tool is one tool of an MCP server, run through tools.Registry's
// ExecuteChecked (it implements tools.Checked).
type Tool struct {
	srv    *server
	remote string // the server's name for it
	spec   tools.Spec
	schema *argschema.Schema
}

// Spec describes the tool to the model and the approval policy.
func (t *Tool) Spec() tools.Spec { return t.spec }

// Server returns the name of the tool's server.
func (t *Tool) Server() string { return t.srv.name }

// Timeout is the server's timeout_ms, or zero for the default.
func (t *Tool) Timeout() time.Duration {
	return time.Duration(t.srv.cfg.TimeoutMs) * time.Millisecond
}

// Check validates the arguments against the server's input schema,
// compiled when the server listed the tool.
func (t *Tool) Check(arguments string) (json.RawMessage, error) {
	args, _, err := t.schema.Check(arguments)
	return args, err
}

// Run calls the tool on its server: progress notifications stream as
// output lines, the result's text blocks are the returned output and its
// images the Result's images; isError fails the call.
func (t *Tool) Run(ctx context.Context, _ tools.Call, args json.RawMessage, emit tools.Emit) tools.Result {
	s := t.srv
	sess, err := s.session(ctx)
	if err != nil {
		return tools.Result{Output: fmt.Sprintf("MCP server %q is not available: %v", s.name, err), Failed: true}
	}
	token := "floe-" + strconv.FormatUint(s.m.token.Add(1), 10)
	s.mu.Lock()
	s.progress[token] = func(p *sdk.ProgressNotificationParams) { emit(progressLine(p)) }
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.progress, token)
		s.mu.Unlock()
	}()

	params := &sdk.CallToolParams{Name: t.remote, Arguments: args}
	params.SetProgressToken(token)
	telemetry.InjectMeta(ctx, params.Meta) // params._meta.traceparent: the server may join the trace
	res, err := sess.CallTool(ctx, params)
	if err != nil {
		if ctx.Err() != nil {
			return tools.Result{Failed: true} // Execute adds the timeout or cancel note
		}
		var rpcErr *jsonrpc.Error
		if !errors.As(err, &rpcErr) {
			s.drop(sess) // a transport failure: reconnect for the next call
		}
		return tools.Result{Output: fmt.Sprintf("MCP call to %s failed: %v", t.spec.Name, err), Failed: true}
	}
	text, images := render(res)
	return tools.Result{Output: text, Failed: res.IsError, Images: images}
}

func progressLine(p *sdk.ProgressNotificationParams) string {
	var b strings.Builder
	b.WriteString("[progress ")
	b.WriteString(strconv.FormatFloat(p.Progress, 'f', -1, 64))
	if p.Total > 0 {
		b.WriteByte('/')
		b.WriteString(strconv.FormatFloat(p.Total, 'f', -1, 64))
	}
	b.WriteByte(']')
	if p.Message != "" {
		b.WriteByte(' ')
		b.WriteString(p.Message)
	}
	b.WriteByte('\n')
	return b.String()
}

// render flattens a result: text blocks joined by newlines, images as
// data URLs, other content as a placeholder line; structured content is
// written only when there is no text.
func render(res *sdk.CallToolResult) (string, []string) {
	var parts, images []string
	for _, c := range res.Content {
		switch c := c.(type) {
		case *sdk.TextContent:
			parts = append(parts, c.Text)
		case *sdk.ImageContent:
			images = append(images, "data:"+c.MIMEType+";base64,"+base64.StdEncoding.EncodeToString(c.Data))
		case *sdk.AudioContent:
			parts = append(parts, "[audio content: "+c.MIMEType+"]")
		case *sdk.ResourceLink:
			line := "[resource: " + c.URI + "]"
			if c.Description != "" {
				line += " " + c.Description
			}
			parts = append(parts, line)
		case *sdk.EmbeddedResource:
			switch {
			case c.Resource == nil:
				parts = append(parts, "[resource]")
			case c.Resource.Text != "":
				parts = append(parts, c.Resource.Text)
			default:
				parts = append(parts, "[resource: "+c.Resource.URI+" (binary)]")
			}
		default:
			parts = append(parts, fmt.Sprintf("[unsupported content: %T]", c))
		}
	}
	text := strings.Join(parts, "\n")
	if text == "" && res.StructuredContent != nil {
		if b, err := json.MarshalIndent(res.StructuredContent, "", "  "); err == nil {
			text = string(b)
		}
	}
	return text, images
}

// makeTools checks a server's tool list: every name must make a usable
// model tool name, and every input schema must be a JSON Schema of an
// object. Any problem makes the whole list invalid. A schema unchanged
// since the tool list old is not compiled again.
func (s *server) makeTools(listed []*sdk.Tool, old []*Tool) ([]*Tool, error) {
	compiled := make(map[string]*Tool, len(old))
	for _, t := range old {
		compiled[t.remote] = t
	}
	out := make([]*Tool, 0, len(listed))
	seen := map[string]bool{}
	for _, lt := range listed {
		if lt == nil {
			continue
		}
		name := ToolName(s.name, lt.Name)
		if !modelToolName.MatchString(name) {
			return nil, fmt.Errorf("tool %q: %q is not a usable tool name (letters, digits, '_' and '-', at most 128)", lt.Name, name)
		}
		if seen[lt.Name] {
			return nil, fmt.Errorf("tool %q listed twice", lt.Name)
		}
		seen[lt.Name] = true
		params, err := compact(lt.InputSchema)
		if err != nil {
			return nil, fmt.Errorf("tool %q: input schema: %w", lt.Name, err)
		}
		var schema *argschema.Schema
		if prev := compiled[lt.Name]; prev != nil && bytes.Equal(prev.spec.Parameters, params) {
			schema = prev.schema
		} else if schema, err = argschema.Compile(params, argschema.Options{}); err != nil {
			return nil, fmt.Errorf("tool %q: input schema: %w", lt.Name, err)
		}
		perm := s.cfg.Permission
		if perm == "" {
			perm = tools.PermReadWrite
			if lt.Annotations != nil && lt.Annotations.ReadOnlyHint {
				perm = tools.PermRead
			}
		}
		desc := lt.Description
		if desc == "" {
			desc = lt.Title
		}
		if desc == "" {
			desc = fmt.Sprintf("Tool %q of the MCP server %q.", lt.Name, s.name)
		}
		out = append(out, &Tool{srv: s, remote: lt.Name, schema: schema,
			spec: tools.Spec{Name: name, Description: desc, Parameters: params, Permission: perm}})
	}
	return out, nil
}

// compact returns an input schema as compact JSON, the form the model is
// shown and argschema compiles.
func compact(schema any) (json.RawMessage, error) {
	if schema == nil {
		return nil, errors.New("missing")
	}
	raw, err := json.Marshal(schema)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// specOf converts a tool's spec to the wire form with its source.
func specOf(s tools.Spec, source string) omni.ToolSpec {
	return omni.ToolSpec{Name: s.Name, Description: s.Description, Parameters: s.Parameters, Permission: s.Permission, Source: source}
}

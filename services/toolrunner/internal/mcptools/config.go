package mcptools

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// ConfigVar is the variable naming the deployment's MCP configuration file.
const ConfigVar = "FLOE_MCP_CONFIG"

// Config is the content of the FLOE_MCP_CONFIG file (protocol.md §7):
//
//	{"servers": {"<name>": {"command", "args", "env"} | {"url", "headers"}, "permission": "r"|"rw"}}
type Config struct {
	Servers map[string]ServerConfig `json:"servers"`
}

// ServerConfig declares one MCP server: a command to run over stdio, or the
// URL of a Streamable HTTP endpoint. Values of env and headers (and the url)
// may use ${VAR}, expanded from the toolrunner's environment when the
// server is connected, so secrets stay out of the file.
type ServerConfig struct {
	Command string            `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`

	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`

	// Permission applies to every tool of the server: "r" tools are
	// auto-allowed by the read-only approval mode. Empty: "r" for tools
	// that declare readOnlyHint, else "rw".
	Permission string `json:"permission,omitempty"`
	// TimeoutMs bounds one tool call (default: the toolrunner's tool
	// timeout); ConnectTimeoutMs bounds connecting and listing the tools
	// (default 30 s).
	TimeoutMs        int64 `json:"timeout_ms,omitempty"`
	ConnectTimeoutMs int64 `json:"connect_timeout_ms,omitempty"`
}

// DefaultConnectTimeout bounds a server's connect and tool listing.
const DefaultConnectTimeout = 30 * time.Second

// Transport returns "stdio" or "http".
func (s ServerConfig) Transport() string {
	if s.URL != "" {
		return "http"
	}
	return "stdio"
}

func (s ServerConfig) connectTimeout() time.Duration {
	if s.ConnectTimeoutMs > 0 {
		return time.Duration(s.ConnectTimeoutMs) * time.Millisecond
	}
	return DefaultConnectTimeout
}

// serverName is what a server may be called: the tool names it yields,
// mcp__<server>__<tool>, must suit every model API.
var serverName = regexp.MustCompile(`^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$`)

// ErrConfig is wrapped by every error Load and Parse return.
var ErrConfig = errors.New("mcp config")

// Load reads and checks the configuration file at path. Errors name the
// file and, for a syntax error, the line and column.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s: %v", ErrConfig, ConfigVar, path, err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", ConfigVar, path, err)
	}
	return c, nil
}

// Parse decodes and checks a configuration. Unknown fields are refused, so
// a misspelt key is an error rather than silently ignored.
func Parse(data []byte) (*Config, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrConfig, describeJSONError(data, err))
	}
	if dec.More() {
		line, col := position(data, int(dec.InputOffset()))
		return nil, fmt.Errorf("%w: line %d, column %d: unexpected data after the top-level object", ErrConfig, line, col)
	}
	if c.Servers == nil {
		return nil, fmt.Errorf("%w: no \"servers\" object", ErrConfig)
	}
	for _, name := range c.Names() {
		if err := c.Servers[name].check(name); err != nil {
			return nil, fmt.Errorf("%w: server %q: %v", ErrConfig, name, err)
		}
	}
	return &c, nil
}

// Names returns the server names in sorted order.
func (c *Config) Names() []string {
	names := make([]string, 0, len(c.Servers))
	for n := range c.Servers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func (s ServerConfig) check(name string) error {
	switch {
	case !serverName.MatchString(name):
		return errors.New("a server name is letters, digits, '-' and single '_' between them")
	case s.Command == "" && s.URL == "":
		return errors.New("needs \"command\" (stdio) or \"url\" (Streamable HTTP)")
	case s.Command != "" && s.URL != "":
		return errors.New("has both \"command\" and \"url\"; choose one transport")
	case s.URL != "" && (len(s.Args) > 0 || len(s.Env) > 0 || s.Cwd != ""):
		return errors.New("\"args\", \"env\" and \"cwd\" apply to a command, not to a url")
	case s.Command != "" && len(s.Headers) > 0:
		return errors.New("\"headers\" apply to a url, not to a command")
	case s.Permission != "" && s.Permission != "r" && s.Permission != "rw":
		return fmt.Errorf("permission %q must be \"r\" or \"rw\"", s.Permission)
	case s.TimeoutMs < 0 || s.ConnectTimeoutMs < 0:
		return errors.New("timeouts must not be negative")
	}
	if s.URL != "" && !strings.Contains(s.URL, "${") {
		u, err := url.Parse(s.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("url %q is not an http(s) URL", s.URL)
		}
	}
	return nil
}

func describeJSONError(data []byte, err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		line, col := position(data, int(syn.Offset))
		return fmt.Sprintf("invalid JSON at line %d, column %d: %v", line, col, syn)
	case errors.As(err, &typ):
		line, col := position(data, int(typ.Offset))
		field := typ.Field
		if field == "" {
			field = "the top level"
		}
		return fmt.Sprintf("line %d, column %d: %s must be %s, not %s", line, col, field, typ.Type, typ.Value)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "the file is empty or ends early"
	}
	return err.Error()
}

// position returns the 1-based line and column of byte offset off.
func position(data []byte, off int) (line, col int) {
	off = min(max(off, 0), len(data))
	before := data[:off]
	line = bytes.Count(before, []byte{'\n'}) + 1
	col = off - bytes.LastIndexByte(before, '\n')
	return line, col
}

// expand replaces every ${NAME} in s with the variable's value from
// lookup; an unset variable is an error, so a missing secret is reported
// rather than sent as an empty string. A "$" not followed by "{" is kept.
func expand(s string, lookup func(string) (string, bool)) (string, error) {
	if !strings.Contains(s, "${") {
		return s, nil
	}
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return "", fmt.Errorf("unclosed \"${\" in %q", s)
		}
		name := s[i+2 : i+j]
		if name == "" {
			return "", errors.New("empty ${} reference")
		}
		v, ok := lookup(name)
		if !ok {
			return "", fmt.Errorf("${%s} is not set in the toolrunner's environment", name)
		}
		b.WriteString(s[:i])
		b.WriteString(v)
		s = s[i+j+1:]
	}
}

// expandMap expands every value of m (keys are kept), in sorted key order
// for stable errors.
func expandMap(what string, m map[string]string, lookup func(string) (string, bool)) (map[string]string, error) {
	out := make(map[string]string, len(m))
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v, err := expand(m[k], lookup)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", what, k, err)
		}
		out[k] = v
	}
	return out, nil
}

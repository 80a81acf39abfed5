package hooks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"floe.dev/pkg/omni"
)

// DefaultTimeout bounds a hook that names no timeout_ms (protocol.md §7).
const DefaultTimeout = 10 * time.Second

// maxTimeout bounds timeout_ms: a hook holds its Task while it runs.
const maxTimeout = 10 * time.Minute

// Points are the hook points, in the order the loop reaches them.
var Points = []string{omni.HookUserPrompt, omni.HookPreToolUse, omni.HookStop}

// Hook is one entry of the hooks file.
type Hook struct {
	// Name identifies the hook in its records and in a denied call's
	// output; unique per point.
	Name string `json:"name"`
	// Command is the program to run (a path, or a name looked up in PATH),
	// with Args. Exactly one of Command and NATS is set.
	Command string   `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
	// NATS: the hook is a service answering requests on floe.hook.<point>.
	NATS bool `json:"nats,omitempty"`
	// Match (pre_tool_use only) is an RE2 pattern the whole tool name must
	// match for the hook to run; empty matches every tool.
	Match string `json:"match,omitempty"`
	// TimeoutMs bounds one run (0: DefaultTimeout).
	TimeoutMs int64 `json:"timeout_ms,omitempty"`
	// Required: a failed run (timeout, non-zero exit, garbage answer, no
	// service) denies instead of counting as no opinion.
	Required bool `json:"required,omitempty"`

	match *regexp.Regexp
}

// Timeout is the hook's time limit.
func (h *Hook) Timeout() time.Duration {
	if h.TimeoutMs <= 0 {
		return DefaultTimeout
	}
	return time.Duration(h.TimeoutMs) * time.Millisecond
}

// Matches reports whether a pre_tool_use hook runs for tool.
func (h *Hook) Matches(tool string) bool { return h.match == nil || h.match.MatchString(tool) }

// Config is a deployment's hooks (FLOE_HOOKS): per point, in file order.
type Config struct {
	Hooks map[string][]Hook `json:"hooks"`
}

// Has reports whether any hook is configured at point.
func (c *Config) Has(point string) bool { return c != nil && len(c.Hooks[point]) > 0 }

// Parse reads a hooks file: {"hooks": {"<point>": [{"name", "command",
// "args"?, "match"?, "timeout_ms"?, "required"?} | {"name", "nats": true,
// …}]}}. Unknown points and fields are errors, so a typo is caught at start
// rather than silently never running.
func Parse(b []byte) (*Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("hooks: %w", err)
	}
	if len(bytes.TrimSpace(b[dec.InputOffset():])) > 0 {
		return nil, errors.New("hooks: trailing data after the object")
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Load reads and parses the hooks file at path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("hooks: read %s: %w", path, err)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	// A relative command path ("./hooks/audit.sh") is the file's
	// neighbour, wherever the engine runs; a bare name is looked up in
	// PATH.
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("hooks: %w", err)
	}
	for _, hs := range c.Hooks {
		for i := range hs {
			if cmd := hs[i].Command; strings.Contains(cmd, "/") && !filepath.IsAbs(cmd) {
				hs[i].Command = filepath.Join(dir, cmd)
			}
		}
	}
	return c, nil
}

func (c *Config) validate() error {
	for point, hs := range c.Hooks {
		if !validPoint(point) {
			return fmt.Errorf("hooks: unknown point %q (want user_prompt, pre_tool_use or stop)", point)
		}
		seen := map[string]bool{}
		for i := range hs {
			h := &hs[i]
			where := fmt.Sprintf("hooks: %s[%d]", point, i)
			switch {
			case h.Name == "":
				return fmt.Errorf("%s: name is required", where)
			case seen[h.Name]:
				return fmt.Errorf("%s: name %q is used twice", where, h.Name)
			case h.NATS && h.Command != "":
				return fmt.Errorf("%s (%s): command and nats exclude each other", where, h.Name)
			case !h.NATS && h.Command == "":
				return fmt.Errorf("%s (%s): command or \"nats\": true is required", where, h.Name)
			case h.NATS && len(h.Args) > 0:
				return fmt.Errorf("%s (%s): args need a command", where, h.Name)
			case h.TimeoutMs < 0 || time.Duration(h.TimeoutMs)*time.Millisecond > maxTimeout:
				return fmt.Errorf("%s (%s): timeout_ms %d is outside 0..%d", where, h.Name, h.TimeoutMs, maxTimeout.Milliseconds())
			case h.Match != "" && point != omni.HookPreToolUse:
				return fmt.Errorf("%s (%s): match applies to pre_tool_use hooks only", where, h.Name)
			}
			seen[h.Name] = true
			if h.Match != "" {
				re, err := regexp.Compile(`^(?:` + h.Match + `)$`)
				if err != nil {
					return fmt.Errorf("%s (%s): match: %w", where, h.Name, err)
				}
				h.match = re
			}
		}
	}
	return nil
}

func validPoint(p string) bool {
	for _, q := range Points {
		if p == q {
			return true
		}
	}
	return false
}

// HasCommand reports whether any hook is a command (not a NATS service):
// only then is a sandbox needed.
func (c *Config) HasCommand() bool {
	if c == nil {
		return false
	}
	for _, hs := range c.Hooks {
		for i := range hs {
			if !hs[i].NATS {
				return true
			}
		}
	}
	return false
}

package toolrunner_test

import (
	"errors"
	"flag"
	"strings"
	"testing"

	"floe.dev/services/toolrunner"
)

func TestFromEnvReadsVariablesOverDefaults(t *testing.T) {
	t.Parallel()
	vars := map[string]string{
		"FLOE_POOL": "gpu", "FLOE_TOOL_CONCURRENCY": "3", toolrunner.MCPConfigVar: "/etc/mcp.json",
		toolrunner.SandboxVar: "off", toolrunner.SandboxNetworkVar: "off", toolrunner.ToolPidsVar: "64",
	}
	c, err := toolrunner.FromEnv(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.Pool != "gpu" || c.Concurrency != 3 || c.MCPConfig != "/etc/mcp.json" || c.Sandbox.Backend != "off" ||
		!c.Sandbox.NetworkOff || c.Sandbox.Pids != 64 {
		t.Errorf("FromEnv = %+v", c)
	}
	if d := toolrunner.DefaultConfig(); c.MaxOutput != d.MaxOutput || c.HeartbeatInterval != d.HeartbeatInterval || c.RunnerID == "" {
		t.Errorf("FromEnv lost defaults: %+v", c)
	}
	for name, val := range map[string]string{"FLOE_TOOL_CONCURRENCY": "many", toolrunner.ToolMemoryVar: "-1"} {
		_, err := toolrunner.FromEnv(func(k string) string { return map[string]string{name: val}[k] })
		if !errors.Is(err, toolrunner.ErrInvalidConfig) || !strings.Contains(err.Error(), name) {
			t.Errorf("FromEnv(%s=%q) = %v, want ErrInvalidConfig naming %s", name, val, err, name)
		}
	}
}

func TestFlagsBeatVariables(t *testing.T) {
	t.Parallel()
	c, err := toolrunner.FromEnv(func(k string) string {
		return map[string]string{"FLOE_POOL": "envpool", "FLOE_TOOL_CONCURRENCY": "3", toolrunner.SandboxVar: "off"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("toolrunner", flag.ContinueOnError)
	c.Flags(fs)
	if err := fs.Parse([]string{"--pool", "flagpool", "--sandbox", "auto"}); err != nil {
		t.Fatal(err)
	}
	if c.Pool != "flagpool" || c.Concurrency != 3 || c.Sandbox.Backend != "auto" {
		t.Errorf("after flags: Pool %q Concurrency %d Sandbox %q; want flagpool, 3 (env), auto", c.Pool, c.Concurrency, c.Sandbox.Backend)
	}
}

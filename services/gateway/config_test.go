package gateway_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"floe.dev/services/gateway"
)

func TestFromEnvReadsVariablesOverDefaults(t *testing.T) {
	vars := map[string]string{
		"FLOE_HOME": "/data", "FLOE_HTTP_ADDR": "127.0.0.1:9", "FLOE_MODEL": "openai:gpt-4o-mini",
		"FLOE_API_TOKEN": "alice:tok1", "FLOE_SCRIPTS_DIR": "/scripts", "FLOE_COMMAND_POLICY": "off",
	}
	c, err := gateway.FromEnv(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.Home != "/data" || c.Addr != "127.0.0.1:9" || c.DefaultModel != "openai:gpt-4o-mini" ||
		c.Tokens["tok1"] != "alice" || c.ScriptsDir != "/scripts" || c.CommandPolicy == nil {
		t.Errorf("FromEnv = %+v", c)
	}
	d := gateway.DefaultConfig()
	if c.MaxBody != d.MaxBody || c.Heartbeat != d.Heartbeat || c.ClientBuffer != d.ClientBuffer {
		t.Errorf("FromEnv lost defaults: %+v, want those of %+v", c, d)
	}
	if c, err := gateway.FromEnv(func(string) string { return "" }); err != nil || c.Addr != gateway.DefaultAddr || c.DefaultModel != gateway.DefaultModel {
		t.Errorf("FromEnv(empty) = %+v, %v; want the defaults", c, err)
	}
	bad := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(bad, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := gateway.FromEnv(func(k string) string { return map[string]string{"FLOE_COMMAND_POLICY": bad}[k] }); err == nil ||
		!strings.Contains(err.Error(), "FLOE_COMMAND_POLICY") {
		t.Errorf("FromEnv with a broken policy file = %v, want an error naming FLOE_COMMAND_POLICY", err)
	}
}

func TestFlagsBeatVariables(t *testing.T) {
	c, err := gateway.FromEnv(func(k string) string {
		return map[string]string{"FLOE_HOME": "/env", "FLOE_HTTP_ADDR": "127.0.0.1:1", "FLOE_MODEL": "scripted:env"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	c.Flags(fs)
	if err := fs.Parse([]string{"--http", "127.0.0.1:2", "--model", "scripted:flag"}); err != nil {
		t.Fatal(err)
	}
	if c.Home != "/env" || c.Addr != "127.0.0.1:2" || c.DefaultModel != "scripted:flag" {
		t.Errorf("after flags: Home %q Addr %q DefaultModel %q; want /env, 127.0.0.1:2, scripted:flag", c.Home, c.Addr, c.DefaultModel)
	}
}

func TestValidateErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*gateway.Config)
		want string
	}{
		{"no home", func(c *gateway.Config) { c.Home = "" }, "FLOE_HOME"},
		{"small body cap", func(c *gateway.Config) { c.MaxBody = 10 }, "MaxBody"},
		{"model without provider", func(c *gateway.Config) { c.DefaultModel = "gpt" }, "provider:model_id"},
		{"relative scripts dir", func(c *gateway.Config) { c.ScriptsDir = "scripts" }, "ScriptsDir"},
		{"negative heartbeat", func(c *gateway.Config) { c.Heartbeat = -time.Second }, "negative"},
		{"negative buffer", func(c *gateway.Config) { c.ClientBuffer = -1 }, "ClientBuffer"},
		{"blank token", func(c *gateway.Config) { c.Tokens = map[string]string{" ": "x"} }, "token"},
		{"bad addr", func(c *gateway.Config) { c.Addr = "nowhere" }, "Addr"},
		{"open without token", func(c *gateway.Config) { c.Addr, c.Tokens = "0.0.0.0:7364", nil }, "FLOE_API_TOKEN"},
		{"public URL not http", func(c *gateway.Config) { c.PublicURL = "ftp://x" }, "FLOE_PUBLIC_URL"},
		{"allowed host with path", func(c *gateway.Config) { c.AllowedHosts = []string{"a/b"} }, "FLOE_ALLOWED_HOSTS"},
	} {
		c := gateway.DefaultConfig()
		c.Home = t.TempDir()
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want an error mentioning %q", tc.name, err, tc.want)
		}
	}
	c := gateway.Config{Home: t.TempDir()}
	if err := c.Validate(); err != nil {
		t.Fatalf("Config{Home}.Validate() = %v", err)
	}
	if d := gateway.DefaultConfig(); c.Addr != d.Addr || c.MaxBody != d.MaxBody || c.ShutdownTimeout != d.ShutdownTimeout || len(c.WorkspaceRoots) == 0 {
		t.Errorf("Config{Home} after Validate = %+v, want the defaults and workspace roots", c)
	}
}

package engine

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// FLOE_PARTIALS_KEEP and FLOE_IDLE_KEEP read the same way: a duration,
// "off" (-1), default an hour.
func TestKeepsFromEnvironment(t *testing.T) {
	for _, v := range []struct {
		name string
		got  func(Config) time.Duration
	}{
		{"FLOE_PARTIALS_KEEP", func(c Config) time.Duration { return c.PartialsKeep }},
		{"FLOE_IDLE_KEEP", func(c Config) time.Duration { return c.IdleKeep }},
	} {
		for _, tc := range []struct {
			env     string
			want    time.Duration
			wantErr bool
		}{
			{"", time.Hour, false},
			{"10m", 10 * time.Minute, false},
			{"0s", 0, false},
			{"off", -1, false},
			{"soon", 0, true},
		} {
			c, err := FromEnv(env(map[string]string{v.name: tc.env}))
			if (err != nil) != tc.wantErr {
				t.Fatalf("%s=%q: FromEnv error %v, want error %v", v.name, tc.env, err, tc.wantErr)
			}
			if err != nil {
				continue
			}
			if err := c.Validate(); err != nil {
				t.Fatalf("%s=%q: Validate() = %v", v.name, tc.env, err)
			}
			if got := v.got(c); got != tc.want {
				t.Errorf("%s=%q: %v, want %v", v.name, tc.env, got, tc.want)
			}
		}
	}
}

func TestFromEnvReadsVariablesOverDefaults(t *testing.T) {
	c, err := FromEnv(env(map[string]string{
		"FLOE_HOME": "/data", "FLOE_POOL": "gpu", "FLOE_RETRY_BASE_MS": "50", "FLOE_RETRY_CAP_MS": "900",
		"FLOE_RETRY_MAX": "0", "FLOE_ENGINE_ACK_WAIT_MS": "4000", "FLOE_HEARTBEAT_TIMEOUT_MS": "700",
		"FLOE_REQUEST_TIMEOUT_MS": "1500", "FLOE_SNAPSHOTS": "off", "OPENAI_API_KEY": "k",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Home != "/data" || c.Pool != "gpu" || c.RetryBase != 50*time.Millisecond || c.RetryCap != 900*time.Millisecond ||
		c.RetryMax != 0 || c.AckWait != 4*time.Second || c.HeartbeatTimeout != 700*time.Millisecond ||
		c.RequestTimeout != 1500*time.Millisecond || !c.NoSnapshots || c.Providers.OpenAIAPIKey != "k" {
		t.Errorf("FromEnv = %+v", c)
	}
	if d := DefaultConfig(); c.MaxTasks != d.MaxTasks || c.Durable != d.Durable || c.CancelWait != d.CancelWait {
		t.Errorf("FromEnv lost defaults: %+v, want those of %+v", c, d)
	}
	if c, _ := FromEnv(env(nil)); c.RetryMax != 5 || c.Pool != "default" || c.AckWait != 30*time.Second {
		t.Errorf("FromEnv(empty) = %+v, want DefaultConfig", c)
	}
}

func TestFlagsBeatVariables(t *testing.T) {
	c, err := FromEnv(env(map[string]string{"FLOE_HOME": "/env", "FLOE_POOL": "envpool"}))
	if err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("engine", flag.ContinueOnError)
	c.Flags(fs)
	if err := fs.Parse([]string{"--pool", "flagpool"}); err != nil {
		t.Fatal(err)
	}
	if c.Pool != "flagpool" || c.Home != "/env" {
		t.Errorf("after --pool flagpool: Pool %q, Home %q; want flagpool, /env", c.Pool, c.Home)
	}
}

func TestFromEnvRejectsBadValues(t *testing.T) {
	for name, val := range map[string]string{
		"FLOE_RETRY_BASE_MS":        "-1",
		"FLOE_RETRY_CAP_MS":         "soon",
		"FLOE_REQUEST_TIMEOUT_MS":   "1s",
		"FLOE_ENGINE_ACK_WAIT_MS":   "0",
		"FLOE_HEARTBEAT_TIMEOUT_MS": "-5",
		"FLOE_RETRY_MAX":            "many",
	} {
		_, err := FromEnv(env(map[string]string{name: val}))
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("FromEnv(%s=%q) = %v, want an error naming %s", name, val, err, name)
		}
	}
}

func TestValidateErrors(t *testing.T) {
	badHooks := filepath.Join(t.TempDir(), "hooks.json")
	if err := os.WriteFile(badHooks, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"cap below base", func(c *Config) { c.RetryBase, c.RetryCap = time.Second, time.Millisecond }, "retry cap"},
		{"pool with a dot", func(c *Config) { c.Pool = "a.b" }, "pool"},
		{"hooks file missing", func(c *Config) { c.Hooks.File = filepath.Join(t.TempDir(), "none.json") }, "FLOE_HOOKS"},
		{"hooks file bad", func(c *Config) { c.Hooks.File = badHooks }, "FLOE_HOOKS"},
		{"ack wait too short", func(c *Config) { c.AckWait = 100 * time.Millisecond }, "FLOE_ENGINE_ACK_WAIT_MS"},
	} {
		c := DefaultConfig()
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want an error mentioning %q", tc.name, err, tc.want)
		}
	}
	var zero Config
	if err := zero.Validate(); err != nil {
		t.Fatalf("Config{}.Validate() = %v", err)
	}
	if d := DefaultConfig(); zero.MaxTasks != d.MaxTasks || zero.AckWait != d.AckWait || zero.PartialsKeep != d.PartialsKeep || zero.RetryMax != 0 {
		t.Errorf("Config{} after Validate = %+v, want DefaultConfig's values with RetryMax 0", zero)
	}
}

package sandbox

import (
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestConfigFromEnvReadsEveryVariable(t *testing.T) {
	c, err := ConfigFromEnv(envOf(map[string]string{
		BackendVar: "Bwrap", NetworkVar: "off", ReadVar: "/opt/go::/srv/tools",
		DenyPortsVar: "6223, 8223", MemoryVar: "512", PidsVar: "64",
		"FLOE_NATS_PASSWORD_FILE": "/etc/floe/nats.pw", "FLOE_NATS_CREDS": "/etc/floe/nats.creds",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Backend: Bwrap, NetworkOff: true, Read: []string{"/opt/go", "/srv/tools"},
		DenyPorts: []int{6223, 8223}, MemoryMB: 512, Pids: 64, Hide: []string{"/etc/floe/nats.pw", "/etc/floe/nats.creds"}}
	if c.Backend != want.Backend || c.NetworkOff != want.NetworkOff || !slices.Equal(c.Read, want.Read) ||
		!slices.Equal(c.DenyPorts, want.DenyPorts) || c.MemoryMB != want.MemoryMB || c.Pids != want.Pids || !slices.Equal(c.Hide, want.Hide) {
		t.Errorf("ConfigFromEnv = %+v, want %+v", c, want)
	}
	c, err = ConfigFromEnv(envOf(nil))
	if err != nil || c.Backend != Auto || c.NetworkOff || c.MemoryMB != 0 || c.Pids != 0 || len(c.DenyPorts) != 0 {
		t.Errorf("empty environment: %+v, %v; want auto, network on, default limits", c, err)
	}
}

func TestConfigFromEnvNamesTheBadVariable(t *testing.T) {
	for name, val := range map[string]string{
		BackendVar: "docker", NetworkVar: "maybe", MemoryVar: "-1", PidsVar: "many", DenyPortsVar: "4222,70000",
	} {
		_, err := ConfigFromEnv(envOf(map[string]string{name: val}))
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%s: error %v, want one naming %s", name, val, err, name)
		}
	}
}

func TestFlagsOverrideTheEnvironment(t *testing.T) {
	env := envOf(map[string]string{BackendVar: "bwrap", NetworkVar: "on", PidsVar: "9"})
	// Bound to a Config read from the environment.
	c, err := ConfigFromEnv(env)
	if err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c.Flags(fs)
	if err := fs.Parse([]string{"--sandbox", "landlock", "--sandbox-network=off"}); err != nil {
		t.Fatal(err)
	}
	if c.Backend != Landlock || !c.NetworkOff || c.Pids != 9 {
		t.Errorf("with flags: %+v; want landlock, network off, 9 processes", c)
	}
	fs = flag.NewFlagSet("bad", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.Flags(fs)
	if err := fs.Parse([]string{"--sandbox", "docker"}); err == nil || !strings.Contains(err.Error(), BackendVar) {
		t.Errorf("--sandbox docker: %v, want an error naming %s", err, BackendVar)
	}
	// As an overlay on the environment, read after parsing.
	for _, tc := range []struct {
		args    []string
		backend Backend
		off     bool
	}{
		{[]string{"--sandbox", "landlock", "--sandbox-network=off"}, Landlock, true},
		{nil, Bwrap, false},
	} {
		fs := flag.NewFlagSet("y", flag.ContinueOnError)
		getenv := FlagsEnv(fs, env)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		c, err := ConfigFromEnv(getenv)
		if err != nil || c.Backend != tc.backend || c.NetworkOff != tc.off || c.Pids != 9 {
			t.Errorf("FlagsEnv %v: %+v, %v; want %s, network off %v, 9 processes", tc.args, c, err, tc.backend, tc.off)
		}
	}
}

func TestDenyAddrsTakesEveryFormOfListener(t *testing.T) {
	c := Config{DenyPorts: []int{6222}}
	c.DenyAddrs("127.0.0.1:7400", "nats://a:4300, nats://b:4301", "off", "", "[::1]:9100", "http://h:6222", "junk")
	if want := []int{6222, 7400, 4300, 4301, 9100}; !slices.Equal(c.DenyPorts, want) {
		t.Errorf("DenyPorts = %v, want %v", c.DenyPorts, want)
	}
	for addr, want := range map[string]int{"nats://127.0.0.1:4222": 4222, ":8080": 8080, "host": 0, "h:99999": 0, "tls://x": 0} {
		if got := PortOf(addr); got != want {
			t.Errorf("PortOf(%q) = %d, want %d", addr, got, want)
		}
	}
}

package sandbox

import (
	"flag"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// The variables of the sandbox (protocol.md §7 "Sandbox", §8), read alike by
// every service that starts confined processes: the toolrunner (tools,
// MCP servers) and the engine (hook commands).
const (
	BackendVar = "FLOE_SANDBOX"
	NetworkVar = "FLOE_SANDBOX_NETWORK"
	ReadVar    = "FLOE_SANDBOX_READ"
	// DenyPortsVar lists more Floe ports (comma- or space-separated) no
	// confined process may connect to: an external NATS cluster's route
	// and monitoring ports, which a service cannot discover.
	DenyPortsVar = "FLOE_SANDBOX_DENY_PORTS"
	MemoryVar    = "FLOE_TOOL_MEMORY_MB"
	PidsVar      = "FLOE_TOOL_PIDS"
)

// CredentialVars name the credentials files a service may be given; their
// files are hidden from confined processes wherever they lie.
var CredentialVars = []string{"FLOE_NATS_PASSWORD_FILE", "FLOE_NATS_CREDS"}

// ConfigFromEnv reads FLOE_SANDBOX, FLOE_SANDBOX_NETWORK,
// FLOE_SANDBOX_READ, FLOE_SANDBOX_DENY_PORTS, FLOE_TOOL_MEMORY_MB and
// FLOE_TOOL_PIDS through getenv, and hides the files of
// FLOE_NATS_PASSWORD_FILE and FLOE_NATS_CREDS. Every value is checked
// here, so a typo stops the service at start with the variable named.
// The service adds its own listeners with DenyAddrs.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var c Config
	var err error
	if c.Backend, err = ParseBackend(getenv(BackendVar)); err != nil {
		return Config{}, err
	}
	if c.NetworkOff, err = ParseNetwork(getenv(NetworkVar)); err != nil {
		return Config{}, err
	}
	for _, d := range strings.Split(getenv(ReadVar), ":") {
		if d != "" {
			c.Read = append(c.Read, d)
		}
	}
	for _, v := range []struct {
		name string
		dst  *int
	}{{MemoryVar, &c.MemoryMB}, {PidsVar, &c.Pids}} {
		if s := strings.TrimSpace(getenv(v.name)); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				return Config{}, fmt.Errorf("%s %q must be a positive integer", v.name, s)
			}
			*v.dst = n
		}
	}
	for _, p := range strings.FieldsFunc(getenv(DenyPortsVar), func(r rune) bool { return r == ',' || r == ' ' }) {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return Config{}, fmt.Errorf("%s: %q is not a port", DenyPortsVar, p)
		}
		c.DenyPorts = append(c.DenyPorts, n)
	}
	for _, v := range CredentialVars {
		if f := getenv(v); f != "" {
			c.Hide = append(c.Hide, f)
		}
	}
	return c, nil
}

// DenyAddrs closes the ports of addrs to confined processes: Floe's own
// listeners (the gateway's host:port, NATS URLs, a metrics address). An
// entry may be a comma-separated list (FLOE_NATS_URL); one without a port
// ("off", "") adds nothing.
func (c *Config) DenyAddrs(addrs ...string) {
	for _, a := range addrs {
		for _, one := range strings.Split(a, ",") {
			if p := PortOf(strings.TrimSpace(one)); p > 0 && !containsInt(c.DenyPorts, p) {
				c.DenyPorts = append(c.DenyPorts, p)
			}
		}
	}
}

func containsInt(s []int, n int) bool {
	for _, x := range s {
		if x == n {
			return true
		}
	}
	return false
}

// PortOf returns the port of a host:port address or a URL, 0 if none.
func PortOf(addr string) int {
	if u, err := url.Parse(addr); err == nil && u.Host != "" {
		addr = u.Host
	}
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	if n < 1 || n > 65535 {
		return 0
	}
	return n
}

// Flag usage texts, one wording for every command that takes them.
const (
	backendUsage = "confinement of tools and hook commands: auto, landlock, bwrap or off (" + BackendVar + ", default auto)"
	networkUsage = "their network besides Floe's own ports, which stay closed: on or off (" + NetworkVar + ", default on)"
)

// Flags registers --sandbox and --sandbox-network on fs, bound to c (read
// from the environment first, so a flag given beats its variable); a bad
// value is a flag error naming the choices.
func (c *Config) Flags(fs *flag.FlagSet) {
	backend := string(c.Backend)
	if backend == "" {
		backend = string(Auto)
	}
	network := "on"
	if c.NetworkOff {
		network = "off"
	}
	fs.Func("sandbox", backendUsage+" (now "+backend+")", func(v string) error {
		b, err := ParseBackend(v)
		if err == nil {
			c.Backend = b
		}
		return err
	})
	fs.Func("sandbox-network", networkUsage+" (now "+network+")", func(v string) error {
		off, err := ParseNetwork(v)
		if err == nil {
			c.NetworkOff = off
		}
		return err
	})
}

// FlagsEnv registers --sandbox and --sandbox-network on fs for a command
// that reads its configuration after parsing its flags (floe serve), and
// returns the getenv to read it with: it answers a flag that was given
// for its variable, and getenv for everything else.
func FlagsEnv(fs *flag.FlagSet, getenv func(string) string) func(string) string {
	backend := fs.String("sandbox", "", backendUsage)
	network := fs.String("sandbox-network", "", networkUsage)
	return func(name string) string {
		switch {
		case name == BackendVar && *backend != "":
			return *backend
		case name == NetworkVar && *network != "":
			return *network
		}
		return getenv(name)
	}
}

package toolrunner

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/sandbox"
)

// Variables of the sandbox (protocol.md §7, §8).
const (
	SandboxVar        = "FLOE_SANDBOX"
	SandboxNetworkVar = "FLOE_SANDBOX_NETWORK"
	SandboxReadVar    = "FLOE_SANDBOX_READ"
	// SandboxDenyPortsVar lists more Floe ports (comma-separated) tools
	// may not connect to: an external NATS cluster's route and
	// monitoring ports, which the runner cannot discover.
	SandboxDenyPortsVar = "FLOE_SANDBOX_DENY_PORTS"
	ToolMemoryVar       = "FLOE_TOOL_MEMORY_MB"
	ToolPidsVar         = "FLOE_TOOL_PIDS"
)

// SandboxConfig confines every exec_command and stdio MCP server process
// of the runner (protocol.md §7 "Sandbox"). The zero value is the default: the
// strongest backend the host has, network on, 2048 MB and 512 processes
// per call.
type SandboxConfig struct {
	// Backend is "auto" (or ""), "landlock", "bwrap" or "off". A named
	// backend the host cannot give makes Validate fail (fail-closed).
	Backend string
	// Network is "on" (or "") or "off".
	Network string
	// Read are extra read-only directories.
	Read []string
	// DenyPorts are the deployment's Floe listeners (gateway, NATS
	// client/cluster/monitoring, metrics) no tool may connect to, besides
	// the defaults 7364, 4222, 6222 and 8222 and the ports of the NATS
	// servers the runner is connected to, which Run adds.
	DenyPorts []int
	// Hide are credentials files given to the service (the NATS password
	// and creds files), unreadable from tools wherever they lie.
	Hide []string
	// MemoryMB and Pids are the per-call limits (0: 2048 and 512).
	MemoryMB int
	Pids     int
}

// SandboxFromEnv reads FLOE_SANDBOX, FLOE_SANDBOX_NETWORK,
// FLOE_SANDBOX_READ, FLOE_SANDBOX_DENY_PORTS, FLOE_TOOL_MEMORY_MB and
// FLOE_TOOL_PIDS, and hides the
// files of FLOE_NATS_PASSWORD_FILE and FLOE_NATS_CREDS.
func SandboxFromEnv(getenv func(string) string) (SandboxConfig, error) {
	c := SandboxConfig{Backend: getenv(SandboxVar), Network: getenv(SandboxNetworkVar)}
	for _, d := range strings.Split(getenv(SandboxReadVar), ":") {
		if d != "" {
			c.Read = append(c.Read, d)
		}
	}
	for _, v := range []struct {
		name string
		dst  *int
	}{{ToolMemoryVar, &c.MemoryMB}, {ToolPidsVar, &c.Pids}} {
		if s := getenv(v.name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				return c, fmt.Errorf("%w: %s %q must be a positive integer", ErrInvalidConfig, v.name, s)
			}
			*v.dst = n
		}
	}
	for _, p := range strings.FieldsFunc(getenv(SandboxDenyPortsVar), func(r rune) bool { return r == ',' || r == ' ' }) {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return c, fmt.Errorf("%w: %s: %q is not a port", ErrInvalidConfig, SandboxDenyPortsVar, p)
		}
		c.DenyPorts = append(c.DenyPorts, n)
	}
	for _, v := range []string{"FLOE_NATS_PASSWORD_FILE", "FLOE_NATS_CREDS"} {
		if f := getenv(v); f != "" {
			c.Hide = append(c.Hide, f)
		}
	}
	return c, nil
}

// PortOf returns the port of a host:port address or URL, 0 if none.
func PortOf(addr string) int {
	if u, err := url.Parse(addr); err == nil && u.Host != "" {
		addr = u.Host
	}
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}

func (c SandboxConfig) internal() (sandbox.Config, error) {
	b, err := sandbox.ParseBackend(c.Backend)
	if err != nil {
		return sandbox.Config{}, err
	}
	off, err := sandbox.ParseNetwork(c.Network)
	if err != nil {
		return sandbox.Config{}, err
	}
	return sandbox.Config{Backend: b, NetworkOff: off, Read: c.Read, DenyPorts: c.DenyPorts,
		Hide: c.Hide, MemoryMB: c.MemoryMB, Pids: c.Pids}, nil
}

// openSandbox makes the runner's sandbox, adding the ports of nc's
// servers (nil nc: none) to those denied.
func openSandbox(c SandboxConfig, nc *nats.Conn) (*sandbox.Sandbox, error) {
	cfg, err := c.internal()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if nc != nil {
		for _, u := range append(nc.Servers(), nc.ConnectedUrl()) {
			if p := PortOf(u); p > 0 {
				cfg.DenyPorts = append(cfg.DenyPorts, p)
			}
		}
	}
	return sandbox.New(cfg)
}

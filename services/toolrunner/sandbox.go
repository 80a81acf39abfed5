package toolrunner

import (
	"fmt"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/sandbox"
)

// The sandbox's variables (protocol.md §7, §8), read by sandbox.ConfigFromEnv.
const (
	SandboxVar        = sandbox.BackendVar
	SandboxNetworkVar = sandbox.NetworkVar
	SandboxReadVar    = sandbox.ReadVar
	// SandboxDenyPortsVar lists more Floe ports (comma-separated) tools
	// may not connect to: an external NATS cluster's route and
	// monitoring ports, which the runner cannot discover.
	SandboxDenyPortsVar = sandbox.DenyPortsVar
	ToolMemoryVar       = sandbox.MemoryVar
	ToolPidsVar         = sandbox.PidsVar
)

// openSandbox makes the runner's sandbox, adding the ports of nc's
// servers (nil nc: none) to those denied.
func openSandbox(c sandbox.Config, nc *nats.Conn) (*sandbox.Sandbox, error) {
	if _, err := sandbox.ParseBackend(string(c.Backend)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if nc != nil {
		c.DenyPorts = append([]int(nil), c.DenyPorts...)
		c.DenyAddrs(append(nc.Servers(), nc.ConnectedUrl())...)
	}
	return sandbox.New(c)
}

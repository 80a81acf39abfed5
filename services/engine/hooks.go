package engine

import (
	"fmt"
	"slices"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"floe.dev/pkg/sandbox"
	"floe.dev/services/engine/internal/hooks"
)

// Hooks configures the deployment's hooks (protocol.md §7 "Hooks").
type Hooks struct {
	// File is the hooks file (FLOE_HOOKS): user_prompt, pre_tool_use and
	// stop hooks, commands or NATS services. Empty: none.
	File string
	// Sandbox confines every hook command as the toolrunner confines a
	// tool (protocol.md §7: "a hook command runs under the same sandbox as
	// tools"): FromEnv reads it from the same variables
	// (sandbox.ConfigFromEnv), Flags adds --sandbox and --sandbox-network,
	// the mains add the Floe listeners they know of (DenyAddrs), and Run
	// adds the ports of the NATS servers it is connected to. The zero
	// value is the default: auto.
	Sandbox sandbox.Config
}

// openHooks loads the hooks file and, when it names a command, opens
// the sandbox the commands run in, fail-closed: a backend named in
// FLOE_SANDBOX that the host cannot give stops the engine at start. The
// returned func releases the sandbox.
func openHooks(c Hooks, nc *nats.Conn, log zerolog.Logger) (*hooks.Runner, func(), error) {
	if c.File == "" {
		return hooks.New(nil, nc, nil), func() {}, nil
	}
	cfg, err := hooks.Load(c.File)
	if err != nil {
		return nil, nil, fmt.Errorf("engine: FLOE_HOOKS: %w", err)
	}
	if !cfg.HasCommand() {
		return hooks.New(cfg, nc, nil), func() {}, nil
	}
	sc := c.Sandbox
	sc.DenyPorts = slices.Clone(sc.DenyPorts)
	if nc != nil {
		sc.DenyAddrs(append(nc.Servers(), nc.ConnectedUrl())...)
	}
	sb, err := sandbox.New(sc)
	if err != nil {
		return nil, nil, fmt.Errorf("engine: hook commands: %w", err)
	}
	if w := sb.Warning(); w != "" {
		log.Warn().Str("sandbox", string(sb.Backend())).Str("reason", w).Msg("hook sandbox: NONE AVAILABLE, hook commands run unconfined")
	} else {
		mem, pids := sb.Limits()
		log.Info().Str("sandbox", string(sb.Backend())).Str("network", sb.Network()).
			Int("memory_mb", mem).Int("pids", pids).Msg("hook sandbox")
	}
	return hooks.New(cfg, nc, sb), sb.Close, nil
}

package server

import (
	"context"
	"sync"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/gateway/client"
)

// How long a runner's sandbox answer is reused, and how long to wait for
// one. A Session's tools run on any runner of its pool; every runner of a
// deployment shares one configuration, so one answer speaks for them.
const (
	sandboxTTL     = 5 * time.Second
	sandboxMissTTL = time.Second
	sandboxWait    = time.Second
)

// sandboxCache holds the last answer of the default pool's runners.
type sandboxCache struct {
	mu      sync.Mutex
	info    *client.Sandbox // nil: no runner answered
	fetched time.Time
}

// sandbox returns the tool confinement the default pool's runners report
// (a servers-only tool list request, answered at once), nil when none
// answers.
func (s *Server) sandbox(ctx context.Context) *client.Sandbox {
	c := &s.sandboxes
	c.mu.Lock()
	defer c.mu.Unlock()
	ttl := sandboxTTL
	if c.info == nil {
		ttl = sandboxMissTTL
	}
	if !c.fetched.IsZero() && time.Since(c.fetched) < ttl {
		return c.info
	}
	c.info, c.fetched = nil, time.Now()
	body, err := omni.Pack(&omni.ToolListRequest{ServersOnly: true})
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, sandboxWait)
	defer cancel()
	resp, err := s.nc.RequestWithContext(ctx, "floe.toollist."+omni.DefaultPool, body)
	if err != nil {
		return nil
	}
	var list omni.ToolList
	if err := omni.Unpack(resp.Data, &list); err != nil || list.Sandbox == nil {
		return nil
	}
	c.info = &client.Sandbox{Backend: list.Sandbox.Backend, Network: list.Sandbox.Network}
	return c.info
}

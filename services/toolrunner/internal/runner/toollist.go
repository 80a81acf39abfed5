package runner

import (
	"context"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// listLoop answers tool list requests from ch until stop is closed, each
// with an omni.ToolList. The subscription is in a queue group, so one
// runner of the pool answers each request. Listing may connect MCP
// servers; stop ends the wait for them.
func (r *runner) listLoop(ch <-chan *nats.Msg, stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	watcher := make(chan struct{})
	go func() {
		defer close(watcher)
		select {
		case <-stop:
		case <-ctx.Done():
		}
		cancel()
	}()
	defer func() {
		cancel()
		<-watcher // Run waits for this loop, so for its helper too
	}()
	for {
		select {
		case <-stop:
			return
		case m := <-ch:
			if m.Reply == "" {
				continue
			}
			var req omni.ToolListRequest
			if len(m.Data) > 0 {
				if err := omni.Unpack(m.Data, &req); err != nil {
					r.log.Warn().Err(err).Msg("undecodable tool list request; answering it in full")
				}
			}
			list := omni.ToolList{Runner: r.cfg.RunnerID, Servers: r.cfg.Tools.Servers(), Sandbox: r.cfg.Sandbox}
			if !req.ServersOnly {
				list.Tools, list.MCP = r.cfg.Tools.List(ctx)
				if ctx.Err() != nil {
					return
				}
			}
			nm, err := bus.PackMsg(m.Reply, list)
			if err == nil {
				err = r.nc.PublishMsg(nm)
			}
			if err != nil {
				r.log.Warn().Err(err).Msg("tool list reply failed")
			}
		}
	}
}

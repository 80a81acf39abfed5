package runner

import (
	"github.com/nats-io/nats.go"

	"floe.dev/pkg/bus"
)

// listLoop answers tool list requests from ch until stop is closed. The
// subscription is in a queue group, so one runner of the pool answers each
// request.
func (r *runner) listLoop(ch <-chan *nats.Msg, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case m := <-ch:
			if m.Reply == "" {
				continue
			}
			nm, err := bus.PackMsg(m.Reply, r.specs)
			if err == nil {
				err = r.nc.PublishMsg(nm)
			}
			if err != nil {
				r.log.Warn().Err(err).Msg("tool list reply failed")
			}
		}
	}
}

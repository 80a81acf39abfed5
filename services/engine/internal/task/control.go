package task

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"floe.dev/pkg/omni"
)

// control is the Task's control inbox, floe.ctl.<sid>.<verb> for the
// Task's lifetime: approve (a pending call of this Task or of a child),
// abort, steer, retry-now and pending. Steering is queued here until the
// agent loop takes it into the next request.
//
// Concurrency: Run opens the inbox, stops intake before the Session is
// released, and closes it; every request is served on the inbox's one
// goroutine, which never waits on the Task (approve hands the decision to
// a 1-buffered channel; a child's approval is a NATS request to the
// child's engine). The agent loop takes steering. mu guards steering and
// closed.
type control struct {
	nc     *nats.Conn
	sid    string
	log    zerolog.Logger
	appr   *approvals
	subs   *subagents
	abort  *abortScope
	ladder *ladder
	in     *inbox

	mu       sync.Mutex
	steering []string
	// closed: the run is ending and takes no more steering (a steer then
	// is refused, never accepted and dropped).
	closed bool
}

// allowStoreTimeout bounds storing a tool allowed for the Session.
const allowStoreTimeout = 5 * time.Second

// open starts serving control requests.
func (c *control) open() error {
	in, err := openInbox(c.nc, omni.ControlSubject(c.sid, "*"), 64, c.serve)
	if err != nil {
		return err
	}
	c.in = in
	return nil
}

// stopIntake unsubscribes: a client that saw the Task end finds no
// responder, and a Task started next (on any engine) is the only one
// answering.
func (c *control) stopIntake() { c.in.unsubscribe() }

// close stops serving and waits for the inbox's goroutine.
func (c *control) close() {
	if c.in != nil {
		c.in.close()
	}
}

// serve answers one control request.
func (c *control) serve(m *nats.Msg) {
	var ctl omni.Control
	if len(m.Data) > 0 {
		if err := omni.Unpack(m.Data, &ctl); err != nil {
			c.reply(m, omni.ControlReply{Code: omni.CodeBadRequest, Message: err.Error()})
			return
		}
	}
	verb := m.Subject[len(omni.ControlSubject(c.sid, "")):]
	switch verb {
	case omni.CtlApprove:
		if ctl.Decision != omni.DecisionAllow && ctl.Decision != omni.DecisionDeny {
			c.reply(m, omni.ControlReply{Code: omni.CodeBadRequest, Message: "decision must be allow or deny"})
			return
		}
		if ctl.Scope != "" && (ctl.Scope != omni.ScopeSession || ctl.Decision != omni.DecisionAllow) {
			c.reply(m, omni.ControlReply{Code: omni.CodeBadRequest, Message: "scope must be session, with decision allow"})
			return
		}
		if ctl.Scope == omni.ScopeSession {
			ctx, cancel := context.WithTimeout(context.Background(), allowStoreTimeout)
			ok, err := c.appr.allowForSession(ctx, ctl.ToolCallID)
			cancel()
			if err != nil {
				c.reply(m, omni.ControlReply{Code: omni.CodeInternal, Message: "could not store the allowed tool: " + err.Error()})
				return
			}
			if ok {
				c.reply(m, omni.ControlReply{OK: true})
				return
			}
		} else if c.appr.resolve(ctl.ToolCallID, ctl.Decision) {
			c.reply(m, omni.ControlReply{OK: true})
			return
		}
		if rep, ok := c.subs.forwardApproval(ctl); ok {
			c.reply(m, rep)
			return
		}
		c.reply(m, omni.ControlReply{Code: omni.CodeNotFound, Message: "no pending approval for " + ctl.ToolCallID})
	case omni.CtlAbort:
		c.abort.byUser()
		c.reply(m, omni.ControlReply{OK: true})
	case omni.CtlSteer:
		if !c.steer(ctl.Text) {
			c.reply(m, omni.ControlReply{Code: omni.CodeNotRunning, Message: "the run is ending; steering was not taken"})
			return
		}
		c.reply(m, omni.ControlReply{OK: true})
	case omni.CtlRetryNow:
		c.reply(m, omni.ControlReply{OK: true, Skipped: c.ladder.retryNow()})
	case omni.CtlPending:
		p := append(c.appr.pendingEvents(), c.subs.pendingEvents()...)
		c.reply(m, omni.ControlReply{OK: true, Pending: p})
	default:
		c.reply(m, omni.ControlReply{Code: omni.CodeBadRequest, Message: "unknown control verb " + verb})
	}
}

func (c *control) reply(m *nats.Msg, rep omni.ControlReply) {
	if m.Reply == "" {
		return
	}
	b, err := omni.Pack(&rep)
	if err == nil {
		err = m.Respond(b)
	}
	if err != nil {
		c.log.Warn().Err(err).Msg("control reply failed")
	}
}

// steer queues steering text; false when the run takes no more.
func (c *control) steer(text string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.steering = append(c.steering, text)
	return true
}

// takeSteering returns the queued steering and empties the queue. With
// orClose, when nothing is queued it closes steering intake in the same
// critical section (the end of a run), so a steer arriving later is
// refused instead of accepted and never delivered.
func (c *control) takeSteering(orClose bool) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	queued := c.steering
	c.steering = nil
	if orClose && len(queued) == 0 {
		c.closed = true
	}
	return queued
}

// closeSteering stops taking steering and returns what is still queued.
func (c *control) closeSteering() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	queued := c.steering
	c.steering, c.closed = nil, true
	return queued
}

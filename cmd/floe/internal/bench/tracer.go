package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
)

// TracerResult is the tracer's rate over Sessions new Sessions of one day:
// Records Trace records in all (each Session starting with its
// session_meta), with a partial published beside every record (the stream
// carries more than the Trace classes), published while the tracer runs.
// Up to 100 Sessions take turns record by record (Sessions running at
// once); more come one after another, as the Sessions created through a
// day do.
type TracerResult struct {
	Sessions, Records int
	Interleaved       bool
	Elapsed           time.Duration // first publish → the tracer's ack floor at the last message
	Rate              float64       // records per second
}

func runTracer(ctx context.Context, c *Config, p *progress) ([]TracerResult, error) {
	var out []TracerResult
	for _, n := range c.TracerSessions {
		r, err := tracerShape(ctx, c, p, n, max(c.TracerRecords/n, 2))
		if err != nil {
			return nil, fmt.Errorf("tracer at %d Sessions: %w", n, err)
		}
		out = append(out, *r)
	}
	return out, nil
}

func tracerShape(ctx context.Context, c *Config, p *progress, sessions, per int) (*TracerResult, error) {
	e, err := startEnv(ctx, c.root, fmt.Sprintf("tracer-%d", sessions), true, c.Log)
	if err != nil {
		return nil, err
	}
	defer e.stop()
	ctx, cancel := context.WithTimeout(ctx, 8*time.Minute)
	defer cancel()
	res := &TracerResult{Sessions: sessions, Records: sessions * per, Interleaved: sessions <= 100}
	day := time.Now().UTC()
	sids := make([]string, sessions)
	for i := range sids {
		sids[i] = fmt.Sprintf("session-%s-%08x", day.Format("2006-01-02-15-04-05"), i)
	}
	text := strings.Repeat("lorem ipsum ", 5)
	msgs := func(i, r int) ([]*nats.Msg, error) {
		sid := sids[i]
		var recs []omni.Message
		if r == 0 {
			recs = []omni.Message{omni.SessionMeta(omni.Meta{SessionID: sid, Provider: "scripted", ModelID: "demo", ModelContextWindow: 128000})}
		} else {
			recs = []omni.Message{omni.Partial(omni.TypeText, omni.EventDelta, text, "", ""), omni.UserText(text)}
		}
		out := make([]*nats.Msg, len(recs))
		for k := range recs {
			m, err := bus.SessionMsg(sid, &recs[k], "")
			if err != nil {
				return nil, err
			}
			out[k] = m
		}
		return out, nil
	}
	var all []*nats.Msg
	add := func(i, r int) error {
		ms, err := msgs(i, r)
		all = append(all, ms...)
		return err
	}
	for a := range sessions * per {
		i, r := a/per, a%per
		if res.Interleaved {
			i, r = a%sessions, a/sessions
		}
		if err := add(i, r); err != nil {
			return nil, err
		}
	}
	p.logf("tracer %d Sessions: %d records (%d messages)", sessions, res.Records, len(all))
	t0 := time.Now()
	for _, m := range all {
		if err := e.publishAsync(ctx, m); err != nil {
			return nil, err
		}
	}
	if err := e.flush(ctx); err != nil {
		return nil, err
	}
	s, err := e.js.Stream(ctx, omni.SessionsStream)
	if err != nil {
		return nil, err
	}
	last := s.CachedInfo().State.LastSeq
	cons, err := e.js.Consumer(ctx, omni.SessionsStream, "floe-tracer")
	if err != nil {
		return nil, fmt.Errorf("bench: tracer consumer: %w", err)
	}
	if err := waitFor(ctx, 7*time.Minute, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.AckFloor.Stream >= last
	}); err != nil {
		return nil, fmt.Errorf("bench: waiting for the tracer: %w", err)
	}
	res.Elapsed = time.Since(t0)
	res.Rate = float64(res.Records) / res.Elapsed.Seconds()
	return res, nil
}

package bench

import (
	"context"
	"fmt"
	"runtime/pprof"
	"strconv"
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
	Published         time.Duration // first publish → the last publish acknowledged
	Rate              float64       // records per second
}

func runTracer(ctx context.Context, c *Config, p *progress) ([]TracerResult, error) {
	var out []TracerResult
	for _, n := range c.TracerSessions {
		// Each shape starts with nothing left to write back from the
		// scenarios before it (their streams and homes are removed).
		syncDisks()
		var r *TracerResult
		var err error
		// Labelled, so a --cpuprofile splits by shape: goroutines the
		// shape's env starts (nats-server, tracer) inherit the label.
		pprof.Do(ctx, pprof.Labels("tracer_sessions", strconv.Itoa(n)), func(ctx context.Context) {
			r, err = tracerShape(ctx, c, p, n, max(c.TracerRecords/n, 2))
		})
		if err != nil {
			return nil, fmt.Errorf("tracer at %d Sessions: %w", n, err)
		}
		out = append(out, *r)
	}
	return out, nil
}

// tracerWarmup is how many Sessions (of 10 records) each shape traces
// before it is timed.
const tracerWarmup = 10

// tracerMsgs builds the messages of sessions Sessions of per records each,
// created on day (the ids' date part), their ids' hex parts counting from
// first: every
// record (a session_meta first, then user texts) with a partial published
// just before it, so every shape publishes two messages per record.
// Interleaved takes the Sessions in turns record by record, otherwise one
// after another.
func tracerMsgs(day string, first, sessions, per int, interleaved bool) ([]*nats.Msg, error) {
	text := strings.Repeat("lorem ipsum ", 5)
	all := make([]*nats.Msg, 0, 2*sessions*per)
	for a := range sessions * per {
		i, r := a/per, a%per
		if interleaved {
			i, r = a%sessions, a/sessions
		}
		sid := fmt.Sprintf("session-%s-%08x", day, first+i)
		rec := omni.UserText(text)
		if r == 0 {
			rec = omni.SessionMeta(omni.Meta{SessionID: sid, Provider: "scripted", ModelID: "demo", ModelContextWindow: 128000})
		}
		for _, m := range []omni.Message{omni.Partial(omni.TypeText, omni.EventDelta, text, "", ""), rec} {
			nm, err := bus.SessionMsg(sid, &m, "")
			if err != nil {
				return nil, err
			}
			all = append(all, nm)
		}
	}
	return all, nil
}

// publishTraced publishes msgs (async, one connection) and waits until the
// tracer's ack floor reaches the last of them; it returns how long the
// publishing took (until every publish was acknowledged).
func publishTraced(ctx context.Context, e *env, msgs []*nats.Msg) (time.Duration, error) {
	t0 := time.Now()
	for _, m := range msgs {
		if err := e.publishAsync(ctx, m); err != nil {
			return 0, err
		}
	}
	if err := e.flush(ctx); err != nil {
		return 0, err
	}
	published := time.Since(t0)
	last, err := bus.LastSeq(ctx, e.js)
	if err != nil {
		return 0, err
	}
	cons, err := e.js.Consumer(ctx, omni.SessionsStream, "floe-tracer")
	if err != nil {
		return 0, fmt.Errorf("bench: tracer consumer: %w", err)
	}
	if err := waitFor(ctx, 7*time.Minute, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.AckFloor.Stream >= last
	}); err != nil {
		return 0, fmt.Errorf("bench: waiting for the tracer: %w", err)
	}
	return published, nil
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
	day := time.Now().UTC().Format("2006-01-02-15-04-05")
	// The same warm-up in every shape, traced before the clock starts: the
	// tracer's consumer is set up and the day's directory exists.
	warm, err := tracerMsgs(day, 0xf0000000, tracerWarmup, 10, true)
	if err != nil {
		return nil, err
	}
	all, err := tracerMsgs(day, 0, sessions, per, res.Interleaved)
	if err != nil {
		return nil, err
	}
	if _, err := publishTraced(ctx, e, warm); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	p.logf("tracer %d Sessions: %d records (%d messages)", sessions, res.Records, len(all))
	t0 := time.Now()
	if res.Published, err = publishTraced(ctx, e, all); err != nil {
		return nil, err
	}
	res.Elapsed = time.Since(t0)
	p.logf("tracer %d Sessions: published in %v, traced in %v", sessions, res.Published.Round(time.Millisecond), res.Elapsed.Round(time.Millisecond))
	res.Rate = float64(res.Records) / res.Elapsed.Seconds()
	return res, nil
}

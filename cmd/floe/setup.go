package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/omni"
	"floe.dev/services/engine"
)

// cmdSetup creates or updates the JetStream layout (streams and the Session
// bucket) on an external NATS, retrying while the cluster has no JetStream
// leader yet. Deployments whose service users may not manage streams run it
// once with an admin user and start the services with FLOE_SETUP=false.
func cmdSetup(ctx context.Context, args []string) error {
	fs := newFlags("setup")
	c := newCommon("off")
	c.flagNATS(fs, false)
	c.flagLayout(fs)
	wait := fs.Duration("wait", time.Minute, "how long to retry while JetStream is not available yet")
	if err := parse(fs, args); err != nil {
		return err
	}
	if c.natsURL == "" {
		return errors.New("--nats (or FLOE_NATS_URL) is required")
	}
	busCfg, err := c.busConfig()
	if err != nil {
		return err
	}
	opts, err := c.auth.options()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *wait)
	defer cancel()
	var lastErr error
	for {
		lastErr = setupOnce(ctx, c.natsURL, opts, busCfg)
		if lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("setup did not succeed within %v: %w", *wait, lastErr)
		case <-time.After(time.Second):
		}
	}
}

func setupOnce(ctx context.Context, url string, opts []nats.Option, busCfg bus.Config) error {
	nc, err := nats.Connect(url, append([]nats.Option{nats.Name("floe-setup")}, opts...)...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if busCfg.Replicas <= 0 {
		if st, err := js.Stream(actx, omni.SessionsStream); err == nil {
			busCfg.Replicas = st.CachedInfo().Config.Replicas
		}
	}
	if _, err := bus.Setup(actx, js, busCfg); err != nil {
		return err
	}
	// The shared task consumer belongs to the layout too: its ack wait
	// (FLOE_ENGINE_ACK_WAIT_MS) is set here, and engines keep to it.
	ecfg, err := engine.FromEnv(os.Getenv)
	if err != nil {
		return err
	}
	if err := ecfg.Validate(); err != nil {
		return err
	}
	if _, err := js.CreateOrUpdateConsumer(actx, omni.TasksStream, engine.TaskConsumerConfig(ecfg.Durable, ecfg.AckWait)); err != nil {
		return fmt.Errorf("task consumer: %w", err)
	}
	fmt.Fprintf(os.Stdout, "%-18s ack_wait=%v\n", ecfg.Durable, ecfg.AckWait)
	for _, name := range []string{omni.SessionsStream, omni.TasksStream, omni.ToolsStream, "KV_" + omni.SessionsBucket} {
		st, err := js.Stream(actx, name)
		if err != nil {
			return err
		}
		info := st.CachedInfo()
		fmt.Fprintf(os.Stdout, "%-18s replicas=%d storage=%s messages=%d\n", name, info.Config.Replicas, info.Config.Storage, info.State.Msgs)
	}
	return nil
}

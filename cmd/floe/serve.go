package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"floe.dev/cmd/floe/internal/stack"
)

func cmdServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("floe serve", flag.ContinueOnError)
	var c common
	c.register(fs, "127.0.0.1:4222")
	if err := fs.Parse(args); err != nil {
		return err
	}
	busCfg, err := c.busConfig()
	if err != nil {
		return err
	}
	eng, err := engineConfig(&c)
	if err != nil {
		return err
	}
	gw, err := gatewayConfig(&c)
	if err != nil {
		return err
	}
	log := c.logger("")
	st, err := stack.Start(ctx, stack.Options{
		Home: c.home, NatsURL: c.natsURL, Listen: c.listen, Bus: busCfg,
		Engine: eng, Toolrunner: toolrunnerConfig(), Tracer: tracerConfig(&c), Gateway: gw,
	}, log)
	if err != nil {
		return err
	}
	nats := c.natsURL
	if st.Server != nil {
		nats = st.Server.ClientURL()
	}
	fmt.Fprintf(os.Stderr, "floe serve: http://%s  nats: %s  home: %s\n", c.httpAddr, orNone(nats), c.home)
	<-ctx.Done()
	st.Stop()
	return st.Err()
}

func orNone(s string) string {
	if s == "" {
		return "(in-process only)"
	}
	return s
}

func cmdService(ctx context.Context, name string, args []string) error {
	fs := flag.NewFlagSet("floe "+name, flag.ContinueOnError)
	var c common
	c.register(fs, "off")
	pool := fs.String("pool", "", "tool runner pool (engine and toolrunner)")
	concurrency := fs.Int("concurrency", 0, "concurrent tool jobs (toolrunner)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.natsURL == "" {
		return fmt.Errorf("--nats (or FLOE_NATS_URL) is required: this runs one service against an external NATS")
	}
	busCfg, err := c.busConfig()
	if err != nil {
		return err
	}
	o := stack.Options{Home: c.home, NatsURL: c.natsURL, Bus: busCfg}
	switch name {
	case "engine":
		if o.Engine, err = engineConfig(&c); err != nil {
			return err
		}
		if *pool != "" {
			o.Engine.Pool = *pool
		}
	case "toolrunner":
		o.Toolrunner = toolrunnerConfig()
		if *pool != "" {
			o.Toolrunner.Pool = *pool
		}
		if *concurrency > 0 {
			o.Toolrunner.Concurrency = *concurrency
		}
	case "tracer":
		o.Tracer = tracerConfig(&c)
	case "gateway":
		if o.Gateway, err = gatewayConfig(&c); err != nil {
			return err
		}
	}
	st, err := stack.Start(ctx, o, c.logger(name))
	if err != nil {
		return err
	}
	<-ctx.Done()
	st.Stop()
	return st.Err()
}

package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/bus/embed"
	"floe.dev/services/engine"
	"floe.dev/services/toolrunner"
)

func cmdServe(ctx context.Context, args []string) error {
	fs := newFlags("serve")
	c := newCommon("127.0.0.1:4222")
	c.flagHome(fs)
	c.flagHTTP(fs)
	c.flagNATS(fs, true)
	c.flagModel(fs, "default model of Sessions created without one:")
	c.flagLayout(fs)
	c.flagLog(fs)
	c.flagSandbox(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	busCfg, err := c.busConfig()
	if err != nil {
		return err
	}
	eng, err := engineConfig(c)
	if err != nil {
		return err
	}
	gw, err := gatewayConfig(c)
	if err != nil {
		return err
	}
	gw.CheckModel = func(ref string) error { return checkModel(eng, ref) }
	connect, err := c.auth.options()
	if err != nil {
		return err
	}
	trc, err := toolrunnerConfig(c)
	if err != nil {
		return err
	}
	tr, err := tracerConfig(c)
	if err != nil {
		return err
	}
	if err := checkFree(c.httpAddr, "FLOE_HTTP_ADDR / --http"); err != nil {
		return err
	}
	if c.natsURL == "" {
		if err := checkFree(c.listen, "FLOE_NATS_LISTEN / --nats-listen"); err != nil {
			return err
		}
	}
	log := c.logger()
	st, err := stack.Start(ctx, stack.Options{
		Home: c.home, NatsURL: c.natsURL, Listen: c.listen, Bus: busCfg, Connect: connect,
		OpenNATS: !envBool("FLOE_NATS_AUTH", true),
		Engine:   eng, Toolrunner: trc, Tracer: tr, Gateway: gw,
	}, log)
	if err != nil {
		return err
	}
	nats := c.natsURL
	if st.Server != nil {
		nats = st.Server.ClientURL()
	}
	// Say where it serves once it does: a client started on this line
	// (a script, floe chat --server) must find the API there.
	if err := waitListening(c.httpAddr, st.Failed()); err != nil {
		st.Stop()
		if e := st.Err(); e != nil {
			return e
		}
		return err
	}
	fmt.Fprintf(os.Stderr, "floe serve: http://%s  nats: %s  home: %s\n", c.httpAddr, orNone(nats), c.home)
	if st.Server != nil && st.Server.Authenticated() && nats != "" {
		if err := printNATSContexts(st, c.home, nats); err != nil {
			st.Stop()
			return err
		}
	}
	return serveUntil(ctx, st)
}

// printNATSContexts writes the nats CLI contexts of the embedded server's
// ops (read-only), admin and hook (a NATS hook service's) users and says
// how to use them.
func printNATSContexts(st *stack.Stack, home, url string) error {
	dir := stack.CredentialsDir(home)
	paths, err := embed.WriteContexts(dir, url, st.Server.Credentials(), embed.UserOps, embed.UserAdmin, embed.UserHook)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "floe serve: NATS requires a user; for the nats CLI: nats --context %s stream ls  (read-only ops; admin: %s; a NATS hook service: %s; passwords in %s)\n",
		paths[0], paths[1], paths[2], dir)
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "(in-process only)"
	}
	return s
}

func cmdService(ctx context.Context, _ context.CancelFunc, name string, args []string) (int, error) {
	return 0, service(ctx, name, args)
}

func service(ctx context.Context, name string, args []string) error {
	fs := newFlags(name)
	c := newCommon("off")
	c.flagNATS(fs, false)
	c.flagLayout(fs)
	c.flagLog(fs)
	// The service's own flags (its Config.Flags: --home, --pool, --http, …)
	// are bound to its Config read from the environment (FromEnv), so a
	// flag beats its variable, which beats the default.
	var o stack.Options
	var err error
	switch name {
	case "engine":
		cfg, err := engine.FromEnv(os.Getenv)
		if err != nil {
			return err
		}
		cfg.Home = c.home
		o.Engine = &cfg
		o.Engine.Flags(fs)
	case "toolrunner":
		cfg, err := toolrunner.FromEnv(os.Getenv)
		if err != nil {
			return err
		}
		o.Toolrunner = &cfg
		o.Toolrunner.Flags(fs)
	case "tracer":
		if o.Tracer, err = tracerConfig(c); err != nil {
			return err
		}
		o.Tracer.Flags(fs)
	case "gateway":
		if o.Gateway, err = gatewayConfig(c); err != nil {
			return err
		}
		o.Gateway.Flags(fs)
	}
	setup := fs.Bool("setup", envBool("FLOE_SETUP", true), "create or update the JetStream layout at start; false waits for it (FLOE_SETUP)")
	metricsAddr := fs.String("metrics", os.Getenv("FLOE_METRICS_ADDR"), "serve Prometheus metrics on http://ADDR/metrics (FLOE_METRICS_ADDR; the gateway also serves them on its HTTP port)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if c.natsURL == "" {
		return fmt.Errorf("--nats (or FLOE_NATS_URL) is required: this runs one service against an external NATS")
	}
	busCfg, err := c.busConfig()
	if err != nil {
		return err
	}
	connect, err := c.auth.options()
	if err != nil {
		return err
	}
	switch name {
	case "engine":
		c.home = o.Engine.Home
		denyPorts(&o.Engine.Hooks.Sandbox, c, *metricsAddr)
		if err := o.Engine.Validate(); err != nil {
			return err
		}
	case "toolrunner":
		denyPorts(&o.Toolrunner.Sandbox, c, *metricsAddr)
		if err := o.Toolrunner.Validate(); err != nil {
			return err
		}
	case "tracer":
		c.home = o.Tracer.Home
	case "gateway":
		c.home, c.httpAddr = o.Gateway.Home, o.Gateway.Addr
		if err := checkFree(c.httpAddr, "FLOE_HTTP_ADDR / --http"); err != nil {
			return err
		}
	}
	// Each service gets replies on its own inbox prefix, so its NATS user
	// can be allowed to subscribe to _INBOX.<service>.> only.
	o.Home, o.NatsURL, o.Bus, o.Connect = c.home, c.natsURL, busCfg, connect
	o.InboxPrefix, o.NoSetup, o.MetricsAddr = "_INBOX."+name, !*setup, *metricsAddr
	st, err := stack.Start(ctx, o, c.logger()) // each service names itself in its log lines
	if err != nil {
		return err
	}
	return serveUntil(ctx, st)
}

// serveUntil serves with st until ctx ends or a service stops on its own
// (the gateway cannot listen, say): the command then ends with that
// service's error instead of serving a partial stack.
func serveUntil(ctx context.Context, st *stack.Stack) error {
	select {
	case <-ctx.Done():
	case <-st.Failed():
	}
	st.Stop()
	return st.Err()
}

// waitListening waits (bounded) until addr accepts connections, or failed
// closes.
func waitListening(addr string, failed <-chan struct{}) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the gateway is not listening on %s after 30 s: %v", addr, err)
		}
		select {
		case <-failed:
			return fmt.Errorf("the gateway stopped before listening on %s", addr)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

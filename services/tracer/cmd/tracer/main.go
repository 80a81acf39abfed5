// Command tracer runs Floe's tracer alone against an external NATS: the
// entry point of a tracer container image. It is `floe tracer` without the
// rest of the binary. It writes every Session's Trace under
// $FLOE_HOME/traces (share that volume with the gateways, which serve
// history from it). One tracer writes a home at a time; a second one on the
// same home waits as a hot standby. Flags beat FLOE_* variables:
//
//	tracer --nats nats://n1:4222,nats://n2:4222 --home /data
//
// Settings: --nats (FLOE_NATS_URL, required), --home (FLOE_HOME, required),
// --log-level (FLOE_LOG_LEVEL).
//
// Credentials: --nats-creds FILE (FLOE_NATS_CREDS), or --nats-user NAME
// (FLOE_NATS_USER) whose password comes from FLOE_NATS_PASSWORD or
// --nats-password-file FILE (FLOE_NATS_PASSWORD_FILE), never from a flag.
// Replies come on _INBOX.tracer.>, the prefix deploy/nats/auth.conf grants
// the tracer user. It waits until the JetStream layout exists (`floe
// setup`).
package main

import (
	"floe.dev/pkg/bus/svc"
	"floe.dev/services/tracer"
)

func main() {
	svc.Service[tracer.Config]{
		Name:     "tracer",
		FromEnv:  tracer.FromEnv,
		Flags:    (*tracer.Config).Flags,
		Validate: (*tracer.Config).Validate,
		Prepare:  func(cfg *tracer.Config, m *svc.Main) { cfg.Metrics = m.Metrics() },
		Run:      tracer.Run,
	}.Exit()
}

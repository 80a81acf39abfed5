// Package gwe2e holds Floe's gateway end-to-end tests: the real engine,
// tool runner, tracer and gateway on a real embedded nats-server, driven
// over real HTTP through the gateway client (floe.dev/services/gateway/client)
// and checked against what JetStream and the Trace files hold; and the
// `floe serve` and `floe attach` binaries as separate processes, stopped with
// a signal and started again on the same home.
//
// The scripted model plays every answer, so each test says exactly what the
// model streams and, through expect_* matchers and estimated token usage,
// what it was fed.
package gwe2e

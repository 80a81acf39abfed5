// Package e2e holds Floe's end-to-end tests: the engine, tool runners and
// tracer in one process on a real embedded nats-server, driven by the
// scripted model, asserting the stream read back from JetStream and the
// Trace files.
package e2e

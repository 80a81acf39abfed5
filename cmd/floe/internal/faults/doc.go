// Package faults holds Floe's multi-process fault tests: real nats-server
// nodes and real `floe engine|toolrunner|tracer|gateway` processes on
// 127.0.0.1 free ports, each service under its own least-privilege NATS
// user (deploy/nats/auth.conf), killed with SIGKILL mid-Session to check
// that nothing is lost or duplicated, tool call pairing stays intact and
// every Session ends in a defined state. It also measures tool throughput
// as runners are added, checks runner pool routing, and runs
// scripts/replay-session against `floe serve`.
//
// TestMain builds the floe binary, the per-service binaries and
// nats-server once; every wait is bounded and every process is killed at
// cleanup. The package has no non-test code besides this comment.
package faults

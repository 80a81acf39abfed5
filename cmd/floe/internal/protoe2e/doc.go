// Package protoe2e checks Floe's standard protocols (protocol.md §9) with the stock
// clients: the npm packages @ag-ui/client (HttpAgent and its event
// verifier) and @a2a-js/sdk, driven by Node's built-in test runner against
// a whole Floe in one process (embedded nats-server, engine, tool runner,
// tracer) with two gateway replicas on one bus, one of which the tests
// restart mid-run.
//
// The npm packages are installed by scripts/test into the directory named
// by FLOE_PROTOCOL_CLIENTS (its node_modules); without that variable the
// test looks in $HOME/.cache/floe-npm/protocols and is skipped when the
// packages are not there.
package protoe2e

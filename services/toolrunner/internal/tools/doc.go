// Package tools holds the passive built-in tools the toolrunner executes:
// exec_command, read_file, write_file and edit_file (protocol.md §7).
//
// A tool is passive: it gets a context and one call and produces output; the
// toolrunner owns the consume loop, concurrency, acks and retries. Every call
// goes through [Registry.Execute], which validates the arguments against the
// tool's JSON Schema, applies the timeout, caps the output and streams it to
// an [Emit] callback. Execute never panics and never returns a Go error: a
// failing tool is a [Result] with Failed set.
//
// # Output
//
// The fragments Execute passes to emit are valid UTF-8 and, concatenated,
// equal Result.Output exactly. The text a tool produces keeps its first
// Options.MaxOutput characters (runes, never split); the rest is drained and
// counted, and replaced by [TruncationMarker]. Status notes follow the text:
// [ExitCodeNote], [TimeoutNote], "[canceled]" and "[tool panicked: …]". A
// marker or note starts on its own line: Execute puts "\n" before it unless
// the output so far is empty or ends in a newline. A call that produced no
// output at all gets [NoOutput].
//
// # Paths
//
// Paths are absolute or relative to the call's Workspace. They are cleaned,
// the symbolic links of their existing part are resolved, and anything that
// then lies outside the (equally resolved) Workspace is refused with
// `path "…" is outside the workspace`. The check and the operation are two
// steps, so a symlink swapped in between by a concurrent process is not
// caught; the Workspace is not a security sandbox.
package tools

// Package trace is the one home of a Session's Trace on disk (protocol.md §5):
// the file layout ($FLOE_HOME/traces/<yyyy-mm-dd>/<sid>_<nnn>.jsonl), the
// tracer's positions (Pos, in one table: $FLOE_HOME/tracer/positions), the
// import marks that say where an imported Trace landed (MarkImported), the
// tolerant line reader (Read), and the one reader of a Session's history
// that everything else uses: the Trace up to the tracer's position, then
// the FLOE_SESSIONS stream after it (Load, as the records' bytes; Replay
// hands the same records, decoded, to a callback as it reads them, which
// is how the engine resumes without holding the history).
//
// Only the tracer appends to or deletes Trace files and writes positions;
// an import lands a new Session's file 001 whole (and its mark), which the
// tracer then appends to. Everything else reads them. pkg/omni stays plain
// data and pure functions.
package trace

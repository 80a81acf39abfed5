// Package trace is the one home of a Session's Trace on disk (SPEC §5):
// the file layout ($FLOE_HOME/traces/<yyyy-mm-dd>/<sid>_<nnn>.jsonl), the
// tracer's positions (Pos, in one table: $FLOE_HOME/tracer/positions), the
// tolerant line reader (Read), and the one reader of a Session's history
// that everything else uses: the Trace up to the tracer's position, then
// the FLOE_SESSIONS stream after it (Load, LoadHistory; Replay hands the
// same records to a callback as it reads them, which is how the engine
// resumes without holding the history).
//
// Only the tracer writes or deletes Trace and position files; everything
// else reads them. pkg/omni stays plain data and pure functions.
package trace

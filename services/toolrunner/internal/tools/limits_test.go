package tools

import (
	"strings"
	"testing"
)

// With the default limits (2048 MB, 512 processes), a 3 GiB allocation
// and a 2,000-process loop end failed, the output naming the limit
// (protocol.md §7).
func TestExecCommandOverALimitEndsFailedNamingIt(t *testing.T) {
	r := Builtin(Options{})
	for _, tt := range []struct {
		name, cmd, want string
	}{
		// tail keeps a line that has no newline whole: 3 GiB touched.
		{"3 GiB", "head -c 3G /dev/zero | tail -n 1 >/dev/null; echo survived", "FLOE_TOOL_MEMORY_MB"},
		{"2000 processes", "for i in $(seq 2000); do sleep 100 & done; wait; echo survived", "FLOE_TOOL_PIDS"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := execute(t, t.Context(), r, Call{
				Name:      "exec_command",
				Arguments: args(t, map[string]any{"description": "test", "cmd": tt.cmd, "timeout_ms": 120000}),
				Workspace: t.TempDir(),
			})
			if !res.Failed || !strings.Contains(res.Output, tt.want) || strings.Contains(res.Output, "survived") {
				t.Errorf("exec_command %q = %+v, want failed naming %s", tt.cmd, res, tt.want)
			}
		})
	}
}

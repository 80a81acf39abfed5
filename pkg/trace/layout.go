package trace

import (
	"fmt"
	"path/filepath"
	"strconv"
	"time"
)

// Dir returns $FLOE_HOME/traces/<yyyy-mm-dd> for a Session created at created.
func Dir(home string, created time.Time) string {
	return filepath.Join(home, "traces", created.UTC().Format("2006-01-02"))
}

// File returns the path of a Session's Trace file number index (1-based).
func File(home string, created time.Time, sessionID string, index int) string {
	return filepath.Join(Dir(home, created), fileName(sessionID, index))
}

// fileName is the name of a Session's Trace file number index.
func fileName(sessionID string, index int) string {
	return fmt.Sprintf("%s_%03d.jsonl", sessionID, index)
}

// IndexOf parses the index of a Trace file name <sid>_<nnn>.jsonl.
func IndexOf(name, sessionID string) (int, bool) {
	base := filepath.Base(name)
	prefix := sessionID + "_"
	if len(base) < len(prefix)+len(".jsonl")+1 || base[:len(prefix)] != prefix || filepath.Ext(base) != ".jsonl" {
		return 0, false
	}
	digits := base[len(prefix) : len(base)-len(".jsonl")]
	for i := range len(digits) {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false // Atoi would take a sign
		}
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil && n > 0
}

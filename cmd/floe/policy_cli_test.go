package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A command policy file that does not load stops floe before anything
// runs, naming the file and the rule.
func TestBadCommandPolicyStopsRun(t *testing.T) {
	home := t.TempDir()
	bad := filepath.Join(home, "policy.json")
	if err := os.WriteFile(bad, []byte(`{"rules":[{"name":"broken","pattern":"(?<=x)"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := floeStdout(t, home, []string{"FLOE_COMMAND_POLICY=" + bad}, "run", "hello")
	if code == 0 || !strings.Contains(out, bad) || !strings.Contains(out, `rule "broken"`) {
		t.Fatalf("floe run with a bad policy: exit %d\n%s", code, out)
	}
}

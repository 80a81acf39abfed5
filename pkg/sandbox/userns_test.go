package sandbox

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The direct start works for a runner that is root only inside a user
// namespace (a rootless container; what a non-root runner's zygote would
// be): this test binary, run as nobody in its own user, PID, mount and
// IPC namespaces, starts its calls directly and passes the direct start's
// and the confinement's tests there.
func TestDirectStartInAUserNamespace(t *testing.T) {
	if os.Getenv("FLOE_TEST_IN_USERNS") != "" {
		t.Skip("already in the user namespace")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to become nobody")
	}
	if err := procPidnsWorks(); err != nil {
		t.Skipf("the direct start needs a procfs per PID namespace (Linux 6.15): %v", err)
	}
	for _, tool := range []string{"setpriv", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s (util-linux) not found", tool)
		}
	}
	// A copy of this binary that nobody may run.
	dir, err := os.MkdirTemp("", "floe-userns-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "sandbox.test")
	copyFile(t, self, bin)
	nobody := []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"}
	if out, err := exec.Command(nobody[0], append(nobody[1:], "unshare", "-Ur", "true")...).CombinedOutput(); err != nil {
		t.Skipf("unprivileged user namespaces are not allowed here: %v %s", err, out)
	}
	args := append(nobody[1:], "unshare", "-Urpfi", "--mount-proc", bin, "-test.v", "-test.count=1",
		"-test.run", "^(TestDirectStartGivesNoWayOut|TestConfinedCallSeesOnlyItsWorkspaceSystemAndTmp|TestNextCallSeesNothingOfTheLast|TestConcurrentCallsOfAWorkspaceKeepTheirOwnTmp)$")
	cmd := exec.Command(nobody[0], args...)
	cmd.Env = append(os.Environ(), "FLOE_TEST_IN_USERNS=1", "HOME=/tmp", "TMPDIR=/tmp")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(out), "--- SKIP: TestDirectStartGivesNoWayOut") || !strings.Contains(string(out), "--- PASS: TestDirectStartGivesNoWayOut") {
		t.Fatalf("in a user namespace as nobody: %v\n%s", err, out)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

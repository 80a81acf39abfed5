package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The direct start keeps a call's tree (its mount namespace, with its
// /proc, and its PID namespace) for the next call of the same Workspace
// (tree.go). The next call must find nothing of the last: no file of its
// /tmp, none of its processes (a daemon it left), and the tree as it was:
// a call, which holds no capability, cannot mount, unmount or remount
// anything in it. The Workspace, which lies in the host's /tmp here, is
// in every call's fresh /tmp.
func TestNextCallInAKeptTreeSeesNothingOfTheLast(t *testing.T) {
	s := directSandbox(t)
	ws := t.TempDir()
	writeFile(t, filepath.Join(ws, "file"), "in the workspace\n")
	mark := fmt.Sprintf("1000.%d77", os.Getpid())
	const calls = 6
	var mounts string
	built := s.sp.treesBuilt.Load() // New's check, in a view of its own
	for i := range calls {
		// "slee[p]" matches the daemon's command line, not this script's
		// (which spells its command ${s}p).
		cmd := fmt.Sprintf(`ls -A /tmp | grep -v '^%[4]s$' | sed 's/^/TMP-HOLDS /'
			for p in /proc/[0-9]*/cmdline; do tr '\0' ' ' < $p; echo; done | grep -q 'slee[p] %[1]s' && echo SEES-DAEMON
			[ "$(cat %[2]s/file)" = "in the workspace" ] || echo NO-WORKSPACE
			echo %[3]d > /tmp/left-%[3]d; mkdir /tmp/dir-%[3]d
			s=slee; (setsid ${s}p %[1]s >/dev/null 2>&1 </dev/null &)
			mount -t tmpfs x /tmp/dir-%[3]d 2>/dev/null && echo MOUNTED
			mount --bind /tmp /usr 2>/dev/null && echo BOUND
			mount -o remount,rw / 2>/dev/null && echo REMOUNTED
			umount -l /proc 2>/dev/null && echo UNMOUNTED-PROC
			umount -l /tmp 2>/dev/null && echo UNMOUNTED-TMP
			echo MOUNTS; awk '{print $5, $6}' /proc/self/mountinfo | sort`, mark, ws, i, filepath.Base(filepath.Dir(ws)))
		out, ex := run(t, t.Context(), s, ws, cmd)
		if ex.Code != 0 || ex.Error != "" {
			t.Fatalf("call %d: exit %+v\n%s", i, ex, out)
		}
		before, m, ok := strings.Cut(out, "MOUNTS\n")
		if !ok {
			t.Fatalf("call %d:\n%s", i, out)
		}
		for _, bad := range []string{"TMP-HOLDS", "SEES-DAEMON", "NO-WORKSPACE", "MOUNTED", "BOUND", "REMOUNTED", "UNMOUNTED"} {
			if strings.Contains(before, bad) {
				t.Errorf("call %d: %s\n%s", i, bad, before)
			}
		}
		if i == 0 {
			mounts = m
		} else if m != mounts {
			t.Errorf("call %d's mounts differ from the first's:\n%s\nfirst:\n%s", i, m, mounts)
		}
		// The next call takes the kept tree once it is back (its /tmp
		// made fresh after the call's outcome is out).
		waitFreeTree(t, s, ws, 10*time.Second)
	}
	waitGone(t, mark, 2*time.Second)
	if n := s.sp.treesBuilt.Load() - built; n != 1 {
		t.Errorf("%d calls of one Workspace built %d trees, want 1 (kept)", calls, n)
	}
}

// waitFreeTree waits until the view of ws holds a free tree.
func waitFreeTree(t *testing.T, s *Sandbox, ws string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		s.sp.mu.Lock()
		n := 0
		if v := s.sp.views[viewKey(ws, nil)]; v != nil {
			n = len(v.free)
		}
		s.sp.mu.Unlock()
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no tree free %v after a call", within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

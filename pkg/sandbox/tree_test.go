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

// A call whose command was its only process and which created nothing in
// /tmp leaves its tree's /tmp in place (tree.go): the next call must
// still see nothing of it. Each call here changes /tmp or the directory
// made in it to hold the Workspace without creating a file: a mode, an
// mtime, an atime; the call after it must see them as they were made.
func TestATmpChangedInPlaceIsMadeFreshForTheNextCall(t *testing.T) {
	s := directSandbox(t)
	base, err := os.MkdirTemp("/tmp", "floe-tree-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	ws := filepath.Join(base, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	const stamp = "978307200" // 2001-01-01, never a fresh /tmp's time
	observe := fmt.Sprintf(`stat -c '%%n %%a %%u %%g %%X %%Y' /tmp %s`, base)
	call := func(cmd string) string {
		t.Helper()
		out, ex := run(t, t.Context(), s, ws, cmd)
		if ex.Code != 0 || ex.Error != "" {
			t.Fatalf("%s: exit %+v\n%s", cmd, ex, out)
		}
		waitFreeTree(t, s, ws, 10*time.Second)
		return out
	}
	// modes is what the observer's lines show but the times.
	modes := func(out string) string {
		var b strings.Builder
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(l)
			if len(f) != 6 {
				t.Fatalf("observer: %q", out)
			}
			fmt.Fprintln(&b, f[:4])
		}
		return b.String()
	}
	built := s.sp.treesBuilt.Load()
	first := call(observe)
	want := modes(first)
	for _, change := range []string{
		"chmod 0700 /tmp",
		"chmod 0700 " + base,
		"touch -m -d @" + stamp + " /tmp",
		"touch -a -d @" + stamp + " /tmp",
		"touch -m -d @" + stamp + " " + base,
		"touch -a -d @" + stamp + " " + base,
	} {
		call(change)
		got := call(observe)
		if modes(got) != want || strings.Contains(got, stamp) {
			t.Errorf("after %q the next call sees\n%s\nwant as at first\n%s", change, got, first)
		}
	}
	if n := s.sp.treesBuilt.Load() - built; n != 1 {
		t.Errorf("the calls of one Workspace built %d trees, want 1 (kept)", n)
	}
}

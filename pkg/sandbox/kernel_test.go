package sandbox

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// A confined call may run as uid 0 (a service run as root keeps its uid
// in the sandbox). It must hold no capability: with one, Landlock and the
// mount view still bound its files, but it could load a kernel module
// from its Workspace, change the host's network or read a raw disk. And
// the kernel lets uid 0 write most of /proc/sys by file mode alone,
// whatever its capabilities (the host's hostname, core_pattern — a program
// run as full root at the next crash — or /proc/sysrq-trigger): its /proc
// must not be writable, and its /dev must hold no device but the harmless
// ones (uid 0 reads a raw disk by file mode). Nor may it change the mode,
// owner or times of a file it sees but the Workspace's: uid 0 owns the
// system and the host's device nodes, and changes them without a
// capability (Landlock does not govern it). The check opens each file for
// writing and writes nothing, and sets each file's mode and owner to
// their own (--reference), so it changes nothing on a host that fails it. Both the calls
// the sandbox starts itself and the processes a caller starts (External:
// MCP servers) are checked.
func TestConfinedCallHasNoPrivilege(t *testing.T) {
	files := []string{
		"/proc/sysrq-trigger",
		"/proc/sys/kernel/hostname",
		"/proc/sys/kernel/core_pattern",
		"/proc/sys/vm/drop_caches",
		"/proc/sys/net/ipv4/ip_forward",
	}
	cmd := "for f in " + strings.Join(files, " ") + `; do
	  if [ -e "$f" ] && (: >> "$f") 2>/dev/null; then echo "WRITABLE $f"; fi
	done
	for d in /dev/* /dev/*/*; do
	  case "${d#/dev/}" in null|zero|full|random|urandom|tty|pts/ptmx) continue ;; esac
	  if [ ! -L "$d" ] && { [ -b "$d" ] || [ -c "$d" ]; }; then echo "DEVICE $d"; fi
	done
	for f in /usr/bin/true /etc /dev/null /dev/zero; do
	  chmod --reference="$f" "$f" 2>/dev/null && echo "CHMOD $f"
	  chown --reference="$f" "$f" 2>/dev/null && echo "CHOWN $f"
	done
	touch ws-file && chmod 755 ws-file && [ -x ws-file ] && echo WORKSPACE-CHMOD
	[ -r /proc/self/status ] && echo READS-PROC
	grep -E '^Cap(Prm|Eff|Bnd|Amb):' /proc/self/status`
	check := func(t *testing.T, out string) {
		t.Helper()
		if strings.Contains(out, "DEVICE") {
			t.Errorf("a confined call sees device nodes beyond the harmless ones:\n%s", out)
		}
		if strings.Contains(out, "WRITABLE") {
			t.Errorf("a confined call can write kernel settings:\n%s", out)
		}
		if strings.Contains(out, "CHMOD /") || strings.Contains(out, "CHOWN /") {
			t.Errorf("a confined call can change a file's mode or owner outside its Workspace:\n%s", out)
		}
		if !strings.Contains(out, "WORKSPACE-CHMOD") {
			t.Errorf("a confined call cannot change a mode in its Workspace:\n%s", out)
		}
		if !strings.Contains(out, "READS-PROC") {
			t.Errorf("the call's /proc is not readable:\n%s", out)
		}
		for _, c := range []string{"CapPrm", "CapEff", "CapBnd", "CapAmb"} {
			if !strings.Contains(out, c+":\t0000000000000000") {
				t.Errorf("%s is not empty:\n%s", c, out)
			}
		}
	}
	for b, s := range backends(t, Config{}) {
		t.Run(string(b), func(t *testing.T) {
			out, ex := run(t, t.Context(), s, t.TempDir(), cmd)
			if ex.Code != 0 {
				t.Errorf("exit %+v", ex)
			}
			check(t, out)
		})
		t.Run(string(b)+"/external", func(t *testing.T) {
			p, err := s.Command(t.Context(), Spec{Argv: []string{"bash", "-c", cmd}, Workspace: t.TempDir(), External: true,
				Env: []string{"PATH=/usr/bin:/bin", "HOME=" + os.Getenv("HOME")}})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var out bytes.Buffer
			p.Cmd.Stdout, p.Cmd.Stderr = &out, &out
			if err := p.Cmd.Start(); err != nil {
				t.Fatal(err)
			}
			if err := p.Cmd.Wait(); err != nil {
				t.Errorf("wait: %v", err)
			}
			check(t, out.String())
		})
	}
}

package gwe2e

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// noLandlockEnv, set in this test binary's environment, makes it a
// wrapper (see TestMain): it installs a seccomp filter under which
// landlock_create_ruleset fails with ENOSYS, as on a kernel without
// Landlock, and execs its arguments (after "--"), which inherit the
// filter. With a PATH without bwrap that is a host with no sandbox
// backend, made with the kernel's own seccomp, no hook in the product.
const noLandlockEnv = "FLOE_GWE2E_NO_LANDLOCK_EXEC"

// execWithoutLandlock is the wrapper's body; it returns only on error.
func execWithoutLandlock(argv []string) error {
	runtime.LockOSThread()
	prog := []unix.SockFilter{
		// seccomp_data.nr; landlock_create_ruleset is 444 on every
		// architecture (a syscall of the unified table).
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: unix.SYS_LANDLOCK_CREATE_RULESET},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	// TSYNC: every thread of this Go process, whichever execs.
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return fmt.Errorf("seccomp: %w", e)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, noLandlockEnv+"=") {
			env = append(env, kv)
		}
	}
	return syscall.Exec(argv[0], argv, env)
}

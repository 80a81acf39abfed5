package sandbox

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Landlock is used through its three system calls directly (x/sys/unix has
// the numbers and constants but no wrappers); the structs below are the
// kernel's, in its layout.

// rulesetAttr is struct landlock_ruleset_attr up to ABI 6 (scoped).
type rulesetAttr struct {
	handledFS  uint64
	handledNet uint64
	scoped     uint64
}

// netPortAttr is struct landlock_net_port_attr.
type netPortAttr struct {
	allowed uint64
	port    uint64
}

// landlockABI returns the kernel's Landlock ABI version, 0 when Landlock is
// not available (not built, not enabled, or a kernel too old).
func landlockABI() int {
	v, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if e != 0 {
		return 0
	}
	return int(v)
}

// fsAccess returns every filesystem right the ABI handles: what a ruleset
// must name so that anything not allowed by a rule is denied.
func fsAccess(abi int) uint64 {
	a := uint64(unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_READ_FILE |
		unix.LANDLOCK_ACCESS_FS_READ_DIR | unix.LANDLOCK_ACCESS_FS_REMOVE_DIR | unix.LANDLOCK_ACCESS_FS_REMOVE_FILE |
		unix.LANDLOCK_ACCESS_FS_MAKE_CHAR | unix.LANDLOCK_ACCESS_FS_MAKE_DIR | unix.LANDLOCK_ACCESS_FS_MAKE_REG |
		unix.LANDLOCK_ACCESS_FS_MAKE_SOCK | unix.LANDLOCK_ACCESS_FS_MAKE_FIFO | unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK |
		unix.LANDLOCK_ACCESS_FS_MAKE_SYM)
	if abi >= 2 {
		a |= unix.LANDLOCK_ACCESS_FS_REFER
	}
	if abi >= 3 {
		a |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
	}
	if abi >= 5 {
		a |= unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	}
	return a
}

// Rights of the rules: read (and execute) for the system, everything for
// the Workspace and the temp dir; a rule on a file may only name file
// rights.
const (
	fsRead     = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR
	fileRights = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_READ_FILE |
		unix.LANDLOCK_ACCESS_FS_TRUNCATE | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
)

func createRuleset(attr rulesetAttr) (int, error) {
	fd, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if e != 0 {
		return -1, fmt.Errorf("landlock_create_ruleset: %w", e)
	}
	return int(fd), nil
}

// netRuleset returns a Landlock ruleset that denies TCP connect to the
// ports of deny and allows it to every other port (network on), or denies
// every TCP connect (deny nil and all false). Landlock network rules are
// an allow-list, so "all but these" is one rule per allowed port: 65k
// rules, built once per toolrunner (a few milliseconds) and inherited by
// every call as an open file. The ruleset also scopes signals and abstract
// unix sockets to the call (ABI 6) when the kernel has them.
func netRuleset(abi int, deny map[int]bool, all bool) (*os.File, error) {
	if abi < 4 {
		return nil, fmt.Errorf("landlock ABI %d has no network rules (needs 4, Linux 6.7)", abi)
	}
	attr := rulesetAttr{handledNet: unix.LANDLOCK_ACCESS_NET_CONNECT_TCP}
	if abi >= 6 {
		attr.scoped = unix.LANDLOCK_SCOPE_SIGNAL | unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET
	}
	fd, err := createRuleset(attr)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "landlock-net")
	if all {
		for port := 0; port <= 65535; port++ {
			if deny[port] {
				continue
			}
			rule := netPortAttr{allowed: unix.LANDLOCK_ACCESS_NET_CONNECT_TCP, port: uint64(port)}
			_, _, e := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(fd), ruleNetPort, uintptr(unsafe.Pointer(&rule)), 0, 0, 0)
			if e != 0 {
				f.Close()
				return nil, fmt.Errorf("landlock_add_rule port %d: %w", port, e)
			}
		}
	}
	return f, nil
}

// fsRuleset returns a ruleset allowing read on ro and everything on rw
// (each a path; a missing one is skipped), denying every other path.
func fsRuleset(abi int, ro, rw []string) (int, error) {
	handled := fsAccess(abi)
	fd, err := createRuleset(rulesetAttr{handledFS: handled})
	if err != nil {
		return -1, err
	}
	add := func(path string, access uint64) error {
		pfd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("open %s: %w", path, err)
		}
		defer unix.Close(pfd)
		var st unix.Stat_t
		if err := unix.Fstat(pfd, &st); err != nil {
			return fmt.Errorf("stat %s: %w", path, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			access &= fileRights
		}
		rule := unix.LandlockPathBeneathAttr{Allowed_access: access & handled, Parent_fd: int32(pfd)}
		_, _, e := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(fd), unix.LANDLOCK_RULE_PATH_BENEATH, uintptr(unsafe.Pointer(&rule)), 0, 0, 0)
		if e != 0 {
			return fmt.Errorf("landlock_add_rule %s: %w", path, e)
		}
		return nil
	}
	for _, p := range ro {
		if err := add(p, fsRead); err != nil {
			unix.Close(fd)
			return -1, err
		}
	}
	for _, p := range rw {
		if err := add(p, handled); err != nil {
			unix.Close(fd)
			return -1, err
		}
	}
	return fd, nil
}

// restrictSelf enforces the ruleset fd on the calling thread; the caller
// must be locked to its OS thread and exec soon (the restriction is
// inherited across fork and exec).
func restrictSelf(fd int) error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if _, _, e := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, uintptr(fd), 0, 0); e != 0 {
		return fmt.Errorf("landlock_restrict_self: %w", e)
	}
	return nil
}

// ruleNetPort is LANDLOCK_RULE_NET_PORT (x/sys/unix lacks it).
const ruleNetPort = 2

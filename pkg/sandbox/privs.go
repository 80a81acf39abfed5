package sandbox

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Securebits (linux/securebits.h).
const (
	secbitNoroot               = 1 << 0
	secbitNorootLocked         = 1 << 1
	secbitNoCapAmbientRaise    = 1 << 6
	secbitNoCapAmbientRaiseLck = 1 << 7
)

// bindRO binds src (a device node, or /dev/null over a hidden file) at
// dst read-only, nosuid and noexec. The node stays usable (a read-only
// mount does not stop reads and writes of a device), but its mode, owner,
// times and attributes, which are the host's node's, cannot be changed:
// uid 0 (a root service) changes them by ownership alone, without a
// capability (a `chmod 000 /dev/null` of the host's).
func bindRO(src, dst string) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return unix.MountSetattr(unix.AT_FDCWD, dst, 0, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NOEXEC})
}

// dropPrivileges makes sure nothing the calling thread starts from now on
// runs with a capability, even as uid 0: no_new_privs (no setuid or file
// capability gains), no ambient capabilities, and, when the thread holds
// capabilities (the service runs as root), an empty bounding set and
// SECBIT_NOROOT locked, so an exec as uid 0 gives no capability. The
// thread keeps its own effective set (the spawner still mounts). The
// caller must be locked to its OS thread: these are per-thread.
//
// Without it a confined call of a root service kept every capability:
// Landlock still bounded its files, but it could load a kernel module
// from its Workspace, change the host's network configuration or read a
// raw disk device, each a way out of the sandbox.
func dropPrivileges() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	if data[0].Permitted == 0 && data[1].Permitted == 0 {
		// Nothing to pass on (a non-root service, or bubblewrap's
		// unprivileged child), and nothing to drop the bounding set with.
		return nil
	}
	last := 63
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		fmt.Sscan(strings.TrimSpace(string(b)), &last)
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	bits := secbitNoroot | secbitNorootLocked | secbitNoCapAmbientRaise | secbitNoCapAmbientRaiseLck
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits), 0, 0, 0); err != nil {
		return fmt.Errorf("securebits: %w", err)
	}
	return nil
}

package tools

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// MaxFileSize caps the files edit_file edits and write_file writes, and
// the bytes read_file streams in one call.
const MaxFileSize = 10 << 20

// maxLinks bounds the symbolic links followed while resolving one path, as
// the kernel's ELOOP does.
const maxLinks = 255

// workspace is a call's Workspace: the directory every path must stay in.
type workspace struct {
	dir  string // as given, cleaned
	real string // dir with symbolic links resolved
}

// openWorkspace checks that dir is an absolute path to a directory.
func openWorkspace(dir string) (workspace, error) {
	if !filepath.IsAbs(dir) {
		return workspace{}, fmt.Errorf("workspace %q is not an absolute path", dir)
	}
	dir = filepath.Clean(dir)
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return workspace{}, fmt.Errorf("workspace %q: %w", dir, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return workspace{}, fmt.Errorf("workspace %q: %w", dir, err)
	}
	if !fi.IsDir() {
		return workspace{}, fmt.Errorf("workspace %q is not a directory", dir)
	}
	return workspace{dir: dir, real: real}, nil
}

// resolve maps p, absolute or relative to the workspace, to shown, its
// cleaned absolute form for messages, and real, the location to operate on
// with every symbolic link resolved. It fails with `path "p" is outside the
// workspace` when real lies outside the workspace.
func (w workspace) resolve(p string) (shown, real string, err error) {
	if p == "" {
		return "", "", errors.New("path is empty")
	}
	shown = p
	if !filepath.IsAbs(shown) {
		shown = filepath.Join(w.dir, shown)
	}
	shown = filepath.Clean(shown)
	real, err = realPath(shown)
	if err != nil {
		return "", "", fmt.Errorf("resolve path %q: %w", p, err)
	}
	if !w.contains(real) {
		return "", "", fmt.Errorf("path %q is outside the workspace", p)
	}
	return shown, real, nil
}

// rel returns real, a path resolve returned, relative to the workspace:
// the name to open through root, which refuses it should a component
// have become a link to outside since resolve looked.
func (w workspace) rel(real string) string {
	r, err := filepath.Rel(w.real, real)
	if err != nil {
		return real // cannot happen for a path resolve returned; root refuses it
	}
	return r
}

// root opens the workspace as an os.Root: every name opened through it is
// resolved by the kernel one component at a time, relative to the
// workspace's directory handle, and refused if it would leave it, so a
// path component swapped for a symbolic link mid-call cannot reach
// outside (there is no window between check and use).
func (w workspace) root() (*os.Root, error) {
	r, err := os.OpenRoot(w.real)
	if err != nil {
		return nil, fmt.Errorf("workspace %q: %w", w.dir, err)
	}
	return r, nil
}

// openFile opens rel through the workspace's root with O_NONBLOCK (so a
// FIFO never blocks the open) and checks that it is a regular file: a
// directory or a special file (FIFO, device, socket) is refused with a
// message naming shown. A file opened through a Root stays usable after
// the Root is closed.
func (w workspace) openFile(root *os.Root, shown, rel string, flag int) (*os.File, os.FileInfo, error) {
	// Refuse special files before opening them: opening a device can have
	// effects of its own.
	if fi, err := root.Stat(rel); err == nil {
		if err := regular(shown, fi); err != nil {
			return nil, nil, err
		}
	}
	f, err := root.OpenFile(rel, flag|syscall.O_NONBLOCK, 0o644)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err == nil {
		err = regular(shown, fi)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// errNotRegular marks a path that is a directory or a special file.
var errNotRegular = errors.New("not a regular file")

// regular returns nil for a regular file and otherwise an error saying what
// shown is.
func regular(shown string, fi os.FileInfo) error {
	m := fi.Mode()
	switch {
	case m.IsRegular():
		return nil
	case m.IsDir():
		return fmt.Errorf("%w: %s is a directory, not a file", errNotRegular, shown)
	case m&fs.ModeNamedPipe != 0:
		return fmt.Errorf("%w: %s is a FIFO (named pipe); the file tools only read and write regular files", errNotRegular, shown)
	case m&fs.ModeSocket != 0:
		return fmt.Errorf("%w: %s is a socket; the file tools only read and write regular files", errNotRegular, shown)
	case m&fs.ModeDevice != 0:
		return fmt.Errorf("%w: %s is a device; the file tools only read and write regular files", errNotRegular, shown)
	}
	return fmt.Errorf("%w: %s is not a regular file", errNotRegular, shown)
}

// fileError turns an error of openFile or of an operation through a Root
// into a tool message about shown.
func fileError(op, shown string, err error) string {
	switch {
	case errors.Is(err, errNotRegular):
		return strings.TrimPrefix(err.Error(), errNotRegular.Error()+": ")
	case errors.Is(err, os.ErrNotExist):
		return "file not found: " + shown
	}
	return fmt.Sprintf("%s %s: %v", op, shown, unwrapPath(err))
}

// unwrapPath drops the *fs.PathError around err: its name is relative to
// the workspace and would only confuse next to the path shown.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// contains reports whether the resolved path real is the workspace or lies
// inside it.
func (w workspace) contains(real string) bool {
	return real == w.real || w.real == "/" || strings.HasPrefix(real, w.real+string(filepath.Separator))
}

// realPath resolves the symbolic links of the absolute path p as the kernel
// would, component by component. Unlike filepath.EvalSymlinks it accepts
// components that do not exist (yet), and follows a dangling link to where
// it points, so writing through it cannot land outside unnoticed.
func realPath(p string) (string, error) {
	rest := splitPath(p)
	cur := "/"
	links := 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		fi, err := os.Lstat(next)
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			// A missing (or unreadable) component is taken lexically: the
			// caller operates on the returned path, so what is checked is
			// what is used, and ".." after it walks back to real directories
			// whose links are resolved again.
			cur = next
			continue
		}
		links++
		if links > maxLinks {
			return "", errors.New("too many levels of symbolic links")
		}
		target, err := os.Readlink(next)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		rest = append(splitPath(target), rest...)
	}
	return cur, nil
}

func splitPath(p string) []string {
	return strings.Split(p, string(filepath.Separator))
}

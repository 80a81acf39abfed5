package tools

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

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

// Package confine decides which Workspaces and scripted models a Session
// may name: a Workspace must be an existing directory inside an allowed
// root (never "/"), and a scripted model other than scripted:demo must be a
// small regular file inside the scripts directory. Both are checked on the
// path with every symbolic link resolved, and the resolved path is what the
// Session keeps, so re-pointing a link later cannot move it.
package confine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// MaxScriptSize caps a script file a Session may name, as the engine's
// scripted model caps what it reads.
const MaxScriptSize = 4 << 20

// Roots parses FLOE_WORKSPACE_ROOTS, a colon-separated list; empty entries
// are skipped and nil means none were given.
func Roots(list string) []string {
	var roots []string
	for _, r := range filepath.SplitList(list) {
		if r = strings.TrimSpace(r); r != "" {
			roots = append(roots, filepath.Clean(r))
		}
	}
	return roots
}

// DefaultRoots are the Workspace roots when none are configured:
// home/workspaces (home is $FLOE_HOME) and the home directory of the user
// running Floe, when it is known and is not "/".
func DefaultRoots(home string) []string {
	roots := []string{filepath.Join(home, "workspaces")}
	if h, err := os.UserHomeDir(); err == nil && filepath.IsAbs(h) && filepath.Clean(h) != "/" {
		roots = append(roots, filepath.Clean(h))
	}
	return roots
}

// CheckRoots says what is wrong with a list of roots: each must be an
// absolute path other than "/".
func CheckRoots(roots []string) error {
	for _, r := range roots {
		switch {
		case !filepath.IsAbs(r):
			return fmt.Errorf("workspace root %q is not an absolute path", r)
		case filepath.Clean(r) == "/":
			return errors.New(`workspace root "/" is not allowed: it would let a Session work anywhere`)
		}
	}
	return nil
}

// ErrOutside is wrapped by Workspace for a directory outside every root.
var ErrOutside = errors.New("outside every allowed workspace root (FLOE_WORKSPACE_ROOTS)")

// ErrInHome is wrapped by Workspace for a directory inside $FLOE_HOME but
// not inside its workspaces/.
var ErrInHome = errors.New("inside $FLOE_HOME, where only workspaces/ may hold Workspaces (the JetStream store, Traces and credentials never are)")

// Workspace checks that dir is an existing directory inside one of roots
// (a root itself included; "/" never) and, when home ($FLOE_HOME) is not
// empty, not inside home unless inside home/workspaces, whatever the roots
// say (protocol.md §7: no Session works inside the store). It returns dir with
// its symbolic links resolved. Errors quote dir as given and say what is
// wrong.
func Workspace(dir string, roots []string, home string) (string, error) {
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("workspace %q is not an absolute path", dir)
	}
	real, err := filepath.EvalSymlinks(dir)
	switch {
	case err != nil && !within(filepath.Clean(dir), roots):
		// Say nothing about whether a path outside the roots exists.
		return "", fmt.Errorf("workspace %q is %w", dir, ErrOutside)
	case errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("workspace %q does not exist", dir)
	case err != nil:
		return "", fmt.Errorf("workspace %q cannot be resolved", dir)
	}
	if real == "/" {
		return "", fmt.Errorf("workspace %q is the root directory, which is never allowed", dir)
	}
	if !within(real, roots) {
		return "", fmt.Errorf("workspace %q is %w", dir, ErrOutside)
	}
	if home != "" && within(real, []string{home}) && !within(real, []string{filepath.Join(home, "workspaces")}) {
		return "", fmt.Errorf("workspace %q is %w", dir, ErrInHome)
	}
	fi, err := os.Stat(real)
	if err != nil || !fi.IsDir() {
		return "", fmt.Errorf("workspace %q is not a directory", dir)
	}
	return real, nil
}

// within reports whether the resolved path real is one of roots, or inside
// one, with the roots' links resolved too.
func within(real string, roots []string) bool {
	for _, r := range roots {
		rr, err := filepath.EvalSymlinks(r)
		if err != nil || rr == "/" {
			continue
		}
		if real == rr || strings.HasPrefix(real, rr+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

// Scripted is the model id of the built-in scripted model, always allowed.
const Scripted = "demo"

// ScriptedModel checks the id of a scripted:<id> model: "demo", or the path
// (absolute, or relative to dir) of a regular file of at most MaxScriptSize
// bytes inside dir, the scripts directory (FLOE_SCRIPTS_DIR; "" allows
// demo only). It returns the id to keep: demo, or the resolved absolute
// path. It never opens the file, so a FIFO or a device is refused without
// blocking, and its errors never quote the file.
func ScriptedModel(id, dir string) (string, error) {
	if id == Scripted {
		return id, nil
	}
	if dir == "" {
		return "", errors.New("scripted models other than scripted:demo are disabled (the server sets FLOE_SCRIPTS_DIR to allow scripts from one directory)")
	}
	p := id
	if !filepath.IsAbs(p) {
		p = filepath.Join(dir, p)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil || !within(real, []string{dir}) {
		return "", fmt.Errorf("scripted model %q is not a script in FLOE_SCRIPTS_DIR", id)
	}
	fi, err := os.Stat(real)
	switch {
	case err != nil:
		return "", fmt.Errorf("scripted model %q is not a script in FLOE_SCRIPTS_DIR", id)
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("scripted model %q is not a regular file", id)
	case fi.Size() > MaxScriptSize:
		return "", fmt.Errorf("scripted model %q is larger than %d bytes", id, MaxScriptSize)
	}
	return real, nil
}

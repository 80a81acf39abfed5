// Package layout checks the repository's module boundaries: every module
// of go.work builds on its own (GOWORK=off), no service imports another
// service, and the shared packages import no service.
package layout

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// repoRoot is the directory holding go.work, above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.work above the test's directory")
		}
		dir = parent
	}
}

// workModules lists the module directories go.work uses, relative to root.
func workModules(t *testing.T, root string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var mods []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "use (":
			in = true
		case in && line == ")":
			in = false
		case in && line != "":
			mods = append(mods, filepath.Clean(line))
		case strings.HasPrefix(line, "use "):
			mods = append(mods, filepath.Clean(strings.TrimSpace(strings.TrimPrefix(line, "use "))))
		}
	}
	if len(mods) == 0 {
		t.Fatal("go.work uses no module")
	}
	return mods
}

// forbidden says which floe.dev import paths the module at dir may not
// depend on (outside its tests).
func forbidden(dir string) func(string) bool {
	parts := strings.Split(filepath.ToSlash(dir), "/")
	switch {
	case len(parts) == 2 && parts[0] == "services":
		own := "floe.dev/services/" + parts[1]
		return func(p string) bool {
			return (strings.HasPrefix(p, "floe.dev/services/") && p != own && !strings.HasPrefix(p, own+"/")) ||
				strings.HasPrefix(p, "floe.dev/cmd/")
		}
	case len(parts) == 2 && parts[0] == "pkg":
		return func(p string) bool {
			return strings.HasPrefix(p, "floe.dev/services/") || strings.HasPrefix(p, "floe.dev/cmd/")
		}
	}
	return func(string) bool { return false }
}

func TestModulesStandAloneAndServicesImportNoOtherService(t *testing.T) {
	root := repoRoot(t)
	for _, mod := range workModules(t, root) {
		t.Run(filepath.ToSlash(mod), func(t *testing.T) {
			cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./...")
			cmd.Dir = filepath.Join(root, mod)
			cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("GOWORK=off go list -deps ./... in %s: %v\n%s", mod, err, out)
			}
			bad := forbidden(mod)
			for _, p := range strings.Fields(string(out)) {
				if bad(p) {
					t.Errorf("%s depends on %s: services talk only through the bus, and pkg/ serves them all", mod, p)
				}
			}
		})
	}
}

func TestForbiddenImports(t *testing.T) {
	for _, tc := range []struct {
		dir, path string
		want      bool
	}{
		{"services/gateway", "floe.dev/services/tracer", true},
		{"services/gateway", "floe.dev/services/gateway/internal/server", false},
		{"services/gateway", "floe.dev/services/gatewayx", true},
		{"services/engine", "floe.dev/cmd/floe", true},
		{"services/engine", "floe.dev/pkg/bus", false},
		{"pkg/trace", "floe.dev/services/engine", true},
		{"pkg/trace", "floe.dev/pkg/omni", false},
		{"cmd/floe", "floe.dev/services/engine", false},
	} {
		if got := forbidden(tc.dir)(tc.path); got != tc.want {
			t.Errorf("forbidden(%q)(%q) = %v, want %v", tc.dir, tc.path, got, tc.want)
		}
	}
}

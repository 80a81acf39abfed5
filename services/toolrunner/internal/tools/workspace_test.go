package tools

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWorkspaceResolve(t *testing.T) {
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	outside := filepath.Join(base, "outside")
	writeTestFile(t, filepath.Join(ws, "sub", "file.txt"), "x")
	writeTestFile(t, filepath.Join(outside, "secret.txt"), "secret")
	symlink(t, outside, filepath.Join(ws, "out"))
	symlink(t, "../..", filepath.Join(ws, "sub", "up"))
	symlink(t, "sub/file.txt", filepath.Join(ws, "in"))
	symlink(t, "sub", filepath.Join(ws, "subdir"))
	symlink(t, filepath.Join(outside, "nothing"), filepath.Join(ws, "dangling"))
	symlink(t, "loop", filepath.Join(ws, "loop"))
	symlink(t, ws, filepath.Join(base, "ws-link"))
	real := realDir(t, ws)

	tests := []struct {
		name      string
		workspace string
		path      string
		want      string // resolved path, relative to the real workspace
		wantErr   string
	}{
		{name: "relative", path: "sub/file.txt", want: "sub/file.txt"},
		{name: "absolute", path: ws + "/sub/file.txt", want: "sub/file.txt"},
		{name: "the workspace itself", path: ".", want: "."},
		{name: "not yet existing", path: "new/dir/file.txt", want: "new/dir/file.txt"},
		{name: "cleaned", path: "sub/./../sub//file.txt", want: "sub/file.txt"},
		{name: "symlinked file inside", path: "in", want: "sub/file.txt"},
		{name: "through a symlinked directory inside", path: "subdir/file.txt", want: "sub/file.txt"},
		{name: "workspace given through a symlink", workspace: filepath.Join(base, "ws-link"), path: "sub/file.txt", want: "sub/file.txt"},
		{name: "real path of a symlinked workspace", workspace: filepath.Join(base, "ws-link"), path: ws + "/sub/file.txt", want: "sub/file.txt"},
		{name: "empty", path: "", wantErr: "path is empty"},
		{name: "parent", path: "../x", wantErr: `path "../x" is outside the workspace`},
		{name: "parent after a directory", path: "sub/../../x", wantErr: `path "sub/../../x" is outside the workspace`},
		{name: "sibling with the workspace as prefix", path: ws + "-other/x", wantErr: `is outside the workspace`},
		{name: "absolute outside", path: "/etc/passwd", wantErr: `path "/etc/passwd" is outside the workspace`},
		{name: "symlinked directory out", path: "out/secret.txt", wantErr: `path "out/secret.txt" is outside the workspace`},
		{name: "relative symlink climbing out", path: "sub/up/outside/secret.txt", wantErr: `path "sub/up/outside/secret.txt" is outside the workspace`},
		{name: "dangling symlink out", path: "dangling", wantErr: `path "dangling" is outside the workspace`},
		{name: "missing directory then a symlink out", path: "missing/../out/x", wantErr: `path "missing/../out/x" is outside the workspace`},
		{name: "symlink loop", path: "loop/x", wantErr: "too many levels of symbolic links"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := ws
			if tt.workspace != "" {
				dir = tt.workspace
			}
			w, err := openWorkspace(dir)
			if err != nil {
				t.Fatal(err)
			}
			_, got, err := w.resolve(tt.path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("resolve(%q) = %q, %v, want error %q", tt.path, got, err, tt.wantErr)
				}
				return
			}
			if want := filepath.Join(real, tt.want); err != nil || got != want {
				t.Errorf("resolve(%q) = %q, %v, want %q", tt.path, got, err, want)
			}
		})
	}
}

func TestOpenWorkspaceRejectsBadWorkspaces(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	writeTestFile(t, file, "x")
	tests := []struct {
		name, dir, wantErr string
	}{
		{"relative", "ws", `workspace "ws" is not an absolute path`},
		{"missing", filepath.Join(dir, "missing"), "no such file or directory"},
		{"a file", file, "is not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := openWorkspace(tt.dir); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("openWorkspace(%q) = %v, want error %q", tt.dir, err, tt.wantErr)
			}
		})
	}
}

func TestExecuteReportsBadWorkspace(t *testing.T) {
	r := Builtin(Options{})
	calls := map[string]string{
		"exec_command": `{"description":"d","cmd":"touch x"}`,
		"read_file":    `{"file_path":"x"}`,
		"write_file":   `{"file_path":"x","content":"c"}`,
		"edit_file":    `{"file_path":"x","old_string":"a","new_string":"b"}`,
	}
	for tool, a := range calls {
		res := execute(t, t.Context(), r, Call{Name: tool, Arguments: a, Workspace: "relative/ws"})
		if want := `workspace "relative/ws" is not an absolute path`; !res.Failed || res.Output != want {
			t.Errorf("%s with a relative workspace = %+v, want failed with %q", tool, res, want)
		}
	}
	if _, err := os.Stat("relative"); err == nil {
		t.Error("a tool created the relative workspace")
	}
}

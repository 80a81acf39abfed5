package tools

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fileWorkspace returns a workspace with files for the file tools, and a
// directory outside it that the workspace links into.
func fileWorkspace(t *testing.T) (ws, outside string) {
	t.Helper()
	ws, outside = t.TempDir(), t.TempDir()
	var twelve strings.Builder
	for i := 1; i <= 12; i++ {
		fmt.Fprintf(&twelve, "line %d\n", i)
	}
	writeTestFile(t, filepath.Join(ws, "twelve.txt"), twelve.String())
	writeTestFile(t, filepath.Join(ws, "no-newline.txt"), "one\ntwo")
	writeTestFile(t, filepath.Join(ws, "empty.txt"), "")
	writeTestFile(t, filepath.Join(ws, "utf8.txt"), "héllo\twörld\n日本語\n")
	writeTestFile(t, filepath.Join(ws, "nul.bin"), "ELF\x00\x01\x02")
	writeTestFile(t, filepath.Join(ws, "latin1.txt"), "caf\xe9\n")
	writeTestFile(t, filepath.Join(ws, "long-line.txt"), strings.Repeat("x", 200000)+"\nend\n")
	writeTestFile(t, filepath.Join(ws, "sub", "nested.txt"), "nested\n")
	writeTestFile(t, filepath.Join(outside, "secret.txt"), "secret\n")
	symlink(t, outside, filepath.Join(ws, "out"))
	symlink(t, filepath.Join(outside, "secret.txt"), filepath.Join(ws, "secret-link"))
	symlink(t, filepath.Join(outside, "created.txt"), filepath.Join(ws, "dangling-out"))
	symlink(t, "twelve.txt", filepath.Join(ws, "inner-link"))
	return ws, outside
}

func TestReadFile(t *testing.T) {
	ws, _ := fileWorkspace(t)
	lines := func(from, to int) string {
		var b strings.Builder
		for i := from; i <= to; i++ {
			fmt.Fprintf(&b, "%6d\tline %d\n", i, i)
		}
		return b.String()
	}
	tests := []struct {
		name   string
		args   map[string]any
		want   string
		failed bool
	}{
		{name: "whole file", args: map[string]any{"file_path": "twelve.txt"}, want: lines(1, 12)},
		{name: "cat -n numbering", args: map[string]any{"file_path": "twelve.txt", "limit": 1},
			want: "     1\tline 1\n[more lines follow; continue with offset=2]"},
		{name: "window", args: map[string]any{"file_path": "twelve.txt", "offset": 3, "limit": 2},
			want: lines(3, 4) + "[more lines follow; continue with offset=5]"},
		{name: "window to the end", args: map[string]any{"file_path": "twelve.txt", "offset": 11},
			want: lines(11, 12)},
		{name: "window ending on the last line", args: map[string]any{"file_path": "twelve.txt", "offset": 11, "limit": 2},
			want: lines(11, 12)},
		{name: "absolute path", args: map[string]any{"file_path": filepath.Join(ws, "twelve.txt"), "offset": 12},
			want: lines(12, 12)},
		{name: "last line without newline", args: map[string]any{"file_path": "no-newline.txt"},
			want: "     1\tone\n     2\ttwo"},
		{name: "multibyte text", args: map[string]any{"file_path": "utf8.txt"},
			want: "     1\théllo\twörld\n     2\t日本語\n"},
		{name: "line longer than the read buffer", args: map[string]any{"file_path": "long-line.txt", "offset": 2},
			want: "     2\tend\n"},
		{name: "nested", args: map[string]any{"file_path": "sub/nested.txt"}, want: "     1\tnested\n"},
		{name: "symlink inside the workspace", args: map[string]any{"file_path": "inner-link", "limit": 1},
			want: "     1\tline 1\n[more lines follow; continue with offset=2]"},
		{name: "empty file", args: map[string]any{"file_path": "empty.txt"}, want: "[empty file]"},
		{name: "offset past the end", args: map[string]any{"file_path": "twelve.txt", "offset": 13},
			want: "offset 13 is past the end of " + ws + "/twelve.txt (12 lines)", failed: true},
		{name: "offset past the end of an empty file", args: map[string]any{"file_path": "empty.txt", "offset": 2},
			want: "offset 2 is past the end of " + ws + "/empty.txt (0 lines)", failed: true},
		{name: "not found", args: map[string]any{"file_path": "missing.txt"},
			want: "file not found: " + ws + "/missing.txt", failed: true},
		{name: "directory", args: map[string]any{"file_path": "sub"},
			want: ws + "/sub is a directory, not a file; list it with exec_command", failed: true},
		{name: "binary with NUL bytes", args: map[string]any{"file_path": "nul.bin"},
			want: ws + "/nul.bin looks like a binary file (it contains NUL bytes); read_file only reads text", failed: true},
		{name: "binary not UTF-8", args: map[string]any{"file_path": "latin1.txt"},
			want: ws + "/latin1.txt looks like a binary file (it is not valid UTF-8); read_file only reads text", failed: true},
		{name: "parent directory", args: map[string]any{"file_path": "../x"},
			want: `path "../x" is outside the workspace`, failed: true},
		{name: "absolute outside", args: map[string]any{"file_path": "/etc/passwd"},
			want: `path "/etc/passwd" is outside the workspace`, failed: true},
		{name: "through a symlinked directory", args: map[string]any{"file_path": "out/secret.txt"},
			want: `path "out/secret.txt" is outside the workspace`, failed: true},
		{name: "symlinked file", args: map[string]any{"file_path": "secret-link"},
			want: `path "secret-link" is outside the workspace`, failed: true},
	}
	r := Builtin(Options{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := execute(t, t.Context(), r, Call{Name: "read_file", Arguments: args(t, tt.args), Workspace: ws})
			if res.Output != tt.want || res.Failed != tt.failed {
				t.Errorf("read_file(%v) = %+v, want {Output:%q Failed:%v}", tt.args, res, tt.want, tt.failed)
			}
		})
	}
}

func TestReadFileLongWindowIsTruncated(t *testing.T) {
	ws := t.TempDir()
	writeTestFile(t, filepath.Join(ws, "big.txt"), strings.Repeat("ab\n", 3000))
	r := Builtin(Options{MaxOutput: 55})
	res := execute(t, t.Context(), r, Call{Name: "read_file", Arguments: `{"file_path":"big.txt"}`, Workspace: ws})
	// 2000 lines of 10 characters are read, 55 kept.
	want := "     1\tab\n     2\tab\n     3\tab\n     4\tab\n     5\tab\n     \n" +
		"[output truncated: 19945 more characters]\n[more lines follow; continue with offset=2001]"
	if res.Failed || res.Output != want {
		t.Errorf("read_file = %+v, want %q", res, want)
	}
}

func TestWriteFile(t *testing.T) {
	tests := []struct {
		name     string
		path     string
		content  string
		want     string
		failed   bool
		check    string // file whose content must then be content
		notExist string // file that must not exist afterwards
	}{
		{name: "creates parent directories", path: "a/b/c.txt", content: "hello",
			want: "wrote 5 bytes to {ws}/a/b/c.txt", check: "{ws}/a/b/c.txt"},
		{name: "overwrites", path: "sub/nested.txt", content: "new\n",
			want: "wrote 4 bytes to {ws}/sub/nested.txt", check: "{ws}/sub/nested.txt"},
		{name: "absolute path", path: "{ws}/abs.txt", content: "x",
			want: "wrote 1 byte to {ws}/abs.txt", check: "{ws}/abs.txt"},
		{name: "counts bytes", path: "utf8.txt", content: "héllo",
			want: "wrote 6 bytes to {ws}/utf8.txt", check: "{ws}/utf8.txt"},
		{name: "empty content", path: "empty.txt", content: "",
			want: "wrote 0 bytes to {ws}/empty.txt", check: "{ws}/empty.txt"},
		{name: "a directory", path: "sub", content: "x",
			want: "{ws}/sub is a directory, not a file", failed: true},
		{name: "parent directory", path: "../escape.txt", content: "x",
			want: `path "../escape.txt" is outside the workspace`, failed: true, notExist: "{ws}/../escape.txt"},
		{name: "through a symlinked directory", path: "out/new.txt", content: "x",
			want: `path "out/new.txt" is outside the workspace`, failed: true, notExist: "{out}/new.txt"},
		{name: "symlinked file", path: "secret-link", content: "x",
			want: `path "secret-link" is outside the workspace`, failed: true},
		{name: "dangling symlink pointing out", path: "dangling-out", content: "x",
			want: `path "dangling-out" is outside the workspace`, failed: true, notExist: "{out}/created.txt"},
		{name: "missing directory then back out through a symlink", path: "new/../out/new.txt", content: "x",
			want: `path "new/../out/new.txt" is outside the workspace`, failed: true, notExist: "{out}/new.txt"},
	}
	r := Builtin(Options{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws, outside := fileWorkspace(t)
			expand := strings.NewReplacer("{ws}", ws, "{out}", outside).Replace
			a := map[string]any{"file_path": expand(tt.path), "content": tt.content}
			res := execute(t, t.Context(), r, Call{Name: "write_file", Arguments: args(t, a), Workspace: ws})
			if want := expand(tt.want); res.Output != want || res.Failed != tt.failed {
				t.Errorf("write_file(%v) = %+v, want {Output:%q Failed:%v}", a, res, want, tt.failed)
			}
			if tt.check != "" {
				if got, err := os.ReadFile(expand(tt.check)); err != nil || string(got) != tt.content {
					t.Errorf("%s = %q, %v, want %q", tt.check, got, err, tt.content)
				}
			}
			if tt.notExist != "" {
				if _, err := os.Lstat(expand(tt.notExist)); err == nil {
					t.Errorf("%s exists, want it not written", tt.notExist)
				}
			}
			if got, _ := os.ReadFile(filepath.Join(outside, "secret.txt")); string(got) != "secret\n" {
				t.Errorf("file outside the workspace changed to %q", got)
			}
		})
	}
}

func TestEditFile(t *testing.T) {
	tests := []struct {
		name        string
		content     string
		args        map[string]any
		want        string
		failed      bool
		wantContent string
	}{
		{name: "one occurrence", content: "a foo b",
			args: map[string]any{"old_string": "foo", "new_string": "bar"},
			want: "replaced 1 occurrence in {file}", wantContent: "a bar b"},
		{name: "multiline", content: "func f() {\n\treturn 1\n}\n",
			args: map[string]any{"old_string": "\treturn 1\n", "new_string": "\treturn 2\n"},
			want: "replaced 1 occurrence in {file}", wantContent: "func f() {\n\treturn 2\n}\n"},
		{name: "replace_all", content: "foo foo foo",
			args: map[string]any{"old_string": "foo", "new_string": "bar", "replace_all": true},
			want: "replaced 3 occurrences in {file}", wantContent: "bar bar bar"},
		{name: "ambiguous", content: "foo foo foo",
			args:   map[string]any{"old_string": "foo", "new_string": "bar"},
			want:   "old_string occurs 3 times in {file}; add surrounding context to make it unique, or set replace_all to true",
			failed: true, wantContent: "foo foo foo"},
		{name: "ambiguous with replace_all false", content: "foo foo",
			args:   map[string]any{"old_string": "foo", "new_string": "bar", "replace_all": false},
			want:   "old_string occurs 2 times in {file}; add surrounding context to make it unique, or set replace_all to true",
			failed: true, wantContent: "foo foo"},
		{name: "not found", content: "a foo b",
			args:   map[string]any{"old_string": "Foo", "new_string": "bar"},
			want:   "old_string not found in {file}; it must match the file exactly, whitespace included",
			failed: true, wantContent: "a foo b"},
		{name: "identical strings", content: "a foo b",
			args:   map[string]any{"old_string": "foo", "new_string": "foo"},
			want:   "old_string and new_string are identical; there is nothing to change",
			failed: true, wantContent: "a foo b"},
		{name: "empty old_string", content: "a foo b",
			args:   map[string]any{"old_string": "", "new_string": "x"},
			want:   "old_string is empty; use write_file to create or overwrite a whole file",
			failed: true, wantContent: "a foo b"},
		{name: "missing file",
			args:   map[string]any{"file_path": "missing.txt", "old_string": "a", "new_string": "b"},
			want:   "file not found: {ws}/missing.txt; use write_file to create it",
			failed: true},
		{name: "directory",
			args:   map[string]any{"file_path": "sub", "old_string": "a", "new_string": "b"},
			want:   "{ws}/sub is a directory, not a file",
			failed: true},
		{name: "outside through a symlink",
			args:   map[string]any{"file_path": "secret-link", "old_string": "secret", "new_string": "leaked"},
			want:   `path "secret-link" is outside the workspace`,
			failed: true},
		{name: "outside",
			args:   map[string]any{"file_path": "/etc/hostname", "old_string": "a", "new_string": "b"},
			want:   `path "/etc/hostname" is outside the workspace`,
			failed: true},
	}
	r := Builtin(Options{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws, outside := fileWorkspace(t)
			file := filepath.Join(ws, "edit.txt")
			if err := os.WriteFile(file, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			a := map[string]any{"file_path": "edit.txt"}
			for k, v := range tt.args {
				a[k] = v
			}
			res := execute(t, t.Context(), r, Call{Name: "edit_file", Arguments: args(t, a), Workspace: ws})
			want := strings.NewReplacer("{ws}", ws, "{file}", file).Replace(tt.want)
			if res.Output != want || res.Failed != tt.failed {
				t.Errorf("edit_file(%v) = %+v, want {Output:%q Failed:%v}", a, res, want, tt.failed)
			}
			if a["file_path"] == "edit.txt" {
				got, err := os.ReadFile(file)
				if err != nil || string(got) != tt.wantContent {
					t.Errorf("file = %q, %v, want %q", got, err, tt.wantContent)
				}
				if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
					t.Errorf("file mode = %v, %v, want it kept at 0600", fi.Mode(), err)
				}
			}
			if got, _ := os.ReadFile(filepath.Join(outside, "secret.txt")); string(got) != "secret\n" {
				t.Errorf("file outside the workspace changed to %q", got)
			}
		})
	}
}

package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// editFile is edit_file: exact-string replacement in a file.
type editFile struct{ lock LockFunc }

type editArgs struct {
	FilePath   string `json:"file_path"`
	OldString  string `json:"old_string"`
	NewString  string `json:"new_string"`
	ReplaceAll bool   `json:"replace_all"`
}

func (editFile) Spec() Spec {
	return Spec{
		Name: "edit_file",
		Description: "Replace an exact string in a file in the workspace. old_string must match " +
			"the file exactly, whitespace and indentation included, and must occur exactly once " +
			"unless replace_all is true. Read the file first.",
		Parameters: json.RawMessage(`{
  "type": "object",
  "properties": {
    "file_path": {"type": "string", "description": "The file, absolute or relative to the workspace."},
    "old_string": {"type": "string", "description": "The text to replace, exactly as it is in the file."},
    "new_string": {"type": "string", "description": "The text to put in its place; must differ from old_string."},
    "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of exactly one. Default false."}
  },
  "required": ["file_path", "old_string", "new_string"],
  "additionalProperties": false
}`),
		Permission: PermReadWrite,
	}
}

func (t editFile) Run(ctx context.Context, call Call, args json.RawMessage, emit Emit) Result {
	var a editArgs
	if err := json.Unmarshal(args, &a); err != nil {
		return failed(fmt.Sprintf("invalid arguments: %v", err))
	}
	if a.OldString == "" {
		return failed("old_string is empty; use write_file to create or overwrite a whole file")
	}
	if a.OldString == a.NewString {
		return failed("old_string and new_string are identical; there is nothing to change")
	}
	ws, err := openWorkspace(call.Workspace)
	if err != nil {
		return failed(err.Error())
	}
	shown, real, err := ws.resolve(a.FilePath)
	if err != nil {
		return failed(err.Error())
	}
	// One writer per path at a time, across runners (protocol.md §7).
	unlock, err := t.lock(ctx, real)
	if err != nil {
		if ctx.Err() != nil {
			return Result{Failed: true}
		}
		return failed(fmt.Sprintf("lock %s: %v", shown, err))
	}
	defer unlock()
	root, err := ws.root()
	if err != nil {
		return failed(err.Error())
	}
	defer root.Close()
	f, fi, err := ws.openFile(root, shown, ws.rel(real), os.O_RDWR)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return failed("file not found: " + shown + "; use write_file to create it")
	case err != nil:
		return failed(fileError("open", shown, err))
	}
	defer f.Close()
	if fi.Size() > MaxFileSize {
		return failed(fmt.Sprintf("%s is %d bytes, over the %d-byte limit of edit_file", shown, fi.Size(), MaxFileSize))
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return failed(fmt.Sprintf("read %s: %v", shown, unwrapPath(err)))
	}
	if len(data) > MaxFileSize {
		return failed(fmt.Sprintf("%s is over the %d-byte limit of edit_file", shown, MaxFileSize))
	}
	content := string(data)
	n := strings.Count(content, a.OldString)
	switch {
	case n == 0:
		return failed("old_string not found in " + shown + "; it must match the file exactly, whitespace included")
	case n > 1 && !a.ReplaceAll:
		return failed(fmt.Sprintf("old_string occurs %d times in %s; add surrounding context to make it unique, or set replace_all to true", n, shown))
	}
	if a.ReplaceAll {
		content = strings.ReplaceAll(content, a.OldString, a.NewString)
	} else {
		content = strings.Replace(content, a.OldString, a.NewString, 1)
	}
	if ctx.Err() != nil {
		return Result{Failed: true}
	}
	if len(content) > MaxFileSize {
		return failed(fmt.Sprintf("the edited %s would be %d bytes, over the %d-byte limit of edit_file", shown, len(content), MaxFileSize))
	}
	// Written through the descriptor that was read: the same file,
	// whatever happened to its path meanwhile.
	if err := f.Truncate(0); err != nil {
		return failed(fmt.Sprintf("write %s: %v", shown, unwrapPath(err)))
	}
	if _, err := f.WriteAt([]byte(content), 0); err != nil {
		return failed(fmt.Sprintf("write %s: %v", shown, unwrapPath(err)))
	}
	if err := f.Close(); err != nil {
		return failed(fmt.Sprintf("write %s: %v", shown, unwrapPath(err)))
	}
	return Result{Output: fmt.Sprintf("replaced %s in %s", plural(n, "occurrence"), shown)}
}

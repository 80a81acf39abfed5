package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// writeFile is write_file: create or overwrite a file.
type writeFile struct{ lock LockFunc }

type writeArgs struct {
	FilePath string `json:"file_path"`
	Content  string `json:"content"`
}

func (writeFile) Spec() Spec {
	return Spec{
		Name: "write_file",
		Description: "Create a file in the workspace, or overwrite it, with the given content. " +
			"Missing parent directories are created.",
		Parameters: json.RawMessage(`{
  "type": "object",
  "properties": {
    "file_path": {"type": "string", "description": "The file, absolute or relative to the workspace."},
    "content": {"type": "string", "description": "The whole new content of the file."}
  },
  "required": ["file_path", "content"],
  "additionalProperties": false
}`),
		Permission: PermReadWrite,
	}
}

func (t writeFile) Run(ctx context.Context, call Call, args json.RawMessage, emit Emit) Result {
	var a writeArgs
	if err := json.Unmarshal(args, &a); err != nil {
		return failed(fmt.Sprintf("invalid arguments: %v", err))
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
	if len(a.Content) > MaxFileSize {
		return failed(fmt.Sprintf("content is %d bytes, over the %d-byte limit of write_file", len(a.Content), MaxFileSize))
	}
	root, err := ws.root()
	if err != nil {
		return failed(err.Error())
	}
	defer root.Close()
	rel := ws.rel(real)
	if fi, err := root.Stat(rel); err == nil {
		if err := regular(shown, fi); err != nil {
			return failed(fileError("write", shown, err))
		}
	}
	if ctx.Err() != nil {
		return Result{Failed: true}
	}
	if err := root.MkdirAll(filepath.Dir(rel), 0o755); err != nil {
		return failed(fmt.Sprintf("create parent directories of %s: %v", shown, unwrapPath(err)))
	}
	// Not O_TRUNC: a special file swapped in after the Stat is refused by
	// openFile before anything is cut.
	f, _, err := ws.openFile(root, shown, rel, os.O_WRONLY|os.O_CREATE)
	if err != nil {
		return failed(fileError("write", shown, err))
	}
	defer f.Close()
	if err := f.Truncate(0); err != nil {
		return failed(fmt.Sprintf("write %s: %v", shown, unwrapPath(err)))
	}
	if _, err := f.Write([]byte(a.Content)); err != nil {
		return failed(fmt.Sprintf("write %s: %v", shown, unwrapPath(err)))
	}
	if err := f.Close(); err != nil {
		return failed(fmt.Sprintf("write %s: %v", shown, unwrapPath(err)))
	}
	return Result{Output: fmt.Sprintf("wrote %s to %s", plural(len(a.Content), "byte"), shown)}
}

// plural returns "1 byte", "2 bytes".
func plural(n int, unit string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", unit)
	}
	return fmt.Sprintf("%d %ss", n, unit)
}

package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// writeFile is write_file: create or overwrite a file.
type writeFile struct{}

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

func (writeFile) Run(ctx context.Context, call Call, args json.RawMessage, emit Emit) Result {
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
	if fi, err := os.Stat(real); err == nil && fi.IsDir() {
		return failed(shown + " is a directory, not a file")
	}
	if ctx.Err() != nil {
		return Result{Failed: true}
	}
	if err := os.MkdirAll(filepath.Dir(real), 0o755); err != nil {
		return failed(fmt.Sprintf("create parent directories of %s: %v", shown, err))
	}
	if err := os.WriteFile(real, []byte(a.Content), 0o644); err != nil {
		return failed(fmt.Sprintf("write %s: %v", shown, err))
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

package tools

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"unicode/utf8"
)

const (
	defaultReadLimit = 2000
	// binarySniffLen is how much of a file read_file inspects to tell text
	// from binary.
	binarySniffLen = 8192
)

// readFile is read_file: a line-numbered window of a text file.
type readFile struct{}

type readArgs struct {
	FilePath string `json:"file_path"`
	Offset   int    `json:"offset"`
	Limit    int    `json:"limit"`
}

func (readFile) Spec() Spec {
	return Spec{
		Name: "read_file",
		Description: "Read a text file in the workspace. Lines are numbered like cat -n: the line " +
			"number right-aligned in 6 columns, a tab, then the line. Reads " +
			strconv.Itoa(defaultReadLimit) + " lines from offset unless limit says otherwise; " +
			"use offset and limit to page through long files.",
		Parameters: json.RawMessage(`{
  "type": "object",
  "properties": {
    "file_path": {"type": "string", "description": "The file, absolute or relative to the workspace."},
    "offset": {"type": "integer", "minimum": 1, "description": "First line to read, counting from 1. Default 1."},
    "limit": {"type": "integer", "minimum": 1, "description": "How many lines to read. Default ` + strconv.Itoa(defaultReadLimit) + `."}
  },
  "required": ["file_path"],
  "additionalProperties": false
}`),
		Permission: PermRead,
	}
}

// Run streams the window line by line, so memory stays bounded by the read
// buffer however long the file or its lines are.
func (readFile) Run(ctx context.Context, call Call, args json.RawMessage, emit Emit) Result {
	var a readArgs
	if err := json.Unmarshal(args, &a); err != nil {
		return failed(fmt.Sprintf("invalid arguments: %v", err))
	}
	if a.Offset <= 0 {
		a.Offset = 1
	}
	if a.Limit <= 0 {
		a.Limit = defaultReadLimit
	}
	ws, err := openWorkspace(call.Workspace)
	if err != nil {
		return failed(err.Error())
	}
	shown, real, err := ws.resolve(a.FilePath)
	if err != nil {
		return failed(err.Error())
	}
	root, err := ws.root()
	if err != nil {
		return failed(err.Error())
	}
	defer root.Close()
	f, _, err := ws.openFile(root, shown, ws.rel(real), os.O_RDONLY)
	if err != nil {
		if fi, serr := root.Stat(ws.rel(real)); serr == nil && fi.IsDir() {
			return failed(shown + " is a directory, not a file; list it with exec_command")
		}
		return failed(fileError("open", shown, err))
	}
	defer f.Close()

	br := bufio.NewReaderSize(f, 64<<10)
	sniff, err := br.Peek(binarySniffLen)
	if err != nil && err != io.EOF && !errors.Is(err, bufio.ErrBufferFull) {
		return failed(fmt.Sprintf("read %s: %v", shown, err))
	}
	if why := binaryReason(sniff, len(sniff) < binarySniffLen); why != "" {
		return failed(fmt.Sprintf("%s looks like a binary file (%s); read_file only reads text", shown, why))
	}

	// Lines are gathered into fragments of about flushLen bytes rather than
	// emitted one by one.
	const flushLen = 16 << 10
	var buf []byte
	flush := func() {
		if len(buf) > 0 {
			emit(string(buf))
			buf = buf[:0]
		}
	}
	defer flush()

	end := a.Offset + a.Limit // first line not shown
	line := 0                 // lines started so far
	inLine := false
	shownBytes := 0 // of the window, bounded by MaxFileSize
	for {
		if ctx.Err() != nil {
			return Result{Failed: true}
		}
		piece, err := br.ReadSlice('\n')
		if len(piece) > 0 {
			if !inLine {
				line++
				inLine = true
				if line >= end {
					return Result{Output: fmt.Sprintf("[more lines follow; continue with offset=%d]", end)}
				}
				if line >= a.Offset {
					buf = fmt.Appendf(buf, "%6d\t", line)
				}
			}
			if line >= a.Offset {
				if shownBytes += len(piece); shownBytes > MaxFileSize {
					return Result{Output: fmt.Sprintf("[read stopped after %d bytes in line %d; continue with offset=%d]", MaxFileSize, line, line+1)}
				}
				buf = append(buf, piece...)
				if len(buf) >= flushLen {
					flush()
				}
			}
			if piece[len(piece)-1] == '\n' {
				inLine = false
			}
		}
		switch {
		case err == nil, errors.Is(err, bufio.ErrBufferFull):
		case err == io.EOF:
			switch {
			case line == 0 && a.Offset == 1:
				return Result{Output: "[empty file]"}
			case a.Offset > line:
				return failed(fmt.Sprintf("offset %d is past the end of %s (%d lines)", a.Offset, shown, line))
			}
			return Result{}
		default:
			return failed(fmt.Sprintf("read %s: %v", shown, err))
		}
	}
}

// binaryReason says why the start of a file looks binary, or returns "". A
// sniff that stops mid-file may cut the last rune, which is fine.
func binaryReason(sniff []byte, whole bool) string {
	if bytes.IndexByte(sniff, 0) >= 0 {
		return "it contains NUL bytes"
	}
	if !whole {
		for i := len(sniff) - 1; i >= 0 && i >= len(sniff)-(utf8.UTFMax-1); i-- {
			if utf8.RuneStart(sniff[i]) {
				if !utf8.FullRune(sniff[i:]) {
					sniff = sniff[:i]
				}
				break
			}
		}
	}
	if !utf8.Valid(sniff) {
		return "it is not valid UTF-8"
	}
	return ""
}

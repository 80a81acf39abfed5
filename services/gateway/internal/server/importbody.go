package server

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"floe.dev/pkg/omni"
)

// The import body, {dataBase64, model?, workspace?}, is read as a stream:
// the Trace file is base64-decoded as its string arrives and checked line
// by line into a temporary file, so an import holds about one record in
// memory, never the file (a 32 MiB import cost ~165 MB when the body, the
// string and the decoded file were each held whole).

// importBody is the decoded import request.
type importBody struct {
	model, workspace string
	seenData         bool
}

// readImportBody parses the JSON object of an import request from br,
// streaming dataBase64's decoded bytes into sink. Fields other than the
// three are refused, as decodeBody's DisallowUnknownFields does.
func readImportBody(br *bufio.Reader, sink func(io.Reader) *apiError) (*importBody, *apiError) {
	bad := func(format string, args ...any) *apiError {
		return errorf(http.StatusBadRequest, omni.CodeBadRequest, "malformed JSON body: "+format, args...)
	}
	out := &importBody{}
	if c, err := nextNonSpace(br); err != nil || c != '{' {
		if err == io.EOF {
			return nil, errorf(http.StatusBadRequest, omni.CodeBadRequest, "request body is empty")
		}
		return nil, bad("want an object")
	}
	seen := map[string]bool{}
	for first := true; ; first = false {
		c, err := nextNonSpace(br)
		if err != nil {
			return nil, bad("unexpected end of the body")
		}
		if c == '}' && first {
			break
		}
		if !first {
			if c == '}' {
				break
			}
			if c != ',' {
				return nil, bad("want , or } after a field")
			}
			if c, err = nextNonSpace(br); err != nil {
				return nil, bad("unexpected end of the body")
			}
		}
		if c != '"' {
			return nil, bad("want a field name")
		}
		key, e := readSmallString(br, 64)
		if e != nil {
			return nil, e
		}
		if seen[key] {
			return nil, bad("field %q twice", key)
		}
		seen[key] = true
		if c, err = nextNonSpace(br); err != nil || c != ':' {
			return nil, bad("want : after %q", key)
		}
		if c, err = nextNonSpace(br); err != nil || c != '"' {
			return nil, bad("field %q: expected string", key)
		}
		switch key {
		case "dataBase64":
			sr := &jsonStringReader{br: br}
			if e := sink(base64.NewDecoder(base64.StdEncoding, sr)); e != nil {
				return nil, e
			}
			// The decoder stops at the padding: the rest of the string
			// must be empty.
			if n, err := io.Copy(io.Discard, sr); err != nil || n > 0 {
				if err == nil {
					err = errors.New("data after the padding")
				}
				return nil, badRequest("dataBase64 is not base64: %v", err)
			}
			out.seenData = true
		case "model":
			if out.model, e = readSmallString(br, 4096); e != nil {
				return nil, e
			}
		case "workspace":
			if out.workspace, e = readSmallString(br, 4096); e != nil {
				return nil, e
			}
		default:
			return nil, bad("json: unknown field %q", key)
		}
	}
	if _, err := nextNonSpace(br); err != io.EOF {
		return nil, bad("trailing data after the value")
	}
	return out, nil
}

func nextNonSpace(br *bufio.Reader) (byte, error) {
	for {
		c, err := br.ReadByte()
		if err != nil {
			return 0, err
		}
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return c, nil
	}
}

// readSmallString reads the rest of a JSON string (after its opening
// quote) of at most limit bytes, with every JSON escape.
func readSmallString(br *bufio.Reader, limit int) (string, *apiError) {
	raw := []byte{'"'}
	for esc := false; ; {
		c, err := br.ReadByte()
		if err != nil {
			return "", errorf(http.StatusBadRequest, omni.CodeBadRequest, "malformed JSON body: unterminated string")
		}
		raw = append(raw, c)
		if len(raw) > limit+2 {
			return "", badRequest("a field is longer than %d bytes", limit)
		}
		if esc {
			esc = false
		} else if c == '\\' {
			esc = true
		} else if c == '"' {
			break
		}
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", errorf(http.StatusBadRequest, omni.CodeBadRequest, "malformed JSON body: %s", jsonErrorText(err))
	}
	return s, nil
}

// jsonStringReader reads the content of a JSON string holding base64 up to
// its closing quote: the escapes a JSON encoder may write there (\/ and
// line breaks) are undone, any other is an error.
type jsonStringReader struct {
	br   *bufio.Reader
	done bool
}

var errBadEscape = errors.New("an escape base64 cannot hold")

func (r *jsonStringReader) Read(p []byte) (int, error) {
	if r.done {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) {
		if n > 0 && r.br.Buffered() == 0 {
			return n, nil // hand over what we have rather than block
		}
		if _, err := r.br.Peek(1); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return n, err
		}
		buf, _ := r.br.Peek(r.br.Buffered())
		k := len(buf)
		if i := bytes.IndexByte(buf, '"'); i >= 0 {
			k = i
		}
		if i := bytes.IndexByte(buf[:k], '\\'); i >= 0 {
			k = i
		}
		if k = min(k, len(p)-n); k > 0 {
			copy(p[n:], buf[:k])
			r.br.Discard(k)
			n += k
			continue
		}
		c, _ := r.br.ReadByte()
		if c == '"' {
			r.done = true
			if n == 0 {
				return 0, io.EOF
			}
			return n, nil
		}
		e, err := r.br.ReadByte() // c is a backslash
		if err != nil {
			return n, io.ErrUnexpectedEOF
		}
		switch e {
		case '/':
			p[n] = '/'
			n++
		case 'n', 'r':
			// base64 decoders skip line breaks anyway
		default:
			return n, errBadEscape
		}
	}
	return n, nil
}

// importFile checks a Trace file read from src line by line (as
// parseImport would) and writes what is kept to tmp: every record, a torn
// last line dropped. It reads at most maxFile bytes (a 413 past them,
// tooLargeImport) and holds one line at a time.
func importFile(src io.Reader, tmp *os.File, maxFile int64) (*imported, *apiError) {
	lr := &io.LimitedReader{R: src, N: maxFile + 1}
	br := bufio.NewReaderSize(lr, 64<<10)
	bw := bufio.NewWriterSize(tmp, 64<<10)
	imp := &imported{}
	var line []byte
	for n := 1; ; n++ {
		line = line[:0]
		complete := false
		var err error
		for {
			var chunk []byte
			chunk, err = br.ReadSlice('\n')
			if len(line)+len(chunk) > maxImportLine+1 {
				if lr.N <= 0 {
					return nil, tooLargeImport(maxFile)
				}
				return nil, badRequest("line %d is longer than %d bytes", n, maxImportLine)
			}
			line = append(line, chunk...)
			if err != bufio.ErrBufferFull {
				break
			}
		}
		if lr.N <= 0 {
			return nil, tooLargeImport(maxFile)
		}
		if err != nil && err != io.EOF {
			var ce base64.CorruptInputError
			if errors.As(err, &ce) || errors.Is(err, errBadEscape) || errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, badRequest("dataBase64 is not base64: %v", err)
			}
			return nil, &apiError{Status: http.StatusBadRequest, Code: omni.CodeBadRequest, Message: "read request body failed", Err: err}
		}
		if len(line) > 0 && line[len(line)-1] == '\n' {
			line, complete = line[:len(line)-1], true
		}
		if len(line) > maxImportLine {
			return nil, badRequest("line %d is longer than %d bytes", n, maxImportLine)
		}
		if len(line) == 0 && !complete {
			break // end of the file
		}
		keep, e := imp.record(n, line, complete)
		if e != nil {
			return nil, e
		}
		if keep {
			bw.Write(line)
			bw.WriteByte('\n')
		}
		if !complete {
			break
		}
	}
	if imp.records == 0 {
		return nil, badRequest("the Trace holds no record; the first must be session_meta")
	}
	if err := bw.Flush(); err != nil {
		return nil, internalError("write trace file", err)
	}
	return imp, nil
}

func tooLargeImport(maxFile int64) *apiError {
	return errorf(http.StatusRequestEntityTooLarge, omni.CodeTooLarge, "the Trace file is larger than %d bytes", maxFile)
}

// record checks line n of an imported Trace and reports whether it is
// kept (a torn last line is not; a blank line is, as it was).
func (imp *imported) record(n int, line []byte, complete bool) (bool, *apiError) {
	text := bytes.TrimSpace(line)
	if len(text) == 0 {
		return true, nil
	}
	m, err := omni.Decode(text)
	if err != nil {
		if !complete {
			return false, nil // a torn last line: a write cut short by a crash
		}
		return false, badRequest("line %d is not a valid record: %v", n, err)
	}
	if imp.records == 0 {
		if m.Type != omni.KindSessionMeta {
			return false, badRequest("line %d: the first record is %s, want session_meta", n, m.Type)
		}
		sid := m.Payload.SessionID
		if !importableID(sid) {
			return false, badRequest("line %d: session id %q cannot name a Session here (letters, digits, -, _ and = only, at most 128)", n, sid)
		}
		t, err := time.Parse(time.RFC3339Nano, m.Timestamp)
		if err != nil {
			return false, badRequest("line %d: timestamp %q is not ISO-8601", n, m.Timestamp)
		}
		imp.meta, imp.first = m, t.UTC()
	} else if m.Type == omni.KindSessionMeta && m.Payload.SessionID != imp.meta.Payload.SessionID {
		return false, badRequest("line %d: session_meta of another session (%s)", n, m.Payload.SessionID)
	}
	imp.records++
	return true, nil
}

// importableID reports whether a Session id can be stored: a KV key (the
// Session record), a subject token and a file name. A KV key also allows
// "." and "/", which subjects and file names do not.
func importableID(id string) bool {
	if id == "" || len(id) > 128 || !omni.ValidSessionID(id) {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '=':
		default:
			return false
		}
	}
	return true
}

// importTemp creates the temporary file an import is checked into, in the
// traces directory (the same file system as its final place).
func importTemp(home string) (*os.File, error) {
	dir := home + "/traces"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(dir, ".import-*")
	if err != nil {
		return nil, fmt.Errorf("create import file: %w", err)
	}
	return f, nil
}

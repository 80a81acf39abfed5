package server

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// FuzzReadImportBody feeds the streaming import-body parser arbitrary
// bytes: it never panics, and whatever encoding/json accepts as the same
// three-field object it reads the same way (an oracle), the data decoded
// byte for byte.
func FuzzReadImportBody(f *testing.F) {
	for _, s := range []string{
		`{"dataBase64":"aGVsbG8K"}`,
		`{"dataBase64":"aGVsbG8K","model":"openai:x","workspace":"/w"}`,
		` { "workspace" : "/a\u00e9" , "dataBase64" : "aGVs\nbG8K" } `,
		`{"dataBase64":"aGVsbG8K\/"}`,
		`{"dataBase64":""}`, `{}`, `{"x":1}`, `{"dataBase64":"%%%"}`, `{"dataBase64":"aGVsbG8K"} {}`,
		`{"dataBase64":"aGVsbG8K","dataBase64":"aGVsbG8K"}`, `[`, ``, `{"model":"a\"b"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var got bytes.Buffer
		req, e := readImportBody(bufio.NewReader(bytes.NewReader(body)), func(src io.Reader) *apiError {
			if _, err := io.Copy(&got, io.LimitReader(src, 1<<20)); err != nil {
				return badRequest("dataBase64 is not base64: %v", err)
			}
			return nil
		})
		var want struct {
			DataBase64 *string `json:"dataBase64"`
			Model      string  `json:"model"`
			Workspace  string  `json:"workspace"`
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		jerr := dec.Decode(&want)
		if jerr == nil {
			if _, err := dec.Token(); err != io.EOF {
				jerr = io.ErrUnexpectedEOF
			}
		}
		if e != nil || jerr != nil || want.DataBase64 == nil {
			return // refusals need not agree in wording; the oracle is for what is taken
		}
		if strings.ContainsAny(*want.DataBase64, "\\\"") {
			return
		}
		data, err := base64.StdEncoding.DecodeString(strings.NewReplacer("\n", "", "\r", "").Replace(*want.DataBase64))
		if err != nil {
			return
		}
		if req.model != want.Model || req.workspace != want.Workspace || !bytes.Equal(got.Bytes(), data) {
			t.Fatalf("body %q: read model %q workspace %q data %q; json says %q %q %q", body, req.model, req.workspace, got.Bytes(), want.Model, want.Workspace, data)
		}
	})
}

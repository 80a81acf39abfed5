package gateway_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

const importSID = "session-2026-07-18-11-10-22-3f8a1c2d"

func metaLine(sid, provider, ws string) string {
	return fmt.Sprintf(`{"timestamp":"2026-07-18T03:10:22.531Z","type":"session_meta","payload":{"session_id":%q,"provider":%q,"model_id":"m-1","model_context_window":"unknown","system_prompt":"be brief","workspace":%q}}`, sid, provider, ws)
}

const userLine = `{"timestamp":"2026-07-18T03:10:23.000Z","type":"model_msg","payload":{"type":"text","role":"user","text":"hi","stop_reason":"completed"}}`

func importEnv(t *testing.T, configure func(*gateway.Config)) (*testGateway, string) {
	t.Helper()
	env := newBus(t)
	ws := t.TempDir()
	g := startGateway(t, env, "", func(c *gateway.Config) {
		c.WorkspaceRoots = []string{ws}
		if configure != nil {
			configure(c)
		}
	})
	return g, ws
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// nothingCreated checks that no Session and no Trace file exist.
func nothingCreated(t *testing.T, g *testGateway) {
	t.Helper()
	list, err := g.Alice.ListSessions(ctxT(t))
	if err != nil || len(list) != 0 {
		t.Fatalf("sessions after a refused import: %v, %v", list, err)
	}
	var files []string
	filepath.Walk(filepath.Join(g.Home, "traces"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if len(files) != 0 {
		t.Fatalf("files after a refused import: %v", files)
	}
}

func TestImportRejectsBadInputAndCreatesNothing(t *testing.T) {
	t.Parallel()
	g, ws := importEnv(t, func(c *gateway.Config) {
		c.MaxImport = 12 << 20
		c.ReadBodyTimeout = 3 * time.Minute // 13 MB bodies under -race on a loaded machine
	})
	meta := metaLine(importSID, "deepseek", ws)
	garbage := make([]byte, 4096)
	rand.New(rand.NewSource(1)).Read(garbage)
	huge := `{"timestamp":"2026-07-18T03:10:23.000Z","type":"model_msg","payload":{"type":"text","role":"user","text":"` + strings.Repeat("x", 10<<20) + `"}}`
	tests := []struct {
		name   string
		body   client.ImportTrace
		status int
		substr string
	}{
		{"not base64", client.ImportTrace{DataBase64: "%%% not base64 %%%"}, 400, "not base64"},
		{"empty", client.ImportTrace{DataBase64: ""}, 400, "no record"},
		{"not JSONL", client.ImportTrace{DataBase64: b64("hello world\nthis is text\n")}, 400, "line 1"},
		{"first record not session_meta", client.ImportTrace{DataBase64: b64(userLine + "\n" + meta + "\n")}, 400, "want session_meta"},
		{"malformed middle line", client.ImportTrace{DataBase64: b64(meta + "\n" + userLine + "\n{\"timestamp\":\n" + userLine + "\n")}, 400, "line 3"},
		{"invalid record", client.ImportTrace{DataBase64: b64(meta + "\n" + `{"timestamp":"x","type":"model_msg","payload":{"type":"video","role":"user"}}` + "\n")}, 400, "line 2"},
		{"a line of 10 MB", client.ImportTrace{DataBase64: b64(meta + "\n" + huge + "\n")}, 400, "line 2 is longer"},
		{"binary garbage", client.ImportTrace{DataBase64: base64.StdEncoding.EncodeToString(garbage)}, 400, ""},
		{"binary garbage after a newline", client.ImportTrace{DataBase64: base64.StdEncoding.EncodeToString(append(garbage, '\n'))}, 400, "line 1"},
		{"session id that cannot name a file", client.ImportTrace{DataBase64: b64(metaLine("../../etc", "openai", ws) + "\n")}, 400, "cannot name"},
		{"session id that is no KV key", client.ImportTrace{DataBase64: b64(metaLine("a:b", "openai", ws) + "\n")}, 400, "cannot name"},
		{"session id with a non-ASCII letter", client.ImportTrace{DataBase64: b64(metaLine("sessiön-1", "openai", ws) + "\n")}, 400, "cannot name"},
		{"session id with a space", client.ImportTrace{DataBase64: b64(metaLine("a b", "openai", ws) + "\n")}, 400, "cannot name"},
		{"session_meta without an id", client.ImportTrace{DataBase64: b64(metaLine("", "openai", ws) + "\n")}, 400, "line 1"},
		{"meta of another session", client.ImportTrace{DataBase64: b64(meta + "\n" + metaLine("session-2026-07-18-11-10-22-00000000", "openai", ws) + "\n")}, 400, "another session"},
		{"workspace that does not exist here", client.ImportTrace{DataBase64: b64(metaLine(importSID, "openai", "/home/nobody/work") + "\n")}, 400, "pass workspace"},
		{"workspace outside the roots", client.ImportTrace{DataBase64: b64(meta + "\n"), Workspace: os.TempDir()}, 400, "outside"},
		{"bad model", client.ImportTrace{DataBase64: b64(meta + "\n"), Model: "nomodel"}, 400, "provider:model_id"},
		{"file past the cap", client.ImportTrace{DataBase64: b64(meta + "\n" + strings.Repeat(userLine+"\n", (12<<20)/len(userLine)+10))}, 413, ""},
	}
	for _, tc := range tests {
		_, err := g.Alice.ImportTrace(ctxT(t), tc.body)
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.Status != tc.status || !strings.Contains(ae.Message, tc.substr) {
			t.Errorf("%s: import = %v, want %d mentioning %q", tc.name, err, tc.status, tc.substr)
		}
		nothingCreated(t, g)
	}

	// A body past the route's cap is refused before it is read.
	big := bytes.Repeat([]byte("A"), int(4*((12<<20)/3)+128<<10))
	req, _ := http.NewRequest(http.MethodPost, g.URL+"/api/traces/import", bytes.NewReader(append(append([]byte(`{"dataBase64":"`), big...), '"', '}')))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("body past the cap: %v %v, want 413", resp.Status, err)
	}
	resp.Body.Close()
	// JSON only.
	req, _ = http.NewRequest(http.MethodPost, g.URL+"/api/traces/import", strings.NewReader(meta))
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("ndjson body: %v %v, want 415", resp.Status, err)
	}
	resp.Body.Close()
	nothingCreated(t, g)
}

func TestImportCreatesAResumableSession(t *testing.T) {
	t.Parallel()
	g, ws := importEnv(t, nil)
	ctx := ctxT(t)
	// A torn last line (a crash mid-write) is dropped; blank lines are kept.
	data := metaLine(importSID, "deepseek", ws) + "\n\n" + userLine + "\n" + `{"timestamp":"2026-07-18T03:10:24.000Z","type":"event_msg","payl`
	imp, err := g.Alice.ImportTrace(ctx, client.ImportTrace{DataBase64: b64(data)})
	if err != nil {
		t.Fatal(err)
	}
	if imp.SessionID != importSID || imp.Index != 1 || imp.Date != "2026-07-18" {
		t.Fatalf("import = %+v", imp)
	}
	path := filepath.Join(g.Home, "traces", "2026-07-18", importSID+"_001.jsonl")
	got, err := os.ReadFile(path)
	if want := metaLine(importSID, "deepseek", ws) + "\n\n" + userLine + "\n"; err != nil || string(got) != want {
		t.Fatalf("file = %q, %v; want %q", got, err, want)
	}
	s, err := g.Alice.GetSession(ctx, importSID)
	if err != nil || s.Model != "openai:m-1" || s.Workspace != ws || s.SystemPrompt != "be brief" || s.State != omni.StateIdle {
		t.Fatalf("session = %+v, %v", s, err)
	}
	if s.CommandPolicy == nil || s.CommandPolicy.Source != "factory" {
		t.Fatalf("imported session policy = %+v", s.CommandPolicy)
	}
	// Another caller does not see it; the same id again is a conflict.
	if _, err := g.Bob.GetSession(ctx, importSID); !client.IsCode(err, omni.CodeNotFound) {
		t.Fatalf("bob sees alice's import: %v", err)
	}
	if _, err := g.Alice.ImportTrace(ctx, client.ImportTrace{DataBase64: b64(data)}); !client.IsCode(err, omni.CodeTraceExists) {
		t.Fatalf("second import = %v, want 409 trace_session_exists", err)
	}
	if _, err := g.Bob.ImportTrace(ctx, client.ImportTrace{DataBase64: b64(data)}); !client.IsCode(err, omni.CodeTraceExists) {
		t.Fatalf("second import by another caller = %v, want 409", err)
	}
	// The history API reads it, and its Trace route serves the bytes.
	msgs, err := g.Alice.Messages(ctx, importSID)
	if err != nil || len(msgs.Messages) != 2 {
		t.Fatalf("messages = %v, %v", msgs, err)
	}
	raw, err := g.Alice.Trace(ctx, importSID, 1)
	if err != nil || string(raw) != string(got) {
		t.Fatalf("GET trace 1 = %v", err)
	}
}

func TestImportModelMapping(t *testing.T) {
	t.Parallel()
	g, ws := importEnv(t, nil)
	for i, tc := range []struct{ provider, override, want string }{
		{"anthropic", "", "anthropic:m-1"},
		{"openai", "", "openai:m-1"},
		{"deepseek", "", "openai:m-1"},
		{"openrouter", "", "openai:m-1"},
		{"custom", "", "openai:m-1"},
		{"deepseek", "anthropic:claude-x", "anthropic:claude-x"},
	} {
		sid := fmt.Sprintf("session-2026-07-18-11-10-22-%08x", i)
		imp, err := g.Alice.ImportTrace(ctxT(t), client.ImportTrace{DataBase64: b64(metaLine(sid, tc.provider, "/gone") + "\n"), Model: tc.override, Workspace: ws})
		if err != nil {
			t.Fatalf("%s: %v", tc.provider, err)
		}
		s, err := g.Alice.GetSession(ctxT(t), imp.SessionID)
		if err != nil || s.Model != tc.want {
			t.Errorf("provider %q (override %q) = %q, %v; want %q", tc.provider, tc.override, s.Model, err, tc.want)
		}
	}
}

// An id in the original's local time names another day than its first
// record's UTC timestamp: the Trace lands in the record's date directory
// and readers find it through its import mark, in a home where Files looks
// nowhere else (indexed, as the tracer leaves every home).
func TestImportIntoAnotherDateDirectoryIsFound(t *testing.T) {
	t.Parallel()
	g, ws := importEnv(t, nil)
	ctx := ctxT(t)
	if _, err := trace.IndexImports(g.Home); err != nil {
		t.Fatal(err)
	}
	const sid = "session-2026-07-19-01-10-22-3f8a1c2d" // 2026-07-18T17:10:22Z in UTC
	data := strings.Replace(metaLine(sid, "openai", ws), "2026-07-18T03:10:22.531Z", "2026-07-18T17:10:22.531Z", 1) + "\n" + userLine + "\n"
	imp, err := g.Alice.ImportTrace(ctx, client.ImportTrace{DataBase64: b64(data)})
	if err != nil || imp.Date != "2026-07-18" {
		t.Fatalf("import = %+v, %v", imp, err)
	}
	if b, err := os.ReadFile(filepath.Join(g.Home, "traces", "2026-07-19", sid+".import")); err != nil || string(b) != "2026-07-18\n" {
		t.Fatalf("import mark = %q, %v", b, err)
	}
	files, err := trace.Files(g.Home, sid)
	if err != nil || len(files) != 1 || files[0] != filepath.Join(g.Home, "traces", "2026-07-18", sid+"_001.jsonl") {
		t.Fatalf("trace files = %v, %v", files, err)
	}
	if msgs, err := g.Alice.Messages(ctx, sid); err != nil || len(msgs.Messages) != 2 {
		t.Fatalf("messages = %v, %v", msgs, err)
	}
	if raw, err := g.Alice.Trace(ctx, sid, 1); err != nil || string(raw) != data {
		t.Fatalf("GET trace 1 = %q, %v", raw, err)
	}
	if _, err := g.Alice.ImportTrace(ctx, client.ImportTrace{DataBase64: b64(data)}); !client.IsCode(err, omni.CodeTraceExists) {
		t.Fatalf("second import = %v, want 409 trace_session_exists", err)
	}
}

// A Trace file of 32 MiB (the default cap) imports; one byte more is 413.
func TestImportTakes32MiB(t *testing.T) {
	t.Parallel()
	// The cap is what is tested, not the slow-body guard: a 43 MB body
	// under -race on a loaded 2-core machine once took over the default 30 s.
	g, ws := importEnv(t, func(c *gateway.Config) { c.ReadBodyTimeout = 3 * time.Minute })
	head := metaLine(importSID, "openai", ws) + "\n"
	var b strings.Builder
	b.WriteString(head)
	rec := `{"timestamp":"2026-07-18T03:10:23.000Z","type":"model_msg","payload":{"type":"text","role":"user","text":"` + strings.Repeat("y", 64<<10) + `","stop_reason":"completed"}}` + "\n"
	for b.Len()+len(rec) <= gateway.DefaultMaxImport {
		b.WriteString(rec)
	}
	pad := gateway.DefaultMaxImport - b.Len() - 1
	b.WriteString(strings.Repeat(" ", pad) + "\n")
	if b.Len() != gateway.DefaultMaxImport {
		t.Fatalf("built %d bytes", b.Len())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // 43 MB bodies on a shared machine
	defer cancel()
	if _, err := g.Alice.ImportTrace(ctx, client.ImportTrace{DataBase64: b64(b.String() + " ")}); !client.IsCode(err, omni.CodeTooLarge) {
		t.Fatalf("32 MiB + 1 = %v, want 413", err)
	}
	start := time.Now()
	imp, err := g.Alice.ImportTrace(ctx, client.ImportTrace{DataBase64: b64(b.String())})
	t.Logf("32 MiB import took %v", time.Since(start))
	if err != nil {
		t.Fatalf("32 MiB import: %v", err)
	}
	fi, err := os.Stat(filepath.Join(g.Home, "traces", imp.Date, importSID+"_001.jsonl"))
	if err != nil || fi.Size() != int64(gateway.DefaultMaxImport) {
		t.Fatalf("imported file: %v, %v", fi, err)
	}
}

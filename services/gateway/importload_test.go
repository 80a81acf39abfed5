package gateway_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

// importStream is the body of an import of size bytes of Trace (a
// session_meta and 64 KiB records), generated as it is sent so the client
// holds none of it.
func importStream(sid, ws string, size int) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte(`{"dataBase64":"`))
		enc := base64.NewEncoder(base64.StdEncoding, pw)
		meta := metaLine(sid, "openai", ws) + "\n"
		enc.Write([]byte(meta))
		rec := []byte(`{"timestamp":"2026-07-18T03:10:23.000Z","type":"model_msg","payload":{"type":"text","role":"user","text":"` + strings.Repeat("y", 64<<10) + `","stop_reason":"completed"}}` + "\n")
		for n := len(meta); n+len(rec) <= size; n += len(rec) {
			if _, err := enc.Write(rec); err != nil {
				return
			}
		}
		enc.Close()
		pw.Write([]byte(`"}`))
		pw.Close()
	}()
	return pr
}

func postImport(ctx context.Context, url, token string, body io.Reader) (*http.Response, error) {
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/api/traces/import", body)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	return http.DefaultClient.Do(req)
}

// heapObjects is the bytes of live and not yet swept heap objects.
func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// A 32 MiB import holds about one record in memory: the heap grows by
// less than twice the file (it was ~5×: the body, the string and the
// decoded file each held whole). Not parallel: the heap is the process's.
func TestImportMemoryIsBoundedByTheFile(t *testing.T) {
	g, ws := importEnv(t, nil)
	const size = 32 << 20
	runtime.GC()
	base := heapObjects()
	var peak uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(time.Millisecond)
		defer tk.Stop()
		for {
			if h := heapObjects(); h > peak {
				peak = h
			}
			select {
			case <-stop:
				return
			case <-tk.C:
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // 43 MB of body on a shared machine
	defer cancel()
	resp, err := postImport(ctx, g.URL, aliceToken, importStream(importSID, ws, size))
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("import: %d %s", resp.StatusCode, b)
	}
	grew := int64(peak) - int64(base)
	t.Logf("32 MiB import: heap peak %.1f MiB over a base of %.1f MiB (%.2f× the file)", float64(grew)/(1<<20), float64(base)/(1<<20), float64(grew)/size)
	if grew > 2*size {
		t.Errorf("the heap grew by %d bytes during a %d-byte import, want at most twice the file", grew, size)
	}
	files, err := trace.Files(g.Home, importSID)
	if err != nil || len(files) != 1 {
		t.Fatalf("trace files %v, %v", files, err)
	}
	if fi, err := os.Stat(files[0]); err != nil || fi.Size() < size-(70<<10) {
		t.Fatalf("imported file %v, %v", fi, err)
	}
}

// Imports beyond MaxImports at once get 429 with Retry-After; a running
// one finishes, and a later one is taken.
func TestImportsAreBoundedInNumber(t *testing.T) {
	t.Parallel()
	g, ws := importEnv(t, func(c *gateway.Config) { c.MaxImports = 1 })
	pr, pw := io.Pipe()
	first := make(chan *http.Response, 1)
	go func() {
		resp, err := postImport(ctxT(t), g.URL, aliceToken, pr)
		if err != nil {
			t.Error(err)
		}
		first <- resp
	}()
	pw.Write([]byte(`{"dataBase64":"` + b64(metaLine(importSID, "openai", ws)+"\n")))
	// The first holds the only slot while its body trickles: the second waits
	// for nothing and is refused.
	var resp *http.Response
	eventually(t, "the second import refused", func() bool {
		var err error
		resp, err = postImport(ctxT(t), g.URL, aliceToken, strings.NewReader(fmt.Sprintf(`{"dataBase64":%q}`, b64(metaLine("session-2026-07-18-11-10-22-00000002", "openai", ws)+"\n"))))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusTooManyRequests
	})
	if resp.Header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	pw.Write([]byte(`"}`))
	pw.Close()
	if r := <-first; r == nil || r.StatusCode != http.StatusCreated {
		t.Fatalf("the first import: %v", r)
	}
	if _, err := g.Alice.ImportTrace(ctxT(t), client.ImportTrace{DataBase64: b64(metaLine("session-2026-07-18-11-10-22-00000003", "openai", ws) + "\n")}); err != nil {
		t.Fatalf("an import after the slot freed: %v", err)
	}
}

// Two imports of one id with different dates race: exactly one wins and
// its history is the one served; an import that finds the id claimed
// (another in progress) is refused.
func TestConcurrentImportsOfOneIDLandOnce(t *testing.T) {
	t.Parallel()
	g, ws := importEnv(t, func(c *gateway.Config) { c.MaxImports = 8 })
	for round := range 6 {
		sid := fmt.Sprintf("session-2026-07-18-11-10-22-0000000%d", round)
		bodies := []string{
			metaLine(sid, "openai", ws) + "\n" + userLine + "\n",
			strings.Replace(metaLine(sid, "openai", ws), "2026-07-18T", "2026-05-02T", 1) + "\n",
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = g.Alice.ImportTrace(ctxT(t), client.ImportTrace{DataBase64: b64(bodies[i])})
			}()
		}
		wg.Wait()
		won := -1
		for i, err := range errs {
			switch {
			case err == nil:
				if won >= 0 {
					t.Fatalf("round %d: both imports of %s succeeded", round, sid)
				}
				won = i
			case !client.IsCode(err, omni.CodeTraceExists):
				t.Fatalf("round %d: import %d: %v, want 201 or 409", round, i, err)
			}
		}
		if won < 0 {
			t.Fatalf("round %d: neither import of %s succeeded: %v", round, sid, errs)
		}
		m, err := g.Alice.Messages(ctxT(t), sid)
		if err != nil || len(m.Messages) != 2-won {
			t.Fatalf("round %d: the winner (%d) has %v, %v; want its %d messages", round, won, m, err, 2-won)
		}
		files, err := trace.Files(g.Home, sid)
		if err != nil || len(files) != 1 {
			t.Fatalf("round %d: trace files %v, %v", round, files, err)
		}
	}
	// An id another import holds (its claim) is refused, and nothing lands.
	sid := "session-2026-07-18-11-10-22-000000ff"
	claim := filepath.Join(g.Home, "traces", ".import-"+sid+".claim")
	if err := os.WriteFile(claim, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Alice.ImportTrace(ctxT(t), client.ImportTrace{DataBase64: b64(metaLine(sid, "openai", ws) + "\n")}); !client.IsCode(err, omni.CodeTraceExists) {
		t.Fatalf("import of a claimed id: %v, want 409", err)
	}
	if files, _ := trace.Files(g.Home, sid); len(files) != 0 {
		t.Fatalf("the refused import wrote %v", files)
	}
	// A claim left by a crash expires.
	old := time.Now().Add(-time.Hour)
	os.Chtimes(claim, old, old)
	if _, err := g.Alice.ImportTrace(ctxT(t), client.ImportTrace{DataBase64: b64(metaLine(sid, "openai", ws) + "\n")}); err != nil {
		t.Fatalf("import past a stale claim: %v", err)
	}
}

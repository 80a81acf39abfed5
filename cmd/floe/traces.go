package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"

	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/trace"
	"floe.dev/services/gateway"
	"floe.dev/services/gateway/client"
)

// cmdImport imports a Trace file (written by Floe or by the original
// harness) as a new Session: through a running gateway with --server, or
// directly into $FLOE_HOME (an embedded bus on its store, the gateway's own
// import route in-process) without one.
func cmdImport(ctx context.Context, _ context.CancelFunc, name string, args []string) (int, error) {
	fs := newFlags(name)
	c := newCommon("off")
	c.flagHome(fs)
	model := fs.String("model", "", "model of the imported Session, provider:model_id (default: from the Trace's session_meta)")
	ws := fs.String("workspace", "", "Workspace of the imported Session (default: the Trace's, which must exist here)")
	server := fs.String("server", "", "gateway URL to import through, e.g. http://127.0.0.1:7364 (token from FLOE_API_TOKEN); default: straight into --home")
	if err := parse(fs, args); err != nil {
		return 2, err
	}
	if fs.NArg() != 1 {
		return 2, errors.New("usage: floe import FILE [--model M] [--workspace DIR] [--server URL]")
	}
	data, err := readLimited(fs.Arg(0), gateway.DefaultMaxImport)
	if err != nil {
		return 1, err
	}
	req := client.ImportTrace{DataBase64: base64.StdEncoding.EncodeToString(data), Model: *model, Workspace: *ws}
	var imp *client.Imported
	if *server != "" {
		imp, err = serverClient(*server).ImportTrace(ctx, req)
	} else {
		imp, err = importDirect(ctx, c, req)
	}
	if err != nil {
		return 1, err
	}
	fmt.Printf("imported %s (trace %s/%s_%03d.jsonl)\n", imp.SessionID, imp.Date, imp.SessionID, imp.Index)
	return 0, nil
}

// cmdExport writes one Trace file of a Session, byte for byte, to stdout.
func cmdExport(ctx context.Context, _ context.CancelFunc, name string, args []string) (int, error) {
	fs := newFlags(name)
	c := newCommon("off")
	c.flagHome(fs)
	index := fs.Int("index", 0, "Trace file number (default: the latest, which holds the current context)")
	server := fs.String("server", "", "gateway URL to export from (token from FLOE_API_TOKEN); default: read --home")
	if err := parse(fs, args); err != nil {
		return 2, err
	}
	if fs.NArg() != 1 {
		return 2, errors.New("usage: floe export <session-id> [--index N] [--server URL]")
	}
	sid := fs.Arg(0)
	if *server != "" {
		cl := serverClient(*server)
		idx := *index
		if idx == 0 {
			files, err := cl.Traces(ctx, sid)
			if err != nil {
				return 1, err
			}
			if len(files) == 0 {
				return 1, fmt.Errorf("session %s has no Trace", sid)
			}
			idx = files[len(files)-1].Index
		}
		b, err := cl.Trace(ctx, sid, idx)
		if err != nil {
			return 1, err
		}
		_, err = os.Stdout.Write(b)
		return 0, err
	}
	files, err := trace.Files(c.home, sid)
	if err != nil {
		return 1, err
	}
	path := ""
	for _, f := range files {
		if i, ok := trace.IndexOf(f, sid); ok && (*index == 0 || i == *index) {
			path = f // files are in index order: the last match is the latest
		}
	}
	if path == "" {
		if *index != 0 {
			return 1, fmt.Errorf("session %s has no Trace file %d under %s", sid, *index, c.home)
		}
		return 1, fmt.Errorf("session %s has no Trace under %s", sid, c.home)
	}
	f, err := os.Open(path)
	if err != nil {
		return 1, err
	}
	defer f.Close()
	_, err = io.Copy(os.Stdout, f)
	return 0, err
}

func serverClient(url string) *client.Client {
	var opts []client.Option
	if tok := gateway.ClientToken(os.Getenv("FLOE_API_TOKEN")); tok != "" {
		opts = append(opts, client.WithToken(tok))
	}
	return client.New(url, opts...)
}

// readLimited reads a file of at most limit bytes.
func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes, the import limit", path, limit)
	}
	return b, nil
}

// importDirect imports into c.home with no server running: an embedded
// bus on the home's store (refused while another process holds it: then
// use --server) and the gateway's import route called in-process, so both
// ways check and create exactly the same.
func importDirect(ctx context.Context, c *common, req client.ImportTrace) (*client.Imported, error) {
	var imp *client.Imported
	err := withDirectClient(ctx, c, "import", func(cl *client.Client) (err error) {
		imp, err = cl.ImportTrace(ctx, req)
		return err
	})
	return imp, err
}

// withDirectClient calls fn with a client of a gateway on c.home that
// runs in-process, on an embedded bus over the home's store (refused while
// another process holds it: then use --server), so a command without a
// server checks and creates exactly what the route does.
func withDirectClient(ctx context.Context, c *common, name string, fn func(*client.Client) error) error {
	busCfg, err := c.busConfig()
	if err != nil {
		return err
	}
	log, closeLog := c.quietLogger(name)
	defer closeLog()
	st, err := stack.Start(ctx, stack.Options{Home: c.home, Listen: "off", Bus: busCfg}, log)
	if err != nil {
		return fmt.Errorf("%w %s (is `floe serve` running? then pass --server): %w", errStoreOpen, c.home, err)
	}
	defer st.Stop()
	gc, err := gatewayConfig(c)
	if err != nil {
		return err
	}
	gc.Addr = "" // nothing listens: the handler is called in-process
	h, release, err := gateway.NewHandler(ctx, st.Conn, *gc, log)
	if err != nil {
		return err
	}
	defer release()
	// The request carries FLOE_API_TOKEN like a network caller's, so the
	// Session belongs to the same principal as through the server.
	opts := []client.Option{client.WithHTTPClient(&http.Client{Transport: handlerTransport{h}})}
	if tok := gateway.ClientToken(os.Getenv("FLOE_API_TOKEN")); tok != "" {
		opts = append(opts, client.WithToken(tok))
	}
	// A loopback host: the gateway refuses Host names it does not serve.
	return fn(client.New("http://floe.localhost", opts...))
}

// errStoreOpen marks withDirectClient's failure to open the home's store.
var errStoreOpen = errors.New("open")

// handlerTransport answers requests with an http.Handler in-process.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	resp := rec.Result()
	resp.Request = r
	resp.Header.Set("Content-Length", strconv.Itoa(rec.Body.Len()))
	return resp, nil
}

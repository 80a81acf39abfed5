// Package client is a Go client of Floe's gateway: typed calls for every
// route of the HTTP API (protocol.md §3) and an SSE stream reader (protocol.md §4) that
// reconnects by itself with Last-Event-ID.
//
// Errors answered by the gateway are *APIError values carrying the HTTP
// status and the machine code (the omni Code* values, e.g. "not_found",
// "task_in_progress").
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Client calls one gateway. It is safe for concurrent use.
type Client struct {
	base  string
	token string
	hc    *http.Client
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the HTTP client (default: a client without a
// timeout, since SSE streams are long-lived; use contexts for deadlines).
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithToken sets the bearer token sent with every request.
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// New returns a client of the gateway at baseURL (e.g. http://127.0.0.1:7364).
func New(baseURL string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), hc: &http.Client{}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// APIError is an error answered by the gateway.
type APIError struct {
	Status  int    // HTTP status
	Code    string // machine code, e.g. "not_found"
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("gateway: %d %s: %s", e.Status, e.Code, e.Message)
}

// IsCode reports whether err is an *APIError with the given code.
func IsCode(err error, code string) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Code == code
}

func (c *Client) newRequest(ctx context.Context, method, path string, body any) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("gateway: encode %s %s body: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil || method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch {
		// The gateway refuses a write without this type, body or not
		// (a cross-site page can send a body-less POST, never this).
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// do sends a request; a 2xx answer is decoded into out (when non-nil),
// anything else becomes an *APIError.
func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	req, err := c.newRequest(ctx, method, path, body)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("gateway: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return readAPIError(resp)
	}
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("gateway: %s %s: decode answer: %w", method, path, err)
	}
	return nil
}

func readAPIError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var eb ErrorBody
	if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
		return &APIError{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message}
	}
	return &APIError{Status: resp.StatusCode, Code: "http_" + strconv.Itoa(resp.StatusCode), Message: strings.TrimSpace(string(b))}
}

func sessionPath(id string, rest ...string) string {
	p := "/api/sessions/" + url.PathEscape(id)
	for _, r := range rest {
		p += "/" + r
	}
	return p
}

// CreateSession creates a Session (POST /api/sessions).
func (c *Client) CreateSession(ctx context.Context, req CreateSession) (*Session, error) {
	var s Session
	if err := c.do(ctx, http.MethodPost, "/api/sessions", req, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// ListSessions lists the caller's Sessions with their run state.
func (c *Client) ListSessions(ctx context.Context) ([]Session, error) {
	var l SessionList
	if err := c.do(ctx, http.MethodGet, "/api/sessions", nil, &l); err != nil {
		return nil, err
	}
	return l.Sessions, nil
}

// GetSession returns one Session.
func (c *Client) GetSession(ctx context.Context, id string) (*Session, error) {
	var s Session
	if err := c.do(ctx, http.MethodGet, sessionPath(id), nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// PatchSession changes a Session's approval mode and/or title (also while a
// Task runs) and returns the Session.
func (c *Client) PatchSession(ctx context.Context, id string, p SessionPatch) (*Session, error) {
	var s Session
	if err := c.do(ctx, http.MethodPatch, sessionPath(id), p, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// DeleteSession deletes an idle Session with its messages and Traces.
func (c *Client) DeleteSession(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, sessionPath(id), nil, nil)
}

// SubmitTask starts a Task and returns its id; an *APIError with code
// task_in_progress or compacting when the Session is busy.
func (c *Client) SubmitTask(ctx context.Context, id string, req TaskRequest) (string, error) {
	var a TaskAccepted
	if err := c.do(ctx, http.MethodPost, sessionPath(id, "tasks"), req, &a); err != nil {
		return "", err
	}
	return a.TaskID, nil
}

// Compact starts a manual compaction and returns its task id.
func (c *Client) Compact(ctx context.Context, id string) (string, error) {
	var a TaskAccepted
	if err := c.do(ctx, http.MethodPost, sessionPath(id, "compact"), nil, &a); err != nil {
		return "", err
	}
	return a.TaskID, nil
}

// Messages returns the Session's history and, while a Task runs, its live
// part.
func (c *Client) Messages(ctx context.Context, id string) (*Messages, error) {
	var m Messages
	if err := c.do(ctx, http.MethodGet, sessionPath(id, "messages"), nil, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// MessagesWindow returns the newest tailTasks Tasks of the Session's
// history before the cursor before ("" for the newest window, which also
// carries the live part of a running Task); Window.Start is the cursor of
// the page before it.
func (c *Client) MessagesWindow(ctx context.Context, id string, tailTasks int, before string) (*Messages, error) {
	q := url.Values{"tailTasks": {strconv.Itoa(tailTasks)}}
	if before != "" {
		q.Set("before", before)
	}
	var m Messages
	if err := c.do(ctx, http.MethodGet, sessionPath(id, "messages")+"?"+q.Encode(), nil, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// Approve decides a pending tool call ("allow" or "deny"); an *APIError
// with code not_found when nothing is pending for it.
func (c *Client) Approve(ctx context.Context, id, toolCallID, decision string) error {
	return c.do(ctx, http.MethodPost, sessionPath(id, "approvals", url.PathEscape(toolCallID)), Decision{Decision: decision}, nil)
}

// AllowForSession allows a pending call and its tool for the rest of the
// Session: later calls of the tool are allowed without asking, by every
// client (Session.AllowedTools).
func (c *Client) AllowForSession(ctx context.Context, id, toolCallID string) error {
	return c.do(ctx, http.MethodPost, sessionPath(id, "approvals", url.PathEscape(toolCallID)), Decision{Decision: "allow", Scope: "session"}, nil)
}

// Abort interrupts the running Task; interrupted is false when the Session
// was idle (204).
func (c *Client) Abort(ctx context.Context, id string) (interrupted bool, err error) {
	req, err := c.newRequest(ctx, http.MethodPost, sessionPath(id, "abort"), nil)
	if err != nil {
		return false, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return false, fmt.Errorf("gateway: abort: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusAccepted:
		return true, nil
	case http.StatusNoContent:
		return false, nil
	}
	return false, readAPIError(resp)
}

// Steer sends steering text to the running Task; an *APIError with code
// not_running when none runs.
func (c *Client) Steer(ctx context.Context, id, text string) error {
	return c.do(ctx, http.MethodPost, sessionPath(id, "steer"), Steer{Text: text}, nil)
}

// RetryNow skips the wait before the next reconnect attempt; skipped
// reports whether there was one.
func (c *Client) RetryNow(ctx context.Context, id string) (skipped bool, err error) {
	var r RetryNowResult
	if err := c.do(ctx, http.MethodPost, sessionPath(id, "retry-now"), nil, &r); err != nil {
		return false, err
	}
	return r.Skipped, nil
}

// Traces lists the Session's Trace files.
func (c *Client) Traces(ctx context.Context, id string) ([]TraceFile, error) {
	var l TraceList
	if err := c.do(ctx, http.MethodGet, sessionPath(id, "traces"), nil, &l); err != nil {
		return nil, err
	}
	return l.Traces, nil
}

// Trace returns the raw JSONL of one Trace file.
func (c *Client) Trace(ctx context.Context, id string, index int) ([]byte, error) {
	req, err := c.newRequest(ctx, http.MethodGet, sessionPath(id, "traces", strconv.Itoa(index)), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("gateway: trace: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, readAPIError(resp)
	}
	return io.ReadAll(resp.Body)
}

// ImportTrace imports a Trace file (POST /api/traces/import) as a new
// Session, resumable like any other.
func (c *Client) ImportTrace(ctx context.Context, req ImportTrace) (*Imported, error) {
	var out Imported
	if err := c.do(ctx, http.MethodPost, "/api/traces/import", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Fork forks Session id (POST /api/sessions/{id}/fork) at stream
// sequence atSeq (0: everything so far) and returns the new Session.
func (c *Client) Fork(ctx context.Context, id string, atSeq uint64) (*Session, error) {
	var req Fork
	if atSeq > 0 {
		req.AtSeq = json.RawMessage(strconv.FormatUint(atSeq, 10))
	}
	var out Session
	if err := c.do(ctx, http.MethodPost, sessionPath(id, "fork"), req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ForkAtRecord forks Session id after its record of ordinal n (a position
// of Messages.Positions) and returns the new Session.
func (c *Client) ForkAtRecord(ctx context.Context, id string, n int) (*Session, error) {
	req := Fork{AtRecord: &n}
	var out Session
	if err := c.do(ctx, http.MethodPost, sessionPath(id, "fork"), req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Health checks GET /healthz.
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/healthz", nil, nil)
}

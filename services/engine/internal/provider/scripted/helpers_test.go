package scripted

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/engine/internal/model"
	"floe.dev/services/engine/internal/provider/providertest"
)

// testTimeout bounds every Stream call of the tests.
const testTimeout = 10 * time.Second

func mustParse(t *testing.T, src string) *Provider {
	t.Helper()
	p, err := Parse("test.json", []byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return p
}

// newReq returns a request of Session sessionID with its own id allocator.
func newReq(sessionID string, msgs ...omni.Message) *model.Request {
	return &model.Request{SessionID: sessionID, Messages: refs(msgs...), IDs: &model.IDAllocator{}}
}

// run streams one request with a bounded context and collects its deltas.
func run(t *testing.T, p *Provider, req *model.Request) ([]model.Delta, model.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	var got []model.Delta
	res, err := p.Stream(ctx, req, func(d model.Delta) error {
		got = append(got, d)
		return nil
	})
	return got, res, err
}

// statusOf returns the *model.Error status of err, "" for nil, or the error
// text for any other error.
func statusOf(err error) string {
	if err == nil {
		return ""
	}
	if me, ok := errors.AsType[*model.Error](err); ok {
		return me.Status
	}
	return "not a *model.Error: " + err.Error()
}

// fmtDeltas renders deltas one per line for readable diffs.
func fmtDeltas(ds []model.Delta) string {
	var b strings.Builder
	for _, d := range ds {
		fmt.Fprintf(&b, "  {Block:%d Type:%s Text:%q Name:%q ID:%q End:%v Fidelity:%s}\n",
			d.Block, d.Type, d.Text, d.Name, d.ToolCallID, d.End, d.Fidelity)
	}
	return b.String()
}

func equalDeltas(a, b []model.Delta) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Block != y.Block || x.Type != y.Type || x.Text != y.Text || x.Name != y.Name ||
			x.ToolCallID != y.ToolCallID || x.End != y.End || string(x.Fidelity) != string(y.Fidelity) {
			return false
		}
	}
	return true
}

// joinBlocks concatenates the deltas of each block.
func joinBlocks(ds []model.Delta) map[int]string {
	out := map[int]string{}
	for _, d := range ds {
		out[d.Block] += d.Text
	}
	return out
}

// checkDiscipline checks the Delta contract: one type per block, no delta
// after a block's End, name and id set by End for tool calls.
func checkDiscipline(t *testing.T, ds []model.Delta) {
	t.Helper()
	type state struct {
		typ, name, id string
		ended         bool
	}
	blocks := map[int]*state{}
	for i, d := range ds {
		s := blocks[d.Block]
		if s == nil {
			s = &state{typ: d.Type}
			blocks[d.Block] = s
		}
		if s.ended {
			t.Errorf("delta %d: block %d continues after its End", i, d.Block)
		}
		if d.Type != s.typ {
			t.Errorf("delta %d: block %d changes type %s -> %s", i, d.Block, s.typ, d.Type)
		}
		if d.Name != "" {
			s.name = d.Name
		}
		if d.ToolCallID != "" {
			s.id = d.ToolCallID
		}
		if d.End {
			s.ended = true
			if d.Type == omni.TypeToolCall && (s.name == "" || s.id == "") {
				t.Errorf("delta %d: tool_call block %d ends without name or id", i, d.Block)
			}
		}
	}
}

func raw(s string) json.RawMessage { return json.RawMessage(s) }

// refs is providertest.Refs.
var refs = providertest.Refs

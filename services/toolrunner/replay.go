package toolrunner

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"floe.dev/pkg/omni"
	"floe.dev/services/toolrunner/internal/tools"
)

// Replay makes a toolrunner serve recorded tool outputs instead of running
// tools (floe replay --execute, protocol.md §8): it lists the recorded tools and
// answers each call with the output recorded for its tool_call_id,
// nothing executed. Wait paces an answer to the record: it is given the
// record's index of the output, and returns once the replayed Session's
// Trace holds as many records (or gives up).
//
// A call whose recorded output is a user abort's ([interrupted: tool
// aborted by user], stop_reason aborted) emits the output it had produced
// by then and stalls until it is cancelled, so the runner writes the same
// interrupted output when the replayer sends the abort; Stalled (when
// set) is told once the call stalls.
type Replay struct {
	Tools   []omni.ToolSpec
	Outputs map[string]ReplayOutput // by tool_call_id
	Wait    func(ctx context.Context, sessionID string, n int) error
	Stalled func(sessionID, toolCallID string)
	// Servers are the MCP servers of the record's first
	// mcp_connect_begin; Connects the results of its mcp_connect_ends,
	// in order: the n-th full tool list answers the n-th (the last one
	// once they run out). No MCP server starts.
	Servers  []string
	Connects [][]omni.MCPConnectResult
	// Children, when set, gives a subagent child Session's own record
	// (nil for the replay's own Session): a child's calls are answered
	// from it.
	Children func(ctx context.Context, sessionID string) []omni.Message

	lists atomic.Int64
	mu    sync.Mutex
	child map[string]*Replay // a child Session → its record's outputs
}

// outputsOf is the Replay of sessionID's record.
func (rp *Replay) outputsOf(ctx context.Context, sessionID string) *Replay {
	if rp.Children == nil {
		return rp
	}
	rp.mu.Lock()
	c, seen := rp.child[sessionID]
	rp.mu.Unlock()
	if !seen {
		if recs := rp.Children(ctx, sessionID); recs != nil {
			c = NewReplay(recs)
		}
		rp.mu.Lock()
		if rp.child == nil {
			rp.child = make(map[string]*Replay)
		}
		if prev, ok := rp.child[sessionID]; ok {
			c = prev
		} else {
			rp.child[sessionID] = c
		}
		rp.mu.Unlock()
	}
	if c == nil {
		return rp
	}
	return c
}

// ReplayOutput is one recorded complete tool output and where it was in
// the record.
type ReplayOutput struct {
	Output string
	Failed bool
	Images []string
	Index  int
	// Aborted: the call was interrupted by a user abort; Output is what
	// it had produced, then the interrupted marker.
	Aborted bool
}

// NewReplay collects the tools (the last tool_list_ready, without
// run_subagent, which the engine adds itself), the MCP connections and
// the complete tool outputs of a recorded Session (its own records: a
// subagent's forwarded ones are its child's).
func NewReplay(records []omni.Message) *Replay {
	rp := &Replay{Outputs: make(map[string]ReplayOutput)}
	for i := range records {
		p := &records[i].Payload
		if len(records[i].Origin) > 0 {
			continue
		}
		switch {
		case records[i].Type == omni.KindEvent && p.Type == omni.TypeMCPConnectBegin && rp.Servers == nil:
			if json.Unmarshal(p.Field("servers"), &rp.Servers) != nil || rp.Servers == nil {
				rp.Servers = []string{}
			}
		case records[i].Type == omni.KindEvent && p.Type == omni.TypeMCPConnectEnd:
			var res []omni.MCPConnectResult
			_ = json.Unmarshal(p.Field("results"), &res) // unreadable: none
			rp.Connects = append(rp.Connects, res)
		case records[i].Type == omni.KindEvent && p.Type == omni.TypeToolListReady:
			specs, err := p.ToolSpecs()
			if err != nil {
				continue
			}
			rp.Tools = rp.Tools[:0]
			for _, s := range specs {
				if s.Name != "run_subagent" {
					rp.Tools = append(rp.Tools, s)
				}
			}
		case records[i].Type == omni.KindModel && p.Type == omni.TypeToolCallOutput:
			if _, seen := rp.Outputs[p.ToolCallID]; !seen {
				rp.Outputs[p.ToolCallID] = ReplayOutput{Output: p.Output, Failed: p.Stop() == omni.StatusFailed, Images: p.ImageURLs(), Index: i,
					Aborted: p.Stop() == omni.StatusAborted && strings.HasSuffix(p.Output, omni.InterruptedOutput)}
			}
		}
	}
	return rp
}

// replayStallMax bounds how long a replayed call waits for its abort.
const replayStallMax = time.Minute

// replayBox is the runner.Toolbox of a Replay.
type replayBox struct{ rp *Replay }

func (b replayBox) List(context.Context) ([]omni.ToolSpec, []omni.MCPConnectResult) {
	if len(b.rp.Connects) == 0 {
		return b.rp.Tools, nil
	}
	n := min(int(b.rp.lists.Add(1))-1, len(b.rp.Connects)-1)
	return b.rp.Tools, b.rp.Connects[n]
}

func (b replayBox) Servers() []string { return b.rp.Servers }

func (b replayBox) Execute(ctx context.Context, call tools.Call, emit tools.Emit) tools.Result {
	var sid, id string
	for _, kv := range call.Env {
		if v, ok := strings.CutPrefix(kv, "FLOE_SESSION_ID="); ok {
			sid = v
		} else if v, ok := strings.CutPrefix(kv, "FLOE_TOOL_CALL_ID="); ok {
			id = v
		}
	}
	out, ok := b.rp.outputsOf(ctx, sid).Outputs[id]
	if !ok {
		return tools.Result{Output: "replay: the record holds no output of tool call " + id, Failed: true}
	}
	if out.Aborted {
		// The runner ends the output with the marker (after a newline
		// when what came before has none): either split gives the
		// recorded text.
		if before := strings.TrimSuffix(out.Output, omni.InterruptedOutput); before != "" {
			emit(before)
		}
		if b.rp.Stalled != nil {
			b.rp.Stalled(sid, id)
		}
		// Bounded: a replay that parted from the record (its abort
		// came before this call ran) must not hold the runner.
		select {
		case <-ctx.Done():
		case <-time.After(replayStallMax):
		}
		return tools.Result{Output: out.Output, Failed: true}
	}
	if b.rp.Wait != nil {
		_ = b.rp.Wait(ctx, sid, out.Index)
	}
	return tools.Result{Output: out.Output, Failed: out.Failed, Images: out.Images}
}

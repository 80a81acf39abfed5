// Package scripted is the deterministic offline model of protocol.md §6,
// "scripted:<name-or-path>". It streams what a script file says, request by
// request, so engine tests can drive every path of a turn (thinking, text,
// tool calls, parallel tool calls, slow streams, failures, token usage)
// without a network, and assert what the engine fed the model.
//
// [Open] resolves a model id: "demo" is the built-in [Demo] model, the
// default when no provider is configured; anything else is the path of a
// script file, read by [Load]. [Parse] reads a script held in memory.
//
// # Playback
//
// Each call to [Provider.Stream] plays the next request of the script for
// its Session: the Provider keeps one counter per Request.SessionID, and
// every call counts, including retries of a failed request, so "fail with
// timeout, then succeed" is two entries. When the script is exhausted,
// after_last decides what happens.
//
// Every content step is one block (a parallel step is one block per call),
// numbered from 0 in the order the blocks start. Its content is split into
// deltas; the last delta of a block has End set. A tool_call block carries
// its Name and ToolCallID on its first delta only, as real providers do.
// Fidelity rides on the block's last delta. Tool call ids go through
// Request.IDs.Assign (a Provider-held allocator per Session when IDs is
// nil): a scripted id is kept unless the Session already used it, a
// missing one becomes "call_<n>".
//
// A request succeeds with Result{Usage, StopReason: "completed"}. A failing
// request returns a *model.Error; the deltas emitted before it stay emitted
// and, with "end": false, its open block is not ended. A cancelled ctx makes
// Stream return ctx.Err() promptly, also in the middle of a delay. On any
// failure the Result still carries the usage (scripted or estimated) and
// the failure's stop reason.
//
// # Script format
//
// A script is one JSON object. Every field is checked: an unknown or
// misspelt field, a wrong type or an impossible value is an error naming the
// file, the line and the field, e.g.
//
//	script.json:7: requests[0].steps[2]: unknown step kind "txt"
//
// A full example:
//
//	{
//	  "context_window": 200000,
//	  "requests": [
//	    {
//	      "expect_last_user": "list the files",
//	      "steps": [
//	        {"thinking": "Let me look around.", "chunks": 3, "fidelity": {"signature": "sig-1"}},
//	        {"text": "I will run two tools.", "chunks": 2, "delay_ms": 10},
//	        {"tool_call": {"name": "exec_command", "id": "call_a",
//	                       "arguments": {"description": "slow", "cmd": "sleep 0.4; echo A"}}},
//	        {"tool_call": {"name": "exec_command", "id": "call_b",
//	                       "arguments_raw": "{\"description\":\"fast\",\"cmd\":\"echo B\"}", "chunks": 4}}
//	      ],
//	      "usage": {"cache_read": 0, "cache_write": 0, "output": 12, "total": 340}
//	    },
//	    {
//	      "expect_tool_outputs": ["call_a", "call_b"],
//	      "steps": [
//	        {"text": "Both ran. Now two more at once."},
//	        {"parallel_tool_calls": [
//	           {"name": "read_file", "id": "call_c", "arguments": {"file_path": "a.txt"}, "chunks": 3},
//	           {"name": "read_file", "id": "call_d", "arguments": {"file_path": "b.txt"}, "chunks": 2}
//	         ], "interleave": true}
//	      ]
//	    },
//	    {"steps": [{"text": "Half an ans", "end": false}, {"delay_ms": 50},
//	               {"error": {"status": "timeout", "message": "upstream reset"}}]},
//	    {"steps": [{"text": "Done."}]}
//	  ],
//	  "after_last": "final_text",
//	  "final_text": "Nothing more to say."
//	}
//
// Top-level fields:
//
//   - context_window: integer > 0, reported by [Provider.Info]; default 128000.
//   - requests (required): array of request entries, played in order; may be empty.
//   - after_last: what a request past the end of the script does:
//     "fail" (default) fails it with status failed and the message
//     "script exhausted after N requests"; "repeat_last" plays the last
//     entry again (matchers included; needs at least one entry);
//     "final_text" streams one text block holding final_text.
//   - final_text: the text of after_last "final_text"; default "Done.".
//     Only allowed with after_last "final_text".
//   - title: the answer to a title request (model.PurposeTitle, the
//     engine's one-off request that names a Session after its first
//     Task). A title request is never counted and plays nothing of the
//     script; without this field it fails, and the Session keeps the
//     title of its first prompt. The demo model answers with the first
//     words of the user's text.
//
// Request entry fields:
//
//   - steps: array of steps, played in order; absent or empty streams nothing.
//   - usage: {cache_read, cache_write, output, total}, integers >= 0, absent
//     ones 0; it becomes Result.Usage. Without it the usage is estimated from
//     the request: output = ceil(output characters / 4), total =
//     ceil(context characters / 4) + output, cache counts 0, where context
//     characters count the system prompt, every message's text, thinking,
//     tool name, arguments, output, image URL and inline data, and the tool
//     specs; characters are Unicode code points. So total grows with the
//     context, which compaction tests rely on.
//   - stop_reason: Result.StopReason of a successful request; default
//     "completed"; one of completed, failed, aborted, timeout, malformed, auth.
//   - expect_last_user: a string the last message of the request whose role
//     is user and type text or tool_call_output must contain (its text or
//     output). A mismatch fails the request (status failed) before anything
//     is streamed, with a message saying what was expected and what came;
//     [Provider.Mismatches] lists every mismatch so far.
//   - expect_tool_outputs: array of tool_call_ids. The tool_call_output
//     messages after the last assistant message of the request must carry
//     exactly these ids in exactly this order ([] asserts there are none).
//     A mismatch fails as for expect_last_user.
//
// Steps. Each step is an object with exactly one kind field:
//
//   - {"thinking": "..."}: one thinking block.
//   - {"text": "..."}: one text block.
//   - {"tool_call": CALL}: one tool_call block.
//   - {"parallel_tool_calls": [CALL, ...]}: one tool_call block per call. By
//     default the calls stream one after another (like consecutive tool_call
//     steps). With "interleave": true their argument fragments go
//     round-robin across the blocks (first fragment of each call, then the
//     second of each, ...), as OpenAI streams parallel tool calls, and every
//     block is ended only at the end of the step, by one empty End delta per
//     block in call order.
//   - {"error": {"status": S, "message": M, "http_status": H}}: fails the
//     request here with *model.Error{Status: S, Message: M, HTTPStatus: H}.
//     status (required) is failed, timeout, malformed or auth; message
//     defaults to "scripted <status> error"; http_status is an integer >= 0.
//     Steps after it never run.
//   - {"delay_ms": N}: sleeps N milliseconds.
//
// A CALL is {"name", "id", "arguments", "arguments_raw", "chunks",
// "delay_ms", "fidelity"}: name is required; id is optional (allocated when
// missing); arguments is any JSON value, streamed compact with its key order
// kept; arguments_raw is a string streamed exactly as written (it may be
// invalid JSON on purpose); at most one of the two, and "{}" when neither.
//
// Modifiers on content steps:
//
//   - chunks: integer >= 0. The content is split into that many deltas of
//     near-equal length (fewer when it has fewer code points; one delta when
//     it is empty). 0 or absent: fragments of 16 code points. A UTF-8
//     sequence is never split, and the deltas concatenate to the content
//     exactly.
//   - delay_ms: integer >= 0, a sleep before each delta of the step (also
//     allowed on an error step: a sleep before failing).
//   - fidelity: a JSON object, compacted, set as Delta.Fidelity on the
//     block's last delta (opaque provider data such as a thinking signature).
//   - end: false leaves the block (every block of a parallel step) open: its
//     last delta has no End. Only allowed when an error step follows later in
//     the same request, to test a stream that fails mid-block.
//   - interleave: parallel_tool_calls only, see above.
//
// On a tool_call step, chunks, delay_ms and fidelity may be written on the
// step or inside the CALL, not both. On a parallel step, chunks and delay_ms
// are defaults for calls that do not set their own, and fidelity belongs in
// each CALL.
//
// # The demo model
//
// [Demo] decides from Request.Messages alone, so it survives engine
// restarts. The current Task starts at the last user text that is not a
// system block. With no exec_command output in the Task it thinks, says it
// will look, and calls exec_command "ls -la". After the listing it calls
// read_file on the first README* (else the first non-hidden regular file),
// or answers at once when there is none. It only calls a tool that
// Request.Tools offers; without exec_command it answers at once. After that it answers: the number
// and names of the entries, the first line of the file it read, and how to
// configure a real model. Output streams in small chunks 15 ms apart, under
// a second of model time for the whole Task.
package scripted

package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/omni"
)

// Traces the original harness writes since its 0.2.6 (up to 0.2.13),
// following its writer record for record (testdata/interop/v0213/SOURCES.md
// names the source of each shape), imported and continued: the next
// request carries exactly the context that release's resume would build.
//
// The resume rule is the original's packages/core/src/trace/resume.ts
// (resumeTrace): a request is committed only when its request_end status is
// completed ("replay only ever compares against completed", changelog
// 0.2.6/2026-08-24-stop-reason-converges-to-four-values.md), so retryable
// and fatal turns are dropped whole and their input is resent as carry-over
// (dropUncommittedRound); user-side records (prompts, steering, harness
// texts, tool outputs of committed calls) feed the next committed request
// in order; events other than request_begin/request_end and the compaction
// pair (hook, approval_decision, abort, mcp_connect_*, token_usage) take no
// part in the context; a file that ends in a completed summarize compaction
// resumes from its [context_summary] alone.
func TestImportOriginal0213TracesSendsThatReleasesContext(t *testing.T) {
	const sys = "system:You are a careful assistant."
	exec := func(id, desc, cmd string) string {
		return `[call ` + id + ` exec_command {"description":"` + desc + `","cmd":"` + cmd + `"}]`
	}
	tests := []struct {
		file, sid, date, model string
		want                   []string
	}{
		{
			// Allowed and denied calls (by the user, and by the command
			// policy with policy_rule, 0.2.4+); a failing tool's output is
			// fatal since 0.2.6 and still fed back as content (same
			// changelog: "failures converge to fatal and are fed back to
			// the model"). Outputs paired in call order.
			file: "tools_allow_deny.jsonl", sid: "session-2026-08-28-10-00-00-a1b2c3d4", date: "2026-08-28", model: "gpt-5.3",
			want: []string{
				sys,
				"user:Write a.txt, show it, and clean the disk",
				"assistant:" + exec("call_1", "write", "printf a > a.txt") + exec("call_2", "show", "cat missing.txt") + exec("call_3", "clean", "rm -rf /") + exec("call_4", "eject", "eject /dev/sr0"),
				"tool:call_1:[no output]",
				"tool:call_2:cat: missing.txt: No such file or directory\n[exit code 1]",
				"tool:call_3:" + omni.DeniedByPolicy,
				"tool:call_4:" + omni.DeniedByUser,
				"assistant:a.txt is written; missing.txt does not exist; the rest was refused.",
				"user:next task",
			},
		},
		{
			// Two retryable attempts (error_code network, timeout; retry_in_ms
			// announces the retry) then the completed one: only the
			// completed request is history, its thinking fidelity kept.
			file: "retryable_then_completed.jsonl", sid: "session-2026-08-28-11-00-00-b2c3d4e5", date: "2026-08-28", model: "deepseek-v4-flash",
			want: []string{
				"system:You are terse.",
				"user:Say hello",
				"assistant:(reasoning A greeting.)Hello.",
				"user:next task",
			},
		},
		{
			// A fatal request_end (error_code rejected, no retry_in_ms, no
			// abort since 0.2.6: changelog 0.2.6/2026-08-25-abort-marks-user-
			// interruptions-only.md) ends the run: the turn is dropped and
			// the committed call's output, written inside it, is carried.
			file: "fatal.jsonl", sid: "session-2026-08-29-09-00-00-c3d4e5f6", date: "2026-08-29", model: "gpt-5.3",
			want: []string{
				sys,
				"user:List the files",
				"assistant:" + exec("call_1", "list", "ls"),
				"tool:call_1:a.txt\nb.txt\n",
				"user:next task",
			},
		},
		{
			// A user abort while a tool runs: the interrupted output is in
			// the Trace before the abort (error_code user_abort), and pairs
			// the call.
			file: "user_abort_mid_tool.jsonl", sid: "session-2026-08-29-10-00-00-d4e5f6a7", date: "2026-08-29", model: "gpt-5.3",
			want: []string{
				sys,
				"user:Build it",
				"assistant:Building." + exec("call_1", "build", "make -j8"),
				"tool:call_1:cc -c a.c\n" + omni.InterruptedOutput,
				"user:next task",
			},
		},
		{
			// Steering delivered mid-run is a standalone [user_steering]
			// user text between request_end and the next request_begin
			// (omnimessage/markers/steering.ts); a background completion
			// delivered mid-run carries delivery: steering in its block
			// (changelog 0.2.6/2026-08-23-steered-background-notices.md) and
			// sender harness. Both are the next request's input, after the
			// outputs, as written.
			file: "steering_mid_run.jsonl", sid: "session-2026-08-30-09-00-00-e5f6a7b8", date: "2026-08-30", model: "gpt-5.3",
			want: []string{
				sys,
				"user:Run the tests",
				"assistant:" + exec("call_1", "test", "go test ./..."),
				"tool:call_1:ok  \tpkg\t0.2s\n",
				"user:" + omni.Block(omni.TagUserSteering, "also run vet"),
				"user:[background_task_done]\nkind: command\nid: bg_1\nstatus: completed\ndetail: exit 0\ndelivery: steering\n[/background_task_done]\n\nnpm run build finished:\nbuilt in 3.1s",
				"assistant:" + exec("call_2", "vet", "go vet ./..."),
				"tool:call_2:[no output]",
				"assistant:Tests pass, vet is clean, the build finished.",
				"user:next task",
			},
		},
		{
			// A pre_tool_use hook denial (hooks/tool-hook.ts: hook records,
			// then the deny and its aborted output); the hook records
			// themselves are not context.
			file: "hook_denied.jsonl", sid: "session-2026-09-03-09-00-00-f6a7b8c9", date: "2026-09-03", model: "gpt-5.3",
			want: []string{
				sys,
				"user:Commit and push",
				"assistant:" + exec("call_1", "commit", "git commit -am wip") + exec("call_2", "push", "git push origin main"),
				"tool:call_1:[main 1a2b3c4] wip\n 1 file changed\n",
				"tool:call_2:" + omni.DeniedByHook("no-push-main", "pushes to main are not allowed"),
				"assistant:Committed; the push to main was refused by a hook.",
				"user:next task",
			},
		},
		{
			// A stop hook's continue (hooks/stop-hook.ts): its input is the
			// user text (sender harness) after the hook record.
			file: "stop_hook_continue.jsonl", sid: "session-2026-09-03-10-00-00-a7b8c9d0", date: "2026-09-03", model: "gpt-5.3",
			want: []string{
				sys,
				"user:Make the test pass",
				"assistant:I changed sum.go.",
				"user:The tests still fail:\n--- FAIL: TestSum\nKeep going until `go test` passes.",
				"assistant:Fixed the off-by-one.",
				"user:next task",
			},
		},
		{
			// The streamed compaction summary (changelog 0.2.10/2026-09-02-
			// compaction-banner-thinking.md: "The Trace is unchanged"): the
			// span's thinking is not the summary; the last completed
			// attempt's text is (resume.ts lastCompletedRequestText).
			file: "streamed_compaction_closed.jsonl", sid: "session-2026-09-04-09-00-00-b8c9d0e1", date: "2026-09-04", model: "gpt-5.3",
			want: []string{
				"system:You help with code.",
				"user:" + omni.Block(omni.TagContextSummary, "The user asked about the parser; it is recursive descent."),
				"user:next task",
			},
		},
		{
			// mcp_connect_end fatal with connect_failed and error_message
			// per server: an event, never context.
			file: "mcp_connect_error.jsonl", sid: "session-2026-09-05-09-00-00-c9d0e1f2", date: "2026-09-05", model: "gpt-5.3",
			want: []string{
				sys,
				"user:What can you use?",
				"assistant:exec_command only; the docs server is down.",
				"user:next task",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			f := rcNewFake(t, rcAnswer("ok"))
			e := rcEnv(t, f, nil)
			c := e.gw(t, nil)
			data := readFixture(t, filepath.Join("v0213", tc.file))
			imp := importFixture(t, c, data, e.ws)
			if imp.SessionID != tc.sid || imp.Index != 1 || imp.Date != tc.date {
				t.Fatalf("import = %+v, want %s index 1 date %s", imp, tc.sid, tc.date)
			}
			path := filepath.Join(e.home, "traces", tc.date, tc.sid+"_001.jsonl")
			if got, err := os.ReadFile(path); err != nil || string(got) != string(data) {
				t.Fatalf("imported file %s: %v (equal: %v)", path, err, string(got) == string(data))
			}
			taskID := e.submit(tc.sid, "next task")
			rs, status := e.wait(tc.sid, taskID)
			if status != omni.StatusCompleted {
				t.Fatalf("status %q; stream %v", status, labels(rs, noPartials))
			}
			req := f.body(0)
			if req.Model != tc.model {
				t.Errorf("model = %q, want %q", req.Model, tc.model)
			}
			if got := sentContext(req); !slices.Equal(got, tc.want) {
				t.Fatalf("the model got\n  %q\nwant\n  %q", got, tc.want)
			}
			// The imported records stay as they were; the Task goes on after them.
			eventually(t, 10*time.Second, "the Task in the Trace", func() bool {
				b, _ := os.ReadFile(path)
				if strings.HasSuffix(tc.file, "_closed.jsonl") {
					b, _ = os.ReadFile(filepath.Join(e.home, "traces", tc.date, tc.sid+"_002.jsonl"))
				}
				return strings.Contains(string(b), `"text":"ok"`)
			})
			if b, _ := os.ReadFile(path); !strings.HasPrefix(string(b), string(data)) {
				t.Fatal("the imported records were rewritten")
			}
		})
	}
}

// AG-UI 1.0 with the stock @ag-ui/client: HttpAgent runs (its pipeline
// verifies every event), and raw SSE for the cut-and-resume cases, whose
// joined events the client's verifier checks too.
import test from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { HttpAgent } from "@ag-ui/client";
import { A, B, auth, api, createSession, restartB, collect, verify, isRunEnd, assertIncreasing, SLOW_MODEL, SUBAGENT_MODEL } from "./helpers.mjs";

const T = { timeout: 90_000 };

// run runs one AG-UI run with a stock HttpAgent and returns what the
// client saw: event types, the run's outcome, the agent.
async function run(agent, params = {}) {
  const types = [];
  let finished;
  const sub = agent.subscribe({
    onEvent: ({ event }) => { types.push(event.type); },
    onRunFinishedEvent: (p) => { finished = p; },
  });
  try {
    await agent.runAgent({ runId: randomUUID(), ...params });
  } finally {
    sub.unsubscribe();
  }
  return { types, finished };
}

const agentOn = (base, threadId, messages = []) =>
  new HttpAgent({ url: base + "/api/agui", headers: auth, threadId, initialMessages: messages });

async function sessionCount() {
  return (await api(A, "GET", "/api/sessions")).sessions.length;
}

test("a run with a tool call, then the thread continued on the other replica", T, async () => {
  const before = await sessionCount();
  const threadId = randomUUID();
  const a = agentOn(A, threadId, [{ id: "u1", role: "user", content: "What is in the workspace?" }]);
  const r1 = await run(a);
  assert.equal(r1.types[0], "RUN_STARTED");
  assert.equal(r1.types.at(-1), "RUN_FINISHED");
  assert.equal(r1.finished.outcome, "success");
  for (const t of ["STEP_STARTED", "TEXT_MESSAGE_CONTENT", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT", "STEP_FINISHED"]) {
    assert.ok(r1.types.includes(t), `run 1 has no ${t}: ${r1.types.join(" ")}`);
  }
  const call = a.messages.find((m) => m.role === "assistant" && m.toolCalls?.length)?.toolCalls[0];
  assert.ok(call, "the agent's messages hold the tool call");
  assert.equal(call.function.name, "exec_command");
  assert.ok(a.messages.some((m) => m.role === "tool" && m.toolCallId === call.id), "and its result");

  // The same thread on replica B: the whole history plus a new question.
  const b = agentOn(B, threadId, [...a.messages, { id: "u2", role: "user", content: "And again?" }]);
  const r2 = await run(b);
  assert.equal(r2.finished.outcome, "success");
  assert.ok(r2.types.includes("TOOL_CALL_RESULT"));
  assert.equal(await sessionCount(), before + 1, "both runs ran in the thread's one Session");
  const sessions = (await api(A, "GET", "/api/sessions")).sessions;
  const s = sessions.at(-1);
  const msgs = (await api(A, "GET", `/api/sessions/${s.id}/messages`)).messages;
  const prompts = msgs.filter((m) => m.type === "model_msg" && m.payload.type === "text" && m.payload.role === "user").map((m) => m.payload.text);
  assert.deepEqual(prompts, ["What is in the workspace?", "And again?"], "each run's new user message is the Prompt, once");
});

test("an approval through the interrupt outcome and resume, on both replicas", T, async () => {
  const s = await createSession(A, { approvalMode: "always-ask" });
  const a = agentOn(A, s.id, [{ id: "u1", role: "user", content: "look around" }]);
  const r1 = await run(a);
  assert.equal(r1.finished.outcome, "interrupt");
  assert.equal(a.pendingInterrupts.length, 1);
  const intr = a.pendingInterrupts[0];
  assert.equal(intr.reason, "tool_approval");
  assert.equal(intr.toolCallId, intr.id);
  assert.equal(intr.metadata?.name, "exec_command");
  assert.ok(!r1.types.includes("TOOL_CALL_RESULT"), "nothing ran before the approval");

  // Replica B answers it: the next run shows the tool's result and the end.
  const b = agentOn(B, s.id, a.messages);
  b.pendingInterrupts = a.pendingInterrupts;
  const r2 = await run(b, { resume: [{ interruptId: intr.id, status: "resolved", payload: { decision: "allow" } }] });
  assert.equal(r2.finished.outcome, "success");
  const result = b.messages.find((m) => m.role === "tool" && m.toolCallId === intr.id);
  assert.ok(result && !String(result.content).includes("denied"), `the allowed call ran: ${JSON.stringify(result)}`);
  assert.equal(b.pendingInterrupts.length, 0);

  // A cancelled interrupt denies.
  const s2 = await createSession(A, { approvalMode: "always-ask" });
  const c = agentOn(A, s2.id, [{ id: "u1", role: "user", content: "look" }]);
  assert.equal((await run(c)).finished.outcome, "interrupt");
  const id2 = c.pendingInterrupts[0].id;
  const r3 = await run(c, { resume: [{ interruptId: id2, status: "cancelled" }] });
  assert.equal(r3.finished.outcome, "success");
  const denied = c.messages.find((m) => m.role === "tool" && m.toolCallId === id2);
  assert.equal(denied?.content, "Tool call denied by user.");
});

test("cancel: an abort ends the run with the cancelled outcome", T, async () => {
  const s = await createSession(A, { model: SLOW_MODEL });
  const a = agentOn(B, s.id, [{ id: "u1", role: "user", content: "take your time" }]);
  let aborted = false;
  const sub = a.subscribe({
    onTextMessageContentEvent: () => {
      if (!aborted) {
        aborted = true;
        api(A, "POST", `/api/sessions/${s.id}/abort`).catch((e) => console.error(e));
      }
    },
  });
  const r = await run(a);
  sub.unsubscribe();
  assert.ok(aborted);
  assert.equal(r.finished.outcome, "cancelled");
  assert.equal(r.types.at(-1), "RUN_FINISHED");
});

// cutAndResume starts a slow run on one replica, cuts the connection after
// a few events, resumes it on another by Last-Event-ID, and checks the
// joined events against a full replay: nothing missing, nothing doubled,
// every event accepted by the client's verifier.
async function cutAndResume(first, second, between) {
  const s = await createSession(A, { model: SLOW_MODEL });
  const threadId = s.id, runId = randomUUID();
  const cut = new AbortController();
  const res = await fetch(first + "/api/agui", {
    method: "POST",
    headers: { ...auth, "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify({ threadId, runId, messages: [{ id: "u1", role: "user", content: "go" }], tools: [], context: [], state: {}, forwardedProps: {} }),
    signal: cut.signal,
  });
  const head = await collect(res, (ev, got) => got.filter((e) => e.data.type === "TEXT_MESSAGE_CONTENT").length >= 4, cut);
  assert.ok(!head.some(isRunEnd), "the run was cut before its end");
  if (between) await between();
  const last = head.at(-1).id;
  const tail = await collect(await fetch(`${second}/api/agui/${threadId}/${runId}`, { headers: { ...auth, "Last-Event-ID": last } }), isRunEnd);
  assert.ok(isRunEnd(tail.at(-1)), "the resumed stream follows the run to its end");
  const joined = [...head, ...tail];
  const full = await collect(await fetch(`${A}/api/agui/${threadId}/${runId}`, { headers: auth }), isRunEnd);
  assert.deepEqual(joined.map((e) => e.id), full.map((e) => e.id), "the cut run resumed is the run: same ids, none missing, none twice");
  assert.deepEqual(joined.map((e) => e.data), full.map((e) => e.data));
  assertIncreasing(assert, joined);
  assert.equal(new Set(joined.map((e) => e.id)).size, joined.length);
  await verify(joined.map((e) => e.data));
  assert.equal(joined[0].data.type, "RUN_STARTED");
  assert.equal(joined[0].data.threadId, threadId);
  assert.equal(joined[0].data.runId, runId);
  assert.equal(joined.at(-1).data.outcome?.type, "success");
  // Text deltas joined are the streamed text exactly.
  const text = joined.filter((e) => e.data.type === "TEXT_MESSAGE_CONTENT").map((e) => e.data.delta).join("");
  assert.ok(text.startsWith("Floe streams this answer slowly. Floe streams"), text.slice(0, 80));
}

test("a connection cut mid-run resumes on the other replica, nothing missing or doubled", T, async () => {
  await cutAndResume(A, B);
});

test("a connection cut mid-run resumes after a gateway restart", T, async () => {
  await cutAndResume(B, B, restartB);
});

test("a subagent: SUBAGENT_STARTED and _FINISHED around its events, suspended and re-opened across approvals", T, async () => {
  for (const approvalMode of ["allow-all", "always-ask"]) {
    const s = await createSession(A, { model: SUBAGENT_MODEL, approvalMode });
    const a = agentOn(A, s.id, [{ id: "u1", role: "user", content: "how many files? ask a helper" }]);
    const all = [];
    let r = await run(a);
    all.push(...r.types);
    const runs = [r];
    while (r.finished.outcome === "interrupt") {
      r = await run(a, { resume: a.pendingInterrupts.map((i) => ({ interruptId: i.id, status: "resolved", payload: { decision: "allow" } })) });
      all.push(...r.types);
      runs.push(r);
      assert.ok(runs.length < 10, "the approvals end");
    }
    assert.equal(r.finished.outcome, "success", approvalMode);
    assert.ok(all.includes("SUBAGENT_STARTED") && all.includes("SUBAGENT_FINISHED"), `${approvalMode}: ${all.join(" ")}`);
    if (approvalMode === "always-ask") assert.ok(runs.length >= 2, "always-ask interrupts");
    // Every run, replayed raw, passes the verifier as the live one did.
    const thread = s.id;
    const body = await api(A, "GET", `/api/sessions/${thread}/messages`);
    const tc = body.messages.find((m) => m.payload.type === "tool_call" && m.payload.name === "run_subagent");
    assert.equal(tc.payload.tool_call_id, "sub");
  }
});

test("bad input: a malformed RunAgentInput is a 400 with a clear error", T, async () => {
  const res = await fetch(A + "/api/agui", { method: "POST", headers: { ...auth, "Content-Type": "application/json" }, body: JSON.stringify({ runId: "r", messages: [] }) });
  assert.equal(res.status, 400);
  const body = await res.json();
  assert.match(body.error.message, /threadId is missing/);
});

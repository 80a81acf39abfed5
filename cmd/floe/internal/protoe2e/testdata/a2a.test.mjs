// A2A 1.0 with the stock @a2a-js/sdk client (JSON-RPC binding), and raw
// JSON-RPC over SSE for the Last-Event-ID resume.
import test from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { ClientFactory, ClientFactoryOptions, JsonRpcTransportFactory } from "@a2a-js/sdk/client";
import { Role, TaskState } from "@a2a-js/sdk";
import { A, B, auth, api, createSession, restartB, collect, assertIncreasing, SLOW_MODEL } from "./helpers.mjs";

const T = { timeout: 90_000 };

// clientOf is a stock client built from the replica's Agent Card, sending
// the bearer token.
async function clientOf(base) {
  const fetchImpl = (url, init = {}) => fetch(url, { ...init, headers: { ...(init.headers ?? {}), ...auth } });
  const factory = new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
    transports: [new JsonRpcTransportFactory({ fetchImpl })],
  }));
  return factory.createFromUrl(base);
}

const text = (s) => ({ content: { $case: "text", value: s } });
const data = (v) => ({ content: { $case: "data", value: v } });
const userMsg = (parts, extra = {}) => ({ message: { messageId: randomUUID(), role: Role.ROLE_USER, parts, ...extra } });
const partText = (p) => (p.content?.$case === "text" ? p.content.value : "");
const answer = (task) => (task.artifacts ?? []).flatMap((a) => a.parts).map(partText).join("");

test("the Agent Card names the JSON-RPC binding, streaming, bearer auth and the tools", T, async () => {
  const card = await (await fetch(A + "/.well-known/agent-card.json")).json();
  assert.deepEqual(card.supportedInterfaces, [{ url: A + "/a2a", protocolBinding: "JSONRPC", protocolVersion: "1.0" }]);
  assert.equal(card.capabilities.streaming, true);
  assert.ok(card.securitySchemes.bearer.httpAuthSecurityScheme);
  assert.ok(card.skills.some((s) => s.id === "exec_command"), JSON.stringify(card.skills.map((s) => s.id)));
});

test("SendMessage runs a Task with a tool call; the context continues on the other replica", T, async () => {
  const a = await clientOf(A);
  const t1 = await a.sendMessage(userMsg([text("What is in the workspace?")]));
  assert.equal(t1.status.state, TaskState.TASK_STATE_COMPLETED);
  assert.ok(t1.contextId.startsWith("session-"));
  assert.match(answer(t1), /workspace/i);
  const msgs = (await api(A, "GET", `/api/sessions/${t1.contextId}/messages`)).messages;
  assert.ok(msgs.some((m) => m.payload.type === "tool_call"), "the Task called a tool");

  const b = await clientOf(B);
  const got = await b.getTask({ id: t1.id });
  assert.equal(got.status.state, TaskState.TASK_STATE_COMPLETED);
  assert.equal(answer(got), answer(t1));
  const t2 = await b.sendMessage(userMsg([text("Once more")], { contextId: t1.contextId }));
  assert.equal(t2.contextId, t1.contextId);
  assert.notEqual(t2.id, t1.id);
  assert.equal(t2.status.state, TaskState.TASK_STATE_COMPLETED);

  await assert.rejects(a.sendMessage(userMsg([text("x")], { contextId: "session-unknown" })), (e) => e.code === -32602 || /contextId/.test(e.message));
  await assert.rejects(b.getTask({ id: "task-unknown" }), (e) => /not found/i.test(e.message));
});

test("an approval is TASK_STATE_INPUT_REQUIRED, answered by a message on the task", T, async () => {
  const s = await createSession(A, { approvalMode: "always-ask" });
  const a = await clientOf(A);
  const t = await a.sendMessage(userMsg([text("look around")], { contextId: s.id }));
  assert.equal(t.status.state, TaskState.TASK_STATE_INPUT_REQUIRED);
  const ask = t.status.message.parts.find((p) => p.content?.$case === "data")?.content.value;
  assert.equal(ask.name, "exec_command");
  // Answered on replica B with a data part; the blocking call returns at the end.
  const b = await clientOf(B);
  const done = await b.sendMessage(userMsg([data({ decision: "allow" })], { contextId: s.id, taskId: t.id }));
  assert.equal(done.id, t.id);
  assert.equal(done.status.state, TaskState.TASK_STATE_COMPLETED);
  assert.match(answer(done), /workspace/i);
  // A second context, denied with a text answer.
  const s2 = await createSession(A, { approvalMode: "always-ask" });
  const t2 = await a.sendMessage(userMsg([text("look")], { contextId: s2.id }));
  assert.equal(t2.status.state, TaskState.TASK_STATE_INPUT_REQUIRED);
  const d2 = await a.sendMessage(userMsg([text("deny")], { contextId: s2.id, taskId: t2.id }));
  assert.equal(d2.status.state, TaskState.TASK_STATE_COMPLETED);
  const out = (await api(A, "GET", `/api/sessions/${s2.id}/messages`)).messages.find((m) => m.payload.type === "tool_call_output");
  assert.equal(out.payload.output, "Tool call denied by user.");
});

test("CancelTask returns once the abort is done, TASK_STATE_CANCELED", T, async () => {
  const s = await createSession(A, { model: SLOW_MODEL });
  const a = await clientOf(A);
  const stop = new AbortController();
  let taskId;
  for await (const ev of a.sendMessageStream(userMsg([text("take your time")], { contextId: s.id }), { signal: stop.signal })) {
    if (ev.payload.$case === "task") taskId = ev.payload.value.id;
    if (ev.payload.$case === "artifactUpdate") break;
  }
  stop.abort();
  assert.ok(taskId);
  const b = await clientOf(B);
  const canceled = await b.cancelTask({ id: taskId });
  assert.equal(canceled.status.state, TaskState.TASK_STATE_CANCELED);
  assert.equal((await api(A, "GET", `/api/sessions/${s.id}`)).state, "idle");
  await assert.rejects(b.cancelTask({ id: taskId }), (e) => /cannot be canceled/.test(e.message));
});

// applyStream folds stream results into {state, answer} as a client
// applies them: the Task replaces, updates apply (append or replace).
function applyStream(state, payload) {
  switch (payload.$case) {
    case "task":
      return { state: payload.value.status.state, answer: answer(payload.value) };
    case "statusUpdate":
      return { ...state, state: payload.value.status.state };
    case "artifactUpdate": {
      const t = payload.value.artifact.parts.map(partText).join("");
      return { ...state, answer: payload.value.append ? state.answer + t : t };
    }
  }
  return state;
}

test("SubscribeToTask after a disconnect: the Task with the gap first, then live; nothing applied twice (after a restart)", T, async () => {
  const s = await createSession(A, { model: SLOW_MODEL });
  const a = await clientOf(A);
  const stop = new AbortController();
  let st = { state: undefined, answer: "" }, taskId, n = 0;
  for await (const ev of a.sendMessageStream(userMsg([text("go")], { contextId: s.id }), { signal: stop.signal })) {
    st = applyStream(st, ev.payload);
    if (ev.payload.$case === "task") taskId = ev.payload.value.id;
    if (ev.payload.$case === "artifactUpdate" && ++n === 4) break;
  }
  stop.abort();
  await restartB();
  const b = await clientOf(B);
  let first = true;
  for await (const ev of b.resubscribeTask({ id: taskId })) {
    if (first) {
      assert.equal(ev.payload.$case, "task", "the Task comes first");
      assert.ok(answer(ev.payload.value).startsWith(st.answer), "the Task holds what was streamed before the cut, and the gap");
      first = false;
    }
    st = applyStream(st, ev.payload);
  }
  assert.equal(st.state, TaskState.TASK_STATE_COMPLETED);
  const final = await b.getTask({ id: taskId });
  assert.equal(st.answer, answer(final), "the answer rebuilt from the snapshot and the updates is the Task's");
});

test("SubscribeToTask with Last-Event-ID sends exactly the gap", T, async () => {
  const s = await createSession(A, { model: SLOW_MODEL });
  const cut = new AbortController();
  const rpc = (method, params, headers = {}) => ({
    method: "POST",
    headers: { ...auth, "Content-Type": "application/json", Accept: "text/event-stream", ...headers },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method, params }),
  });
  const res = await fetch(A + "/a2a", { ...rpc("SendStreamingMessage", { message: { messageId: randomUUID(), role: "ROLE_USER", contextId: s.id, parts: [{ text: "go" }] } }), signal: cut.signal });
  const head = await collect(res, (ev, got) => got.filter((e) => e.data.result.artifactUpdate).length >= 3, cut);
  const taskId = head[0].data.result.task.id;
  const tail = await collect(await fetch(B + "/a2a", rpc("SubscribeToTask", { id: taskId }, { "Last-Event-ID": head.at(-1).id })),
    (ev) => ["TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED"].includes(ev.data.result.statusUpdate?.status.state));
  assert.ok(!tail[0].data.result.task, "with Last-Event-ID the gap comes, not the Task");
  const joined = [...head, ...tail];
  assertIncreasing(assert, joined);
  let text = "";
  for (const ev of joined.slice(1)) {
    const u = ev.data.result.artifactUpdate;
    if (u) text = u.append ? text + u.artifact.parts[0].text : u.artifact.parts[0].text;
  }
  const final = await (await fetch(A + "/a2a", rpc("GetTask", { id: taskId }))).json();
  assert.equal(final.result.status.state, "TASK_STATE_COMPLETED");
  assert.equal(text, final.result.artifacts[0].parts[0].text);
});

// Helpers of the stock-client tests: the environment the Go harness sets,
// Floe's REST API for setup, and a raw SSE reader for the tests that cut a
// connection and resume it by Last-Event-ID.
import { from, lastValueFrom, toArray } from "rxjs";
import { verifyEvents } from "@ag-ui/client";

export const A = process.env.FLOE_A;
export const B = process.env.FLOE_B;
export const TOKEN = process.env.FLOE_TOKEN;
export const CONTROL = process.env.FLOE_CONTROL;
export const SLOW_MODEL = process.env.FLOE_SLOW_MODEL;
export const SUBAGENT_MODEL = process.env.FLOE_SUBAGENT_MODEL;
export const auth = { Authorization: `Bearer ${TOKEN}` };

// api calls Floe's REST API and returns the parsed answer (null for 204).
export async function api(base, method, path, body) {
  const res = await fetch(base + path, {
    method,
    headers: { ...auth, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

export const createSession = (base, req = {}) => api(base, "POST", "/api/sessions", req);

// restartB restarts replica B (the Go harness stops it and starts a new
// gateway on the same address).
export async function restartB() {
  const res = await fetch(CONTROL + "/restart-b", { method: "POST" });
  if (res.status !== 204) throw new Error(`restart B: ${res.status} ${await res.text()}`);
}

// sse reads an SSE response: it yields {id, event, data} for each event
// (data parsed as JSON) until the stream ends or the caller stops.
export async function* sse(res) {
  if (!res.ok) throw new Error(`${res.status} ${await res.text()}`);
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const ev = { id: undefined, event: undefined, data: [] };
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue;
        const [k, ...rest] = line.split(":");
        const v = rest.join(":").replace(/^ /, "");
        if (k === "id") ev.id = v;
        else if (k === "event") ev.event = v;
        else if (k === "data") ev.data.push(v);
      }
      if (ev.data.length === 0) continue;
      yield { id: ev.id, event: ev.event, data: JSON.parse(ev.data.join("\n")) };
    }
  }
}

// collect reads events from an SSE response until until(ev) holds (that
// event included) or the stream ends; abort, when given, cuts the
// connection then.
export async function collect(res, until, abort) {
  const got = [];
  for await (const ev of sse(res)) {
    got.push(ev);
    if (until && until(ev, got)) {
      if (abort) abort.abort();
      break;
    }
  }
  return got;
}

// verify runs the AG-UI client's own verifier over a list of events; it
// throws what the verifier throws.
export async function verify(events) {
  return lastValueFrom(from(events).pipe(verifyEvents(false), toArray()));
}

export const isRunEnd = (ev) => ev.data.type === "RUN_FINISHED" || ev.data.type === "RUN_ERROR";

// idKey orders AG-UI/A2A SSE ids <epoch>-<seq>[:k].
export function idKey(id) {
  const m = /^(\d+)-(\d+)(?::(\d+))?$/.exec(id);
  if (!m) throw new Error(`id ${id} is not <epoch>-<seq>[:k]`);
  return [BigInt(m[1]), BigInt(m[2]), m[3] === undefined ? -1 : Number(m[3])];
}

export function assertIncreasing(assert, events) {
  for (let i = 1; i < events.length; i++) {
    const a = idKey(events[i - 1].id), b = idKey(events[i].id);
    const less = a[0] === b[0] && (a[1] < b[1] || (a[1] === b[1] && a[2] < b[2]));
    assert.ok(less, `ids not increasing: ${events[i - 1].id} then ${events[i].id}`);
  }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

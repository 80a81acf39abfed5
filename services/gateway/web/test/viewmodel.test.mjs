// Unit tests of the view model: node --test services/gateway/web/test/*.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SessionFeed, Transcript, parseEventId, cursorSeq, systemBlock } from '../app/viewmodel.js';

let clock = Date.parse('2026-12-01T10:00:00.000Z');
const ts = () => new Date((clock += 10)).toISOString();
const model = (payload, origin) => ({ timestamp: ts(), type: 'model_msg', payload, ...(origin ? { origin } : {}) });
const event = (payload, origin) => ({ timestamp: ts(), type: 'event_msg', payload, ...(origin ? { origin } : {}) });
const user = (text, origin) => model({ type: 'text', role: 'user', text }, origin);
const text = (t, origin, stop = 'completed') => model({ type: 'text', role: 'assistant', text: t, stop_reason: stop }, origin);
const ptext = (t, ev, origin) => model({ type: 'partial_text', role: 'assistant', text: t, event_type: ev }, origin);
const call = (id, name, args, origin) => model({ type: 'tool_call', role: 'assistant', name, arguments: JSON.stringify(args), tool_call_id: id, stop_reason: 'completed' }, origin);
const pout = (id, out, ev = 'delta', origin) => model({ type: 'partial_tool_call_output', role: 'user', output: out, tool_call_id: id, event_type: ev }, origin);
const out = (id, o, stop = 'completed', origin) => model({ type: 'tool_call_output', role: 'user', output: o, tool_call_id: id, stop_reason: stop }, origin);
const decision = (id, d, origin) => event({ type: 'approval_decision', decision: d, tool_call_id: id }, origin);
const begin = () => event({ type: 'request_begin' });
const end = (status = 'completed', extra = {}) => event({ type: 'request_end', status, ...extra });

// A stream of events with ids `7-<seq>` from seq 1.
function stream(msgs, from = 1) {
  return msgs.map((m, i) => ({ id: '7-' + (from + i), server: false, data: JSON.stringify(m) }));
}
const server = (ev) => ({ id: '', server: true, data: JSON.stringify(ev) });

function kinds(items) {
  return items.map((i) => i.kind);
}
function tool(t, id) {
  return t.items.find((i) => i.kind === 'tool' && i.toolCallId === id);
}
function live(msgs) {
  const f = new SessionFeed();
  f.history({ messages: [] });
  for (const e of stream(msgs)) f.event(e);
  return f.model;
}

test('parseEventId and cursorSeq read both cursor forms', () => {
  assert.deepEqual(parseEventId('1733-42'), { epoch: '1733', seq: 42 });
  assert.equal(parseEventId('42'), null);
  assert.equal(parseEventId(''), null);
  assert.equal(cursorSeq('1733-42'), 42);
  assert.equal(cursorSeq(42), 42);
  assert.equal(cursorSeq('42'), 42);
});

test('systemBlock accepts both block forms and only known tags', () => {
  assert.deepEqual(systemBlock('[user_steering]\nturn left\n[/user_steering]'), { tag: 'user_steering', body: 'turn left' });
  assert.deepEqual(systemBlock('[user_steering]turn left[/user_steering]'), { tag: 'user_steering', body: 'turn left' });
  assert.equal(systemBlock('[note]\nx\n[/note]'), null);
  assert.equal(systemBlock('plain'), null);
});

test('a streamed answer becomes one text item with the complete text', () => {
  const t = live([user('hi'), begin(), ptext('', 'start'), ptext('Hel', 'delta'), ptext('lo', 'delta'), ptext('', 'stop'), text('Hello'), end()]);
  assert.deepEqual(kinds(t.items), ['user', 'text']);
  assert.equal(t.items[1].text, 'Hello');
  assert.equal(t.items[1].streaming, false);
});

test('interleaved tool outputs are attributed by tool_call_id, not arrival order', () => {
  const t = live([
    begin(), call('A', 'exec_command', { cmd: 'slow' }), decision('A', 'allow'), call('B', 'exec_command', { cmd: 'fast' }), decision('B', 'allow'),
    pout('B', 'b1', 'start'), pout('A', 'a1', 'start'), pout('B', 'b2'), pout('A', 'a2'), pout('B', '', 'stop'), out('B', 'b1b2'),
    event({ type: 'token_usage', session: { total: 10 }, request: { total: 10 } }), end(),
    // late output after request_end
    pout('A', 'a3'), pout('A', '', 'stop'), out('A', 'a1a2a3'),
  ]);
  assert.deepEqual(kinds(t.items), ['tool', 'tool']);
  assert.equal(t.items[0].toolCallId, 'A', 'cards stay in call order');
  assert.equal(tool(t, 'A').output, 'a1a2a3');
  assert.equal(tool(t, 'A').status, 'done');
  assert.equal(tool(t, 'B').output, 'b1b2');
  assert.equal(tool(t, 'B').status, 'done');
  assert.equal(t.usage.session.total, 10);
});

test('a running tool shows its live output before its complete message', () => {
  const t = live([begin(), call('A', 'exec_command', { cmd: 'x' }), decision('A', 'allow'), end(), pout('A', 'partial ', 'start'), pout('A', 'more')]);
  const a = tool(t, 'A');
  assert.equal(a.status, 'running');
  assert.equal(a.output, 'partial more');
  assert.ok(a.startedAt > 0);
});

test('statuses: denied, forbidden, failed, interrupted by abort', () => {
  const t = live([
    begin(), call('D', 'exec_command', {}), decision('D', 'deny'), out('D', 'Tool call denied by user.', 'aborted'),
    call('F', 'exec_command', {}), decision('F', 'forbidden'), out('F', 'Tool call denied by policy.', 'aborted'),
    call('X', 'read_file', {}), decision('X', 'allow'), out('X', 'no such file', 'failed'),
    call('I', 'exec_command', {}), decision('I', 'allow'), out('I', '[interrupted: tool aborted by user]', 'aborted'),
    call('N', 'exec_command', {}), end('aborted'), event({ type: 'abort', reason: 'aborted by user' }),
  ]);
  assert.equal(tool(t, 'D').status, 'denied');
  assert.equal(tool(t, 'D').decision, 'deny');
  assert.equal(tool(t, 'F').status, 'forbidden');
  assert.equal(tool(t, 'X').status, 'failed');
  assert.equal(tool(t, 'I').status, 'interrupted');
  assert.equal(tool(t, 'N').status, 'interrupted', 'a call never dispatched is interrupted by the abort');
  assert.equal(t.items.at(-1).kind, 'notice');
  assert.equal(t.items.at(-1).notice, 'abort');
});

test('approval requests mark the card; the decision or idle clears it; re-sent requests are ignored once decided', () => {
  const f = new SessionFeed();
  f.history({ messages: [] });
  const tc = call('A', 'exec_command', { cmd: 'ls' });
  for (const e of stream([begin(), tc])) f.event(e);
  f.event(server({ type: 'task_state', state: 'running' }));
  f.event(server({ type: 'approval_request', toolCall: tc }));
  const t = f.model;
  assert.equal(tool(t, 'A').awaitingApproval, true);
  assert.equal(tool(t, 'A').status, 'waiting');
  assert.equal(t.approvals.size, 1);
  for (const e of stream([decision('A', 'allow')], 10)) f.event(e);
  assert.equal(tool(t, 'A').awaitingApproval, false);
  assert.equal(tool(t, 'A').status, 'running');
  f.event(server({ type: 'approval_request', toolCall: tc })); // re-sent on reconnect
  assert.equal(tool(t, 'A').awaitingApproval, false);
  assert.equal(t.approvals.size, 0);
});

test('retries show the countdown, and the next request_begin retires them', () => {
  const t = live([begin(), ptext('Half', 'start'), end('timeout', { error_message: 'upstream reset', attempt: 1, retry_in_ms: 2000 })]);
  const r = t.items.find((i) => i.kind === 'retry');
  assert.equal(r.active, true);
  assert.equal(r.retryInMs, 2000);
  assert.equal(r.attempt, 1);
  assert.equal(r.error, 'upstream reset');
  assert.equal(t.items[0].streaming, false, 'the cut segment is closed');
  t.applyMessage(begin());
  assert.equal(r.active, false);
  t.applyMessage(text('Whole answer'));
  assert.equal(t.items.at(-1).text, 'Whole answer');
  // A failure past the ladder is a notice, not a retry.
  t.applyMessage(end('auth', { error_message: 'bad key' }));
  assert.equal(t.items.at(-1).kind, 'notice');
});

test('the max-turns notice is a notice item', () => {
  const t = live([begin(), ptext('[reached max turns (2); stopping]', 'start'), ptext('', 'stop'), text('[reached max turns (2); stopping]', undefined, 'failed')]);
  assert.equal(t.items.length, 1);
  assert.equal(t.items[0].kind, 'notice');
  assert.equal(t.items[0].maxTurns, 2);
});

test('a compaction span in the history folds its own request into the row', () => {
  const f = new SessionFeed();
  f.history({
    messages: [
      { timestamp: ts(), type: 'session_meta', payload: { session_id: 's' } },
      user('first'), begin(), text('answer'), end(),
      event({ type: 'compaction_begin', reason: 'manual', mode: 'summarize', context: 100, turns: 1 }),
      user('Summarize the conversation'), begin(), text('[summary]\nshort\n[/summary]'),
      event({ type: 'token_usage', session: { total: 50 }, request: { total: 20 } }), end(),
      event({ type: 'compaction_end', reason: 'manual', mode: 'summarize', status: 'completed' }),
      { timestamp: ts(), type: 'session_meta', payload: { session_id: 's' } },
      event({ type: 'tool_list_ready', tools: [] }),
      user('[context_summary]\nshort\n[/context_summary]'),
      user('next'),
    ].map((m) => JSON.stringify(m)),
  });
  const t = f.model;
  assert.deepEqual(kinds(t.items), ['user', 'text', 'compaction', 'user']);
  const c = t.items[2];
  assert.equal(c.status, 'completed');
  assert.equal(c.reason, 'manual');
  assert.equal(c.inner, 2);
  assert.equal(c.summary, 'short');
  assert.equal(t.items[3].text, 'next');
  assert.equal(t.usage.session.total, 50);
});

test('a live compaction row ends with its status', () => {
  const t = live([event({ type: 'compaction_begin', reason: 'context', mode: 'summarize' }), event({ type: 'token_usage', session: { total: 5 } }), event({ type: 'compaction_end', reason: 'context', mode: 'summarize', status: 'failed', error_message: 'no summary' })]);
  assert.equal(t.items.length, 1);
  assert.equal(t.items[0].status, 'failed');
  assert.equal(t.items[0].error, 'no summary');
});

test('steering appears as a user item where the stream puts it', () => {
  const t = live([user('do it'), begin(), call('A', 'exec_command', {}), decision('A', 'allow'), end(), out('A', 'ok'), user('[user_steering]\nalso this\n[/user_steering]'), begin(), text('done')]);
  assert.deepEqual(kinds(t.items), ['user', 'tool', 'user', 'text']);
  assert.equal(t.items[2].steering, true);
  assert.equal(t.items[2].text, 'also this');
});

test('nested origins route into subagent cards hung on their run_subagent call', () => {
  const C = 'session-child', G = 'session-grandchild';
  const t = live([
    user('delegate'), begin(), call('S', 'run_subagent', { description: 'd', prompt: 'child task' }), decision('S', 'allow'), end(),
    event({ type: 'subagent', session_id: C }),
    { timestamp: ts(), type: 'session_meta', payload: { session_id: C, source: 'subagent' }, origin: [C] },
    user('child task', [C]), event({ type: 'request_begin' }, [C]),
    ptext('chi', 'start', [C]), ptext('ld says', 'delta', [C]), ptext('', 'stop', [C]), text('child says', [C]),
    call('K', 'run_subagent', { description: 'g', prompt: 'grand task' }, [C]),
    event({ type: 'subagent', session_id: G }, [C]),
    text('grandchild says', [C, G]),
    out('K', 'grandchild says', 'completed', [C]),
    text('child done', [C]),
    out('S', 'child done'),
    text('parent done'),
  ]);
  assert.deepEqual(kinds(t.items), ['user', 'tool', 'text'], 'no child message in the parent transcript');
  assert.equal(t.items[2].text, 'parent done');
  const s = tool(t, 'S');
  assert.ok(s.child, 'the child card hangs on run_subagent');
  assert.equal(s.child.sessionId, C);
  assert.equal(s.child.status, 'done');
  const child = s.child.level.items;
  assert.deepEqual(kinds(child), ['user', 'text', 'tool', 'text']);
  assert.equal(child[1].text, 'child says');
  const k = child[2];
  assert.equal(k.child.sessionId, G);
  assert.deepEqual(k.child.level.items.map((i) => i.text), ['grandchild says']);
});

test('a subagent approval request lands on the card in the child transcript', () => {
  const C = 'session-c';
  const f = new SessionFeed();
  f.history({ messages: [] });
  const tc = call('X', 'exec_command', { cmd: 'rm -i' }, [C]);
  for (const e of stream([call('S', 'run_subagent', { prompt: 'p' }), decision('S', 'allow'), event({ type: 'subagent', session_id: C }), user('p', [C]), tc])) f.event(e);
  f.event(server({ type: 'approval_request', toolCall: { ...tc, origin: undefined }, origin: [C] }));
  const card = tool(f.model, 'S').child;
  const x = card.level.items.find((i) => i.toolCallId === 'X');
  assert.equal(x.awaitingApproval, true);
  assert.equal(f.model.approvals.get(C + '|X'), x);
  assert.equal(f.model.items.filter((i) => i.kind === 'tool').length, 1, 'not on the parent transcript');
});

test('connect-first: buffered partials covered by live.cursor are dropped, fragments seeded, the rest replayed', () => {
  const msgs = [user('go'), begin(), ptext('', 'start'), ptext('Hello ', 'delta'), ptext('wor', 'delta'), ptext('ld', 'delta'), ptext('', 'stop'), text('Hello world')];
  const ev = stream(msgs); // seq 1..8
  const f = new SessionFeed();
  // SSE connected at seq 4 (before "Hello "), /messages taken at seq 5.
  for (const e of ev.slice(3)) f.event(e);
  f.event(server({ type: 'task_state', state: 'running' }));
  assert.equal(f.model.items.length, 0, 'nothing shown before the history');
  f.history({
    messages: [JSON.stringify(msgs[0]), JSON.stringify(msgs[1])],
    live: { cursor: '7-5', fragments: [JSON.stringify(ptext('Hello wor', 'start'))] },
  });
  const t = f.model;
  assert.deepEqual(kinds(t.items), ['user', 'text']);
  assert.equal(t.items[1].text, 'Hello world');
  assert.equal(t.taskState, 'running');
  // mid-stream state: exactly what was streamed, once
  const g = new SessionFeed();
  for (const e of ev.slice(3, 6)) g.event(e);
  g.history({ messages: [JSON.stringify(msgs[0]), JSON.stringify(msgs[1])], live: { cursor: 5, fragments: [JSON.stringify(ptext('Hello wor', 'start'))] } });
  assert.equal(g.model.items[1].text, 'Hello world');
  assert.equal(g.model.items[1].streaming, true);
});

test('connect-first without a live part: complete messages already in the history are not doubled', () => {
  const msgs = [user('go'), begin(), ptext('', 'start'), ptext('All', 'delta'), ptext('', 'stop'), text('All'), call('A', 'read_file', {}), decision('A', 'allow'), pout('A', 'abc', 'start'), pout('A', '', 'stop'), out('A', 'abc'), end()];
  const ev = stream(msgs);
  const f = new SessionFeed();
  for (const e of ev.slice(3)) f.event(e); // connected mid-answer
  f.event(server({ type: 'task_state', state: 'idle', status: 'completed' }));
  // The Task ended before /messages was read: no live part.
  f.history({ messages: msgs.filter((m) => !m.payload.type.startsWith('partial_')).map((m) => JSON.stringify(m)) });
  const t = f.model;
  assert.deepEqual(kinds(t.items), ['user', 'text', 'tool']);
  assert.equal(t.items[1].text, 'All');
  assert.equal(tool(t, 'A').output, 'abc', 'replayed output fragments of a finished output are ignored');
  assert.equal(t.taskState, 'idle');
  // Later live messages still apply.
  for (const e of stream([user('again'), text('Second')], 100)) f.event(e);
  assert.deepEqual(kinds(t.items), ['user', 'text', 'tool', 'user', 'text']);
});

test('resync_required asks for the history again and buffers until it comes', () => {
  const f = new SessionFeed();
  f.history({ messages: [JSON.stringify(user('a'))] });
  assert.equal(f.event(server({ type: 'resync_required' })), 'resync');
  assert.equal(f.loaded, false);
  for (const e of stream([text('live after resync')], 50)) f.event(e);
  f.history({ messages: [JSON.stringify(user('a')), JSON.stringify(text('b'))] });
  assert.deepEqual(f.model.items.map((i) => i.text), ['a', 'b', 'live after resync']);
});

test('a reconnect replay continues the transcript (ids move on, nothing repeats)', () => {
  const f = new SessionFeed();
  f.history({ messages: [] });
  const msgs = [begin(), ptext('', 'start'), ptext('one ', 'delta'), ptext('two', 'delta'), ptext('', 'stop'), text('one two'), end()];
  const ev = stream(msgs);
  for (const e of ev.slice(0, 3)) f.event(e);
  assert.equal(f.lastEventId, '7-3');
  // the gateway replays from Last-Event-ID 7-3, then the snapshot
  for (const e of ev.slice(3)) f.event(e);
  f.event(server({ type: 'task_state', state: 'idle', status: 'completed' }));
  assert.deepEqual(f.model.items.map((i) => i.text), ['one two']);
});

test('the view model handles 5,000 history messages quickly', () => {
  const msgs = [];
  for (let i = 0; i < 1250; i++) msgs.push(JSON.stringify(user('q' + i)), JSON.stringify(call('c' + i, 'read_file', { file_path: 'f' })), JSON.stringify(out('c' + i, 'x'.repeat(50))), JSON.stringify(text('a' + i)));
  const f = new SessionFeed();
  const t0 = performance.now();
  f.history({ messages: msgs });
  const took = performance.now() - t0;
  assert.equal(f.model.items.length, 3750);
  console.log(`# 5000 history messages folded in ${took.toFixed(1)} ms`);
});

test('unknown events and malformed data never break the fold', () => {
  const f = new SessionFeed();
  f.history({ messages: ['not json', JSON.stringify({ type: 'event_msg', payload: { type: 'mcp_connect_begin', servers: [] } })] });
  f.event({ id: '7-1', server: false, data: '{broken' });
  f.event({ id: '7-2', server: false, data: JSON.stringify(event({ type: 'goal_finished' })) });
  f.event(server({ type: 'something_new' }));
  assert.equal(f.model.items.length, 0);
});

test('Transcript revs change only for touched items', () => {
  const t = new Transcript();
  t.applyMessage(user('a'));
  t.applyMessage(call('A', 'exec_command', {}));
  const [u, a] = t.items;
  const ur = u.rev, ar = a.rev;
  t.applyMessage(pout('A', 'x', 'start'));
  assert.equal(u.rev, ur);
  assert.ok(a.rev > ar);
});

test('tool output images are kept on the card, data:image URLs only', () => {
  const t = new Transcript();
  t.applyMessage(call('c1', 'mcp__shot__take', { url: 'x' }));
  t.applyMessage(model({ type: 'tool_call_output', role: 'user', output: 'shot', tool_call_id: 'c1', stop_reason: 'completed', images: ['data:image/png;base64,iVBORw0KGgo=', 'javascript:alert(1)', 'data:text/html;base64,PHA+', 42] }));
  assert.deepEqual(tool(t, 'c1').images, ['data:image/png;base64,iVBORw0KGgo=']);
});

test('a windowed history with the pages before it prepended is the whole history, live events included', () => {
  const msgs = [];
  for (let i = 0; i < 6; i++) msgs.push(user('prompt ' + i), begin(), text('answer ' + i), end());
  const raw = msgs.map((m) => JSON.stringify(m));
  const whole = new SessionFeed();
  whole.history({ messages: raw });
  const after = [user('prompt 6'), begin(), text('answer 6'), end()];
  for (const e of stream(after, 100)) whole.event(e);

  const paged = new SessionFeed();
  paged.history({ messages: raw.slice(16), window: { start: '16', more: true } });
  assert.equal(paged.earlier, '16');
  for (const e of stream(after, 100)) paged.event(e);
  paged.prepend({ messages: raw.slice(8, 16), window: { start: '8', more: true } });
  assert.equal(paged.earlier, '8');
  paged.prepend({ messages: raw.slice(0, 8), window: { start: '0', more: false } });
  assert.equal(paged.earlier, '');
  const texts = (f) => f.model.items.map((i) => i.kind + ':' + (i.text || ''));
  assert.deepEqual(texts(paged), texts(whole));
  assert.equal(paged.model.items.length, 14);
});

test('a hook-denied call says which hook and why; other hook records are notices', () => {
  const t = live([
    user('push'), begin(),
    call('c1', 'exec_command', { cmd: 'git push origin main' }),
    event({ type: 'hook', hook: 'pre_tool_use', name: 'audit', output: { logged: true }, tool_call_id: 'c1' }),
    event({ type: 'hook', hook: 'pre_tool_use', name: 'no-push-main', decision: 'deny', reason: 'pushes to main are not allowed', tool_call_id: 'c1' }),
    decision('c1', 'deny'),
    out('c1', 'Tool call denied by the no-push-main hook: pushes to main are not allowed.', 'aborted'),
    end(), begin(), text('Refused.'), end(),
    event({ type: 'hook', hook: 'stop', name: 'ralph', decision: 'continue', reason: 'go test fails' }),
  ]);
  const c = tool(t, 'c1');
  assert.equal(c.status, 'denied');
  assert.deepEqual(c.deniedBy, { name: 'no-push-main', point: 'pre_tool_use', decision: 'deny', reason: 'pushes to main are not allowed' });
  assert.equal(c.hooks.length, 2);
  const n = t.items.filter((i) => i.kind === 'notice' && i.notice === 'hook');
  assert.equal(n.length, 1);
  assert.equal(n[0].text, 'stop hook ralph: continue — go test fails');
});

test('every item of the Session knows where a fork from it cuts', () => {
  const f = new SessionFeed();
  const hist = [event({ type: 'tool_list_ready', tools: [] }), user('first'), begin(), text('one'), end(), user('second'), begin(), call('c1', 'exec_command', { cmd: 'ls' }), end(), out('c1', 'a b')];
  f.history({ messages: hist.map((m) => JSON.stringify(m)), positions: [11, 12, 13, 14, 15, 16, 17, 18, 19, 20], window: { start: '11', more: true } });
  const items = f.model.items;
  assert.deepEqual(kinds(items), ['user', 'text', 'user', 'tool']);
  assert.deepEqual(items.map((i) => i.forkAt), [{ atRecord: 12 }, { atRecord: 15 }, { atRecord: 16 }, { atRecord: 20 }]); // an answer: after its request_end; the tool: after its output
  // Live: the stream's event ids.
  for (const e of stream([user('third'), begin(), text('three'), end()], 40)) f.event(e);
  assert.deepEqual(f.model.items.slice(4).map((i) => i.forkAt), [{ atSeq: '7-40' }, { atSeq: '7-43' }]);
  // A page before keeps every position.
  f.prepend({ messages: [JSON.stringify(user('zero')), JSON.stringify(text('nil'))], positions: [9, 10], window: { start: '0', more: false } });
  assert.deepEqual(f.model.items.map((i) => i.forkAt && (i.forkAt.atRecord ?? i.forkAt.atSeq)), [9, 10, 12, 15, 16, 20, '7-40', '7-43']);
  // Without positions (a damaged Trace) history items have none; nested ones never do.
  const g = new SessionFeed();
  g.history({ messages: [JSON.stringify(user('x')), JSON.stringify(text('y', ['session-child']))] });
  assert.equal(g.model.items[0].forkAt, undefined);
  for (const e of stream([call('s1', 'run_subagent', { prompt: 'p' }), text('inner', ['session-child'])], 5)) g.event(e);
  const sub = g.model.subagents.get('session-child');
  assert.ok(sub.level.items.every((i) => i.forkAt === undefined));
});

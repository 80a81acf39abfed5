// The Session view model: SSE stream + /messages history → what the page
// shows. Pure: no DOM, no network, no clock (times come from the messages,
// or from the caller as receivedAt), so `node --test` covers it.
//
// The seed's rules for renderers, all kept here:
//   - route by `origin` into nested cards (one level per child Session);
//   - hang every tool output on its call by tool_call_id, never by arrival
//     order (outputs arrive in completion order, also after request_end);
//   - connect first and buffer, fetch /messages, drop buffered partials
//     covered by live.cursor, seed live.fragments, replay the rest, dedupe
//     complete messages against the history;
//   - resync_required rebuilds the view from /messages.

const STEERING = 'user_steering';
const SYSTEM_TAGS = ['turn_retried', 'turn_aborted', 'summary', 'context_summary', STEERING];
const MAX_TURNS_RE = /^\[reached max turns \((\d+)\); stopping\]$/;

// parseEventId splits an SSE id `<epoch>-<seq>`; null when malformed.
export function parseEventId(id) {
  if (typeof id !== 'string') return null;
  const m = /^(\d+)-(\d+)$/.exec(id.trim());
  return m ? { epoch: m[1], seq: Number(m[2]) } : null;
}

// cursorSeq reads live.cursor: `<epoch>-<seq>` (protocol.md §3) or a bare number.
export function cursorSeq(cursor) {
  if (typeof cursor === 'number') return cursor;
  const p = parseEventId(String(cursor ?? ''));
  if (p) return p.seq;
  const n = Number(cursor);
  return Number.isFinite(n) ? n : null;
}

// systemBlock returns {tag, body} for `[tag]\n<body>\n[/tag]` (or without
// the newlines), else null.
export function systemBlock(text) {
  if (typeof text !== 'string') return null;
  const m = /^\[([a-z_]+)\]\n?([\s\S]*?)\n?\[\/\1\]\s*$/.exec(text);
  if (!m || !SYSTEM_TAGS.includes(m[1])) return null;
  return { tag: m[1], body: m[2] };
}

// imagesOf returns a tool output's images (protocol.md §1 `images?`): the data
// URLs of images only, anything else dropped.
export function imagesOf(p) {
  if (!Array.isArray(p.images)) return [];
  return p.images.filter((u) => typeof u === 'string' && /^data:image\/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=\s]+$/.test(u));
}

function ms(ts) {
  const t = Date.parse(ts);
  return Number.isFinite(t) ? t : 0;
}

// A level is one transcript: the Session's own, or a child's inside its
// subagent card.
function newLevel(path) {
  return { path, items: [], openText: null, openThinking: null, tools: new Map(), retries: [] };
}

// Transcript is one Session's view model. Items are plain objects with a
// stable `key`, a `kind` (user, text, thinking, tool, subagent, retry,
// compaction, notice) and a `rev` bumped on every change, so a renderer
// redraws only what changed.
export class Transcript {
  constructor() {
    this.reset();
  }

  reset() {
    this.root = newLevel('');
    this.levels = new Map([['', this.root]]);
    this.subagents = new Map(); // child session id → subagent item
    this.approvals = new Map(); // `${path}|${tool_call_id}` → tool item awaiting a decision
    this.taskState = 'idle';
    this.lastStatus = '';
    this.usage = null; // last token_usage payload
    this.meta = null;
    this.compaction = null; // open compaction item (root)
    this.lastCompaction = null; // for the [context_summary] that follows
    this.request = null; // root items of the open request (for item.forkAt)
    this.nextKey = 1;
    this.version = 0; // bumped on any change
  }

  get items() {
    return this.root.items;
  }

  touch(item) {
    if (this.at && item.lv === this.root) this.cutAt(item);
    item.rev = (item.rev || 0) + 1;
    this.version++;
    if (item.lv && item.lv !== this.root) this.bubble(item.lv);
  }

  add(level, item) {
    item.key = 'i' + this.nextKey++;
    item.rev = 1;
    item.lv = level;
    if (this.at && level === this.root) this.cutAt(item);
    level.items.push(item);
    this.version++;
    if (level !== this.root) this.bubble(level);
    return item;
  }

  // cutAt notes that item changed with the message at this.at. A model
  // message's item is noted again at its request's request_end: a fork
  // after the message but before that would drop the request's answer
  // from the model's context (an uncommitted request), so "fork from
  // here" on an answer cuts after its request.
  cutAt(item) {
    item.forkAt = this.at;
    if (this.request) this.request.add(item);
  }

  remove(level, item) {
    const i = level.items.lastIndexOf(item);
    if (i >= 0) level.items.splice(i, 1);
    this.version++;
    if (level !== this.root) this.bubble(level);
  }

  // bubble marks the cards that hold a nested level as changed, up to the
  // Session's own transcript, so a renderer redraws the path to a change.
  bubble(lv) {
    while (lv && lv !== this.root) {
      const card = this.cardOf(lv);
      if (!card) return;
      card.rev = (card.rev || 0) + 1;
      if (card.attachedTo) card.attachedTo.rev++;
      lv = this.levels.get(card.parentPath);
    }
  }

  // level returns the transcript for an origin chain, creating the
  // subagent cards on the way.
  level(origin) {
    if (!Array.isArray(origin) || origin.length === 0) return this.root;
    const path = origin.join('/');
    let lv = this.levels.get(path);
    if (lv) return lv;
    const parent = this.level(origin.slice(0, -1));
    const sid = origin[origin.length - 1];
    lv = newLevel(path);
    this.levels.set(path, lv);
    const card = { kind: 'subagent', sessionId: sid, level: lv, status: 'running', attachedTo: null, prompt: '' };
    this.subagents.set(sid, card);
    card.parentPath = parent.path;
    this.attachSubagent(parent, card);
    if (!card.attachedTo) this.add(parent, card);
    else {
      card.key = 'i' + this.nextKey++;
      card.rev = 1;
      card.lv = parent;
      this.touch(card.attachedTo);
    }
    return lv;
  }

  // attachSubagent hangs a child's card on its run_subagent call: the one
  // whose prompt matches, else the only call still waiting for a child.
  attachSubagent(parent, card) {
    if (card.attachedTo) return;
    const free = [];
    for (const t of parent.tools.values()) {
      if (t.name === 'run_subagent' && !t.child && !t.outputDone) free.push(t);
    }
    let pick = null;
    if (card.prompt) pick = free.find((t) => t.subagentPrompt === card.prompt) || null;
    if (!pick && free.length === 1) pick = free[0];
    if (!pick) return;
    const i = parent.items.indexOf(card);
    if (i >= 0) parent.items.splice(i, 1);
    pick.child = card;
    card.attachedTo = pick;
    this.touch(pick);
  }

  // applyMessage folds one OmniMessage (an object). opts.receivedAt (ms)
  // is when it arrived live; history uses the message's timestamp.
  // opts.at is where a fork "from here" cuts after it (protocol.md §3, the
  // fork route): {atRecord} for a history message (its /messages
  // position), {atSeq} for a stream event (its SSE id). Every item of the
  // Session's own transcript the message adds or changes takes it as
  // item.forkAt.
  applyMessage(m, opts = {}) {
    this.at = opts.at || null;
    try {
      this.fold(m, opts);
    } finally {
      this.at = null;
    }
  }

  fold(m, opts) {
    if (!m || typeof m !== 'object' || !m.payload) return;
    const p = m.payload;
    const at = opts.receivedAt || ms(m.timestamp);
    const lv = this.level(m.origin);
    const nested = lv !== this.root;
    if (m.type === 'session_meta') {
      if (!nested) this.meta = p;
      return;
    }
    if (!nested && this.compaction) {
      this.foldIntoCompaction(m, at);
      return;
    }
    if (m.type === 'event_msg') {
      this.applyEvent(lv, p, at, m);
      return;
    }
    switch (p.type) {
      case 'partial_text':
      case 'partial_thinking':
        this.applyPartialBlock(lv, p);
        return;
      case 'partial_tool_call':
        this.applyPartialCall(lv, p);
        return;
      case 'partial_tool_call_output':
        this.applyPartialOutput(lv, p);
        return;
      case 'text':
        this.applyText(lv, p, at);
        return;
      case 'thinking':
        this.applyThinking(lv, p);
        return;
      case 'tool_call':
        this.applyCall(lv, p, at);
        return;
      case 'tool_call_output':
        this.applyOutput(lv, p, at);
        return;
      case 'image_url':
      case 'inline_data':
        if (p.role === 'user') this.add(lv, { kind: 'user', text: p.type === 'image_url' ? '[image] ' + (p.image_url || '') : '[' + (p.mime_type || 'data') + ']', steering: false });
        return;
      default:
        return; // unknown model_msg types are kept on the stream, not shown
    }
  }

  applyPartialBlock(lv, p) {
    const isText = p.type === 'partial_text';
    const field = isText ? 'text' : 'thinking';
    const openKey = isText ? 'openText' : 'openThinking';
    let it = lv[openKey];
    if (!it) {
      it = this.add(lv, { kind: isText ? 'text' : 'thinking', text: '', streaming: true, role: p.role || 'assistant' });
      lv[openKey] = it;
    }
    const piece = p[field] || '';
    if (piece) it.text += piece;
    this.touch(it);
  }

  applyText(lv, p, at) {
    const text = p.text || '';
    if (p.role === 'user') {
      const blk = systemBlock(text);
      if (blk && blk.tag === STEERING) {
        this.add(lv, { kind: 'user', text: blk.body, steering: true, at });
      } else if (blk && blk.tag === 'context_summary') {
        const c = this.lastCompaction;
        if (c && lv === this.root) {
          c.summary = blk.body;
          this.touch(c);
        }
      } else if (!blk) {
        this.add(lv, { kind: 'user', text, steering: false, at, sender: p.sender || '' });
        if (lv !== this.root && !this.cardOf(lv).prompt) {
          const card = this.cardOf(lv);
          card.prompt = text;
          if (!card.attachedTo) this.attachSubagent(this.levels.get(card.parentPath), card);
        }
      }
      return;
    }
    let it = lv.openText;
    lv.openText = null;
    if (!it) it = this.add(lv, { kind: 'text', text: '', role: 'assistant' });
    it.text = text;
    it.streaming = false;
    it.stopReason = p.stop_reason || 'completed';
    const mt = MAX_TURNS_RE.exec(text);
    if (mt && it.stopReason === 'failed') {
      it.kind = 'notice';
      it.notice = 'max_turns';
      it.maxTurns = Number(mt[1]);
    }
    this.touch(it);
  }

  applyThinking(lv, p) {
    let it = lv.openThinking;
    lv.openThinking = null;
    if (!it) it = this.add(lv, { kind: 'thinking', text: '' });
    it.text = p.thinking || '';
    it.streaming = false;
    this.touch(it);
  }

  tool(lv, id, name) {
    let t = lv.tools.get(id);
    if (!t) {
      t = this.add(lv, {
        kind: 'tool', toolCallId: id, name: name || '', args: '', argsDone: false, output: '', outputDone: false, images: [],
        status: 'streaming', decision: '', awaitingApproval: false, startedAt: 0, endedAt: 0, child: null, path: lv.path,
      });
      lv.tools.set(id, t);
    } else if (name && !t.name) t.name = name;
    return t;
  }

  applyPartialCall(lv, p) {
    if (!p.tool_call_id) return;
    const t = this.tool(lv, p.tool_call_id, p.name);
    if (t.argsDone) return; // the complete call is authoritative
    t.args += p.arguments || '';
    this.touch(t);
  }

  applyCall(lv, p, at) {
    if (!p.tool_call_id) return;
    const t = this.tool(lv, p.tool_call_id, p.name);
    t.name = p.name || t.name;
    t.args = p.arguments || '';
    t.argsDone = true;
    if (t.status === 'streaming') t.status = 'pending';
    t.calledAt = at;
    if (t.name === 'run_subagent') {
      try {
        t.subagentPrompt = JSON.parse(t.args).prompt || '';
      } catch {
        t.subagentPrompt = '';
      }
      for (const card of this.subagents.values()) {
        if (!card.attachedTo && card.parentPath === lv.path) this.attachSubagent(lv, card);
      }
    }
    this.touch(t);
  }

  applyPartialOutput(lv, p) {
    if (!p.tool_call_id) return;
    const t = this.tool(lv, p.tool_call_id, '');
    if (t.outputDone) return; // late or replayed fragments of a finished output
    t.output += p.output || '';
    const imgs = imagesOf(p);
    if (imgs.length) t.images = [...(t.images || []), ...imgs];
    if (t.status === 'pending' || t.status === 'streaming') t.status = 'running';
    this.touch(t);
  }

  applyOutput(lv, p, at) {
    if (!p.tool_call_id) return;
    const t = this.tool(lv, p.tool_call_id, '');
    t.output = p.output || '';
    t.outputDone = true;
    t.images = imagesOf(p);
    t.endedAt = at;
    t.awaitingApproval = false;
    this.approvals.delete(lv.path + '|' + t.toolCallId);
    const sr = p.stop_reason || 'completed';
    if (sr === 'completed') t.status = 'done';
    else if (sr === 'aborted') t.status = t.decision === 'deny' ? 'denied' : t.decision === 'forbidden' ? 'forbidden' : 'interrupted';
    else t.status = 'failed';
    if (t.child && t.child.status === 'running') {
      t.child.status = t.status === 'done' ? 'done' : t.status;
      this.touch(t.child);
    }
    this.touch(t);
  }

  applyEvent(lv, p, at, m) {
    switch (p.type) {
      case 'approval_decision': {
        const t = this.tool(lv, p.tool_call_id, '');
        t.decision = p.decision;
        t.awaitingApproval = false;
        this.approvals.delete(lv.path + '|' + t.toolCallId);
        if (!t.outputDone) {
          if (p.decision === 'allow') {
            t.status = 'running';
            t.startedAt = at;
          } else t.status = p.decision === 'forbidden' ? 'forbidden' : 'denied';
        }
        this.touch(t);
        return;
      }
      case 'request_begin':
        if (lv === this.root) this.request = new Set();
        for (const it of lv.retries || []) {
          if (it.active) {
            it.active = false;
            this.touch(it);
          }
        }
        lv.retries = [];
        return;
      case 'request_end': {
        const st = p.status || 'completed';
        this.closeSegments(lv);
        if (lv === this.root && this.request) {
          const items = this.request;
          this.request = null;
          if (this.at) for (const it of items) this.touch(it);
        }
        if (st === 'completed' || st === 'aborted') return;
        if (p.retry_in_ms != null && p.retry_in_ms >= 0) {
          const it = this.add(lv, {
            kind: 'retry', status: st, error: p.error_message || '', attempt: p.attempt || 0,
            retryInMs: p.retry_in_ms, deadline: at + p.retry_in_ms, active: true,
          });
          (lv.retries ||= []).push(it);
        } else {
          this.add(lv, { kind: 'notice', notice: 'request_failed', status: st, text: p.error_message || 'The request ' + st + '.' });
        }
        return;
      }
      case 'token_usage':
        if (lv === this.root) this.usage = { session: p.session || null, request: p.request || null };
        this.version++;
        return;
      case 'compaction_begin':
        if (lv !== this.root) return;
        this.compaction = this.add(lv, {
          kind: 'compaction', reason: p.reason || '', mode: p.mode || '', status: 'running', inner: 0, summary: '',
          contextTokens: p.context ?? null, turns: p.turns ?? null,
        });
        return;
      case 'abort': {
        this.closeSegments(lv);
        for (const t of lv.tools.values()) {
          if (!t.outputDone && t.status !== 'denied' && t.status !== 'forbidden') {
            t.status = 'interrupted';
            t.awaitingApproval = false;
            this.approvals.delete(lv.path + '|' + t.toolCallId);
            this.touch(t);
          }
        }
        this.add(lv, { kind: 'notice', notice: 'abort', text: p.reason ? 'Stopped: ' + p.reason : 'Stopped.' });
        return;
      }
      case 'subagent':
        if (p.session_id) this.level([...(m.origin || []), p.session_id]);
        return;
      case 'hook': {
        // A hook's record (protocol.md §7): a pre_tool_use one of Floe's names its
        // call, whose card says which hook denied it and why; the others
        // (stop hooks, the original's records) are notices in the flow.
        const h = { name: p.name || 'hook', point: p.hook || '', decision: p.decision || '', reason: p.reason || '' };
        if (h.point === 'pre_tool_use' && p.tool_call_id) {
          const t = this.tool(lv, p.tool_call_id, '');
          (t.hooks ||= []).push(h);
          if (h.decision === 'deny' && !t.deniedBy) t.deniedBy = h;
          this.touch(t);
          return;
        }
        this.add(lv, { kind: 'notice', notice: 'hook', hook: h, text: hookText(h) });
        return;
      }
      default:
        return; // tool_list_ready, mcp_*, unknown events: not shown
    }
  }

  // closeSegments ends text/thinking segments left open (a request that
  // ended without its complete message, e.g. cut by a failure).
  closeSegments(lv) {
    for (const k of ['openText', 'openThinking']) {
      const it = lv[k];
      if (it) {
        it.streaming = false;
        lv[k] = null;
        this.touch(it);
      }
    }
  }

  // foldIntoCompaction keeps a compaction's own request (Trace-only
  // messages in the history) inside its row, out of the transcript.
  foldIntoCompaction(m, at) {
    const c = this.compaction;
    const p = m.payload;
    if (m.type === 'event_msg' && p.type === 'compaction_end') {
      c.status = p.status || 'completed';
      c.error = p.error_message || '';
      this.compaction = null;
      this.lastCompaction = c;
      this.touch(c);
      return;
    }
    if (m.type === 'event_msg' && p.type === 'token_usage') {
      this.usage = { session: p.session || null, request: p.request || null };
    } else if (m.type === 'event_msg' && p.type === 'request_end' && p.status && p.status !== 'completed') {
      c.attempts = (c.attempts || 0) + 1;
    } else if (m.type === 'model_msg' && !String(p.type).startsWith('partial_')) {
      c.inner++;
    }
    this.touch(c);
  }

  cardOf(lv) {
    const sid = lv.path.split('/').pop();
    return this.subagents.get(sid);
  }

  // applyServer folds a server event: task_state, approval_request.
  applyServer(ev) {
    if (!ev || typeof ev !== 'object') return;
    if (ev.type === 'task_state') {
      this.taskState = ev.state || 'idle';
      if (this.taskState === 'idle') {
        this.lastStatus = ev.status || '';
        for (const t of this.approvals.values()) {
          t.awaitingApproval = false;
          if (t.status === 'waiting') t.status = 'pending';
          this.touch(t);
        }
        this.approvals.clear();
        for (const lv of this.levels.values()) this.closeSegments(lv);
      }
      this.version++;
      return;
    }
    if (ev.type === 'approval_request') {
      let tc = ev.toolCall;
      if (typeof tc === 'string') {
        try {
          tc = JSON.parse(tc);
        } catch {
          return;
        }
      }
      const p = tc && tc.payload;
      if (!p || !p.tool_call_id) return;
      const lv = this.level(ev.origin && ev.origin.length ? ev.origin : tc.origin);
      const t = this.tool(lv, p.tool_call_id, p.name);
      if (!t.argsDone) {
        t.args = p.arguments || '';
        t.argsDone = true;
      }
      if (t.decision || t.outputDone) return; // decided already (a re-sent request)
      t.awaitingApproval = true;
      t.status = 'waiting';
      this.approvals.set(lv.path + '|' + t.toolCallId, t);
      this.touch(t);
    }
  }

  // markDecided is the optimistic end of a pending approval once the
  // gateway accepted the decision (the approval_decision event follows).
  markDecided(path, toolCallId) {
    const t = this.approvals.get(path + '|' + toolCallId);
    if (!t) return;
    t.awaitingApproval = false;
    this.approvals.delete(path + '|' + toolCallId);
    this.touch(t);
  }

  // dropOpenFor removes the streaming item a deduplicated complete message
  // would have finished (its history copy is already shown).
  dropOpenFor(m) {
    const lv = this.level(m.origin);
    const p = m.payload;
    if (p.type === 'text' && p.role !== 'user' && lv.openText) {
      this.remove(lv, lv.openText);
      lv.openText = null;
    } else if (p.type === 'thinking' && lv.openThinking) {
      this.remove(lv, lv.openThinking);
      lv.openThinking = null;
    }
  }
}

function isComplete(m) {
  return m && (m.type === 'model_msg' || m.type === 'event_msg') && !String(m.payload?.type).startsWith('partial_');
}

function parse(data) {
  if (typeof data !== 'string') return data;
  try {
    return JSON.parse(data);
  } catch {
    return null;
  }
}

// positionAt is the fork cut after message i of a /messages answer: its
// position (protocol.md §3), null when the answer has none.
function positionAt(h, i) {
  const pos = h && h.positions;
  if (!Array.isArray(pos) || pos.length !== h.messages.length || !Number.isInteger(pos[i])) return null;
  return { atRecord: pos[i] };
}

// SessionFeed joins a Session's SSE stream with its /messages history into
// one Transcript, connect-first: events that arrive before the history are
// buffered and replayed over it.
//
//   feed.event({id, server, data, receivedAt}) → 'resync' when the caller
//     must fetch /messages again, else undefined;
//   feed.history({messages, live, window?}) rebuilds the Transcript; with a
//     windowed answer (GET /messages?tailTasks=N), feed.earlier is the
//     cursor of the page before it ('' when there is none);
//   feed.prepend({messages, window}) puts that page before everything the
//     Transcript holds (docs/history-window.md).
export class SessionFeed {
  constructor() {
    this.model = new Transcript();
    this.loaded = false;
    this.buffer = [];
    this.lastEventId = '';
    this.resyncs = 0;
    this.earlier = '';
    this.older = []; // parsed messages of the pages before the first window
    this.ops = []; // what built the Transcript since the first window, in order
  }

  event(ev) {
    if (ev.id) this.lastEventId = ev.id;
    const data = parse(ev.data);
    if (data == null) return undefined;
    if (ev.server && data.type === 'resync_required') {
      this.loaded = false;
      this.buffer = [];
      this.resyncs++;
      return 'resync';
    }
    const e = { id: ev.id || '', server: !!ev.server, data, receivedAt: ev.receivedAt || 0 };
    if (!this.loaded) {
      this.buffer.push(e);
      return undefined;
    }
    this.apply(e);
    return undefined;
  }

  apply(e) {
    const at = e.id ? { atSeq: e.id } : null;
    this.op(() => {
      if (e.server) this.model.applyServer(e.data);
      else this.model.applyMessage(e.data, { receivedAt: e.receivedAt, at });
    });
  }

  // op runs f on the Transcript and keeps it, so prepend can build the
  // Transcript again with an earlier page first.
  op(f) {
    this.ops.push(f);
    f();
  }

  prepend(h) {
    const page = [];
    const messages = (h && h.messages) || [];
    messages.forEach((raw, i) => {
      const m = parse(raw);
      if (m) page.push({ m, at: positionAt(h, i) });
    });
    this.older = page.concat(this.older);
    this.earlier = h && h.window && h.window.more ? h.window.start : '';
    this.model.reset();
    for (const o of this.older) this.model.applyMessage(o.m, { at: o.at });
    for (const f of this.ops) f();
  }

  history(h) {
    const model = this.model;
    model.reset();
    this.ops = [];
    this.older = [];
    this.earlier = h && h.window && h.window.more ? h.window.start : '';
    const seen = new Map(); // canonical JSON of a history complete message → count
    const messages = (h && h.messages) || [];
    messages.forEach((raw, i) => {
      const m = parse(raw);
      if (!m) return;
      if (isComplete(m)) {
        const k = JSON.stringify(m);
        seen.set(k, (seen.get(k) || 0) + 1);
      }
      const at = positionAt(h, i);
      this.op(() => model.applyMessage(m, { at }));
    });
    const live = h && h.live;
    let cut = null;
    if (live) {
      for (const f of live.fragments || []) {
        const m = parse(f);
        this.op(() => model.applyMessage(m));
      }
      cut = cursorSeq(live.cursor);
      this.op(() => {
        model.taskState = 'running';
      });
    }
    for (const e of this.buffer) {
      if (!e.server) {
        const p = parseEventId(e.id);
        if (cut != null && p && p.seq <= cut) continue; // already in the history or the fragments
        if (isComplete(e.data)) {
          const k = JSON.stringify(e.data);
          const n = seen.get(k) || 0;
          if (n > 0) {
            seen.set(k, n - 1);
            this.op(() => model.dropOpenFor(e.data));
            continue;
          }
        }
      }
      this.apply(e);
    }
    this.buffer = [];
    this.loaded = true;
  }
}

// hookText is one line for a hook record: "stop hook ralph: continue — go
// test fails".
export function hookText(h) {
  let s = (h.point ? h.point + ' hook ' : 'hook ') + h.name;
  if (h.decision) s += ': ' + h.decision;
  if (h.reason) s += ' — ' + h.reason;
  return s;
}

// Floe's Web App: sign-in, the live session list (/api/events) and the
// Session view (SSE + /messages through the view model). No framework:
// the view model (viewmodel.js) says what to show; this file draws it,
// redrawing only items whose rev changed and only the latest ones.

import { SessionFeed } from './viewmodel.js';
import { renderMarkdown } from './markdown.js';
import { toolSummary, toolDiff, lineCount } from './toolview.js';

const $ = (id) => document.getElementById(id);
const WINDOW = 200; // transcript items drawn at first; "Show earlier" adds more
const TAIL_TASKS = 50; // Tasks of history fetched at first; earlier pages on scroll (docs/history-window.md)

// ---- HTTP ---------------------------------------------------------------

class HTTPError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, body) {
  const init = { method, credentials: 'same-origin', headers: {} };
  if (method !== 'GET' && method !== 'DELETE') {
    // The gateway refuses a write without this type, body or not.
    init.headers['Content-Type'] = 'application/json';
  }
  if (body !== undefined) {
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  if (res.status === 401 && path !== '/api/login') {
    showSignIn();
    throw new HTTPError(401, 'unauthorized', 'Sign in first.');
  }
  if (!res.ok) {
    let code = 'http_' + res.status;
    let msg = res.statusText;
    try {
      const e = await res.json();
      code = e.error.code;
      msg = e.error.message;
    } catch {}
    throw new HTTPError(res.status, code, msg);
  }
  if (res.status === 204) return null;
  const ct = res.headers.get('Content-Type') || '';
  return ct.includes('json') ? res.json() : res.text();
}

const enc = encodeURIComponent;

// ---- sign-in --------------------------------------------------------------

let authOn = false;

function showSignIn() {
  closeEvents();
  closeSession();
  $('app-view').hidden = true;
  $('signin-view').hidden = false;
  $('signout').hidden = true;
  $('drawer-toggle').hidden = true;
  $('token').focus();
}

$('signin').addEventListener('submit', async (e) => {
  e.preventDefault();
  $('signin-error').textContent = '';
  try {
    await api('POST', '/api/login', { token: $('token').value });
    $('token').value = '';
    start();
  } catch (err) {
    $('signin-error').textContent = err.status === 401 ? 'Wrong token.' : err.message;
  }
});

$('signout').addEventListener('click', async () => {
  await api('POST', '/api/logout').catch(() => {});
  showSignIn();
});

async function start() {
  try {
    await api('GET', '/api/sessions');
  } catch {
    return; // 401 shows the sign-in form
  }
  // Does this gateway have tokens at all? An empty token is refused only then.
  authOn = await fetch('/api/login', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{"token":""}' })
    .then((r) => r.status === 401)
    .catch(() => false);
  $('signout').hidden = !authOn;
  $('signin-view').hidden = true;
  $('app-view').hidden = false;
  $('drawer-toggle').hidden = false;
  openEvents();
  route();
}

// ---- session list (/api/events) ------------------------------------------

const sessions = new Map(); // id → {session, state, status, pendingApprovals}
let events = null;
let nextSessions = null; // the snapshot being received after (re)connecting
let listSynced = false; // the first snapshot arrived: an empty list is really empty

function openEvents() {
  closeEvents();
  events = new EventSource('/api/events');
  events.addEventListener('open', () => {
    nextSessions = new Map();
  });
  events.addEventListener('server_event', (e) => {
    let ev;
    try {
      ev = JSON.parse(e.data);
    } catch {
      return;
    }
    applyListEvent(ev);
  });
  events.addEventListener('error', () => {
    if (events && events.readyState === EventSource.CLOSED) {
      const gone = events;
      const retry = () => {
        if (events !== gone) return;
        api('GET', '/api/sessions').then(
          () => events === gone && openEvents(),
          (err) => err.status !== 401 && setTimeout(retry, 2000), // 401 shows the sign-in form
        );
      };
      setTimeout(retry, 2000);
    }
  });
}

function closeEvents() {
  if (events) events.close();
  events = null;
}

function applyListEvent(ev) {
  const target = nextSessions || sessions;
  switch (ev.type) {
    case 'session_created':
      if (ev.session) target.set(ev.session.id, { session: ev.session, state: ev.session.state, status: ev.session.lastStatus || '', pendingApprovals: ev.pendingApprovals || 0 });
      break;
    case 'sessions_synced':
      if (nextSessions) {
        sessions.clear();
        for (const [k, v] of nextSessions) sessions.set(k, v);
        nextSessions = null;
      }
      listSynced = true;
      break;
    case 'session_state': {
      const s = target.get(ev.id);
      if (s) {
        s.state = ev.state;
        s.status = ev.status || '';
        s.pendingApprovals = ev.pendingApprovals || 0;
      }
      break;
    }
    case 'session_title': {
      const s = target.get(ev.id);
      if (s) s.session.title = ev.title || '';
      if (current && current.id === ev.id && current.session) current.session.title = ev.title || '';
      if (current && current.id === ev.id) drawHeader();
      break;
    }
    case 'session_deleted':
      target.delete(ev.id);
      if (current && current.id === ev.id) location.hash = '#/';
      break;
    default:
      return;
  }
  if (!nextSessions) drawSessions();
}

function displayState(s) {
  if (s.state === 'running' && s.pendingApprovals > 0) return 'waiting for approval';
  return s.state || 'idle';
}

function fmtTime(iso) {
  const d = new Date(iso);
  if (isNaN(d)) return '';
  return d.toLocaleString(undefined, { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit' });
}

let renaming = '';
let confirmingDelete = '';

function drawSessions() {
  const ul = $('sessions');
  const list = [...sessions.values()].filter((s) => !s.session.parent).sort((a, b) => b.session.createdUnixMs - a.session.createdUnixMs);
  $('sessions-loading').hidden = listSynced || list.length > 0;
  $('sessions-empty').hidden = !listSynced || list.length > 0;
  ul.replaceChildren(
    ...list.map((s) => {
      const id = s.session.id;
      const li = document.createElement('li');
      li.dataset.sessionId = id;
      li.dataset.state = displayState(s).replace(/ /g, '_');
      if (current && current.id === id) li.setAttribute('aria-current', 'page');
      if (renaming === id) {
        const f = document.createElement('form');
        f.className = 'rename';
        const input = document.createElement('input');
        input.value = s.session.title || '';
        input.setAttribute('aria-label', 'Title');
        const save = button('Save', 'submit');
        const cancel = button('Cancel', 'button', () => {
          renaming = '';
          drawSessions();
        });
        f.append(input, save, cancel);
        f.addEventListener('submit', async (e) => {
          e.preventDefault();
          try {
            await api('PATCH', '/api/sessions/' + enc(id), { title: input.value });
            s.session.title = input.value;
          } catch (err) {
            alertError(err);
          }
          renaming = '';
          drawSessions();
          if (current && current.id === id) drawHeader();
        });
        li.append(f);
        setTimeout(() => input.focus(), 0);
        return li;
      }
      const a = document.createElement('a');
      a.href = '#/s/' + enc(id);
      a.className = 'session-link';
      const title = document.createElement('span');
      title.className = 'title' + (s.session.title ? '' : ' untitled');
      title.textContent = s.session.title || 'New session';
      a.title = (s.session.title || 'New session') + (s.session.workspace ? ' — ' + s.session.workspace : '');
      const meta = document.createElement('span');
      meta.className = 'meta';
      const badge = document.createElement('span');
      badge.className = 'badge state-' + li.dataset.state;
      badge.textContent = displayState(s);
      const when = document.createElement('time');
      when.dateTime = s.session.createdAt;
      when.textContent = fmtTime(s.session.createdAt);
      meta.append(badge, ' ', when);
      const ws = baseName(s.session.workspace);
      if (ws) meta.append(' · ', ws);
      a.append(title, meta);
      const actions = document.createElement('span');
      actions.className = 'actions';
      actions.append(
        button('Rename', 'button', () => {
          renaming = id;
          drawSessions();
        }),
        confirmingDelete === id
          ? button('Confirm delete', 'button', async () => {
              confirmingDelete = '';
              try {
                await api('DELETE', '/api/sessions/' + enc(id));
              } catch (err) {
                alertError(err);
              }
              drawSessions();
            })
          : button('Delete', 'button', () => {
              confirmingDelete = id;
              drawSessions();
              setTimeout(() => {
                if (confirmingDelete === id) {
                  confirmingDelete = '';
                  drawSessions();
                }
              }, 4000);
            }),
      );
      li.append(a, actions);
      return li;
    }),
  );
}

function baseName(p) {
  const parts = String(p || '').split('/').filter(Boolean);
  return parts.length ? parts[parts.length - 1] : '';
}

function button(label, type, onClick) {
  const b = document.createElement('button');
  b.type = type;
  b.textContent = label;
  if (onClick) b.addEventListener('click', onClick);
  return b;
}

function alertError(err) {
  const p = current ? $('composer-error') : $('new-error');
  p.textContent = err.message || String(err);
}

$('new-session').addEventListener('click', () => {
  const f = $('new-form');
  f.hidden = !f.hidden;
  $('new-session').setAttribute('aria-expanded', String(!f.hidden));
  if (!f.hidden) f.elements.model.focus();
});
$('new-cancel').addEventListener('click', () => {
  $('new-form').hidden = true;
  $('new-session').setAttribute('aria-expanded', 'false');
});
$('new-form').addEventListener('submit', async (e) => {
  e.preventDefault();
  const f = e.target;
  $('new-error').textContent = '';
  const body = { approvalMode: f.elements.approvalMode.value };
  if (f.elements.model.value.trim()) body.model = f.elements.model.value.trim();
  if (f.elements.workspace.value.trim()) body.workspace = f.elements.workspace.value.trim();
  const mt = parseInt(f.elements.maxTurns.value, 10);
  if (mt > 0) body.maxTurns = mt;
  try {
    const s = await api('POST', '/api/sessions', body);
    sessions.set(s.id, { session: s, state: s.state, status: '', pendingApprovals: 0 });
    f.hidden = true;
    $('new-session').setAttribute('aria-expanded', 'false');
    location.hash = '#/s/' + enc(s.id);
  } catch (err) {
    $('new-error').textContent = err.message;
  }
});

// ---- the Session view -----------------------------------------------------

let current = null; // {id, feed, es, session, cache, limit}

function route() {
  const m = /^#\/s\/(.+)$/.exec(location.hash);
  const id = m ? decodeURIComponent(m[1]) : '';
  if (!id) {
    closeSession();
    $('session-view').hidden = true;
    $('empty-view').hidden = false;
    drawSessions();
    return;
  }
  closeDrawer();
  if (current && current.id === id) return;
  openSession(id);
  drawSessions();
}
window.addEventListener('hashchange', route);

function closeSession() {
  if (!current) return;
  if (current.es) current.es.close();
  current.closed = true;
  current = null;
}

function openSession(id) {
  closeSession();
  const c = {
    id, feed: new SessionFeed(), es: null, session: null, cache: new Map(), limit: WINDOW, closed: false, fetching: false,
    stick: true, // follow the bottom until the person scrolls up
    seenApprovals: new Set(),
  };
  current = c;
  $('empty-view').hidden = true;
  $('session-view').hidden = false;
  $('transcript').replaceChildren();
  $('transcript').dataset.ready = 'false';
  $('transcript-loading').hidden = false;
  $('approval-bar').hidden = true;
  $('jump-latest').hidden = true;
  endTitleEdit();
  $('composer-error').textContent = '';
  c.t0 = performance.now();
  api('GET', '/api/sessions/' + enc(id))
    .then((s) => {
      c.session = s;
      drawHeader();
    })
    .catch((err) => {
      if (err.status === 404) {
        $('s-title').textContent = 'Session not found';
        $('transcript-loading').hidden = true;
      }
    });
  connect(c, '');
  drawTraces(c);
}

// connect opens the Session's SSE stream. The first connection of a view
// fetches /messages once the stream is open (connect first, then history);
// a later one resumes from the last event id, which the gateway replays.
function connect(c, lastEventId) {
  const url = '/api/sessions/' + enc(c.id) + '/stream' + (lastEventId ? '?lastEventId=' + enc(lastEventId) : '');
  const es = new EventSource(url);
  c.es = es;
  const onEvent = (server) => (e) => {
    if (c.closed) return;
    // An id-less event (snapshot, resync) repeats the previous id here,
    // which keeps lastEventId a real stream position.
    const r = c.feed.event({ id: e.lastEventId, server, data: e.data, receivedAt: Date.now() });
    if (r === 'resync') loadHistory(c);
    schedule(c);
  };
  es.addEventListener('message', onEvent(false));
  es.addEventListener('server_event', onEvent(true));
  es.addEventListener('open', () => {
    setConn('');
    if (!c.feed.loaded && !c.fetching) loadHistory(c);
  });
  es.addEventListener('error', () => {
    if (c.closed) return;
    setConn('Reconnecting…');
    if (es.readyState === EventSource.CLOSED) {
      // The browser gave up (an HTTP error while the gateway restarted):
      // reconnect ourselves from the last event seen.
      setTimeout(() => reconnect(c, es), 1000);
    }
  });
}

// reconnect opens the stream again once the gateway answers: a 401 shows
// the sign-in form instead, a 404 (deleted) leaves the view.
function reconnect(c, es) {
  if (c.closed || c.es !== es) return;
  api('GET', '/api/sessions/' + enc(c.id))
    .then(() => {
      if (!c.closed && c.es === es) connect(c, c.feed.lastEventId);
    })
    .catch((err) => {
      if (err.status === 401 || c.closed) return;
      if (err.status === 404) {
        location.hash = '#/';
        return;
      }
      setTimeout(() => reconnect(c, es), 2000);
    });
}

function setConn(text) {
  $('conn').textContent = text;
}

async function loadHistory(c) {
  c.fetching = true;
  const gen = c.feed.resyncs; // a resync meanwhile makes this answer stale
  try {
    const h = await api('GET', '/api/sessions/' + enc(c.id) + '/messages?tailTasks=' + TAIL_TASKS);
    if (c.closed) return;
    if (!c.feed.loaded && gen === c.feed.resyncs) {
      const t1 = performance.now();
      c.feed.history(h);
      const log = $('transcript');
      log.dataset.fetchMs = String(Math.round(t1 - c.t0));
      log.dataset.foldMs = String(Math.round(performance.now() - t1));
      c.cache.clear();
      $('transcript').replaceChildren();
    }
    c.loadedAt = performance.now();
  } catch (err) {
    if (!c.closed) setTimeout(() => !c.closed && !c.feed.loaded && loadHistory(c), 1000);
  } finally {
    c.fetching = false;
  }
  schedule(c);
}

// loadEarlier fetches the page of TAIL_TASKS Tasks before what the view
// holds and puts it first, keeping what is on screen where it is.
async function loadEarlier(c) {
  const before = c.feed.earlier;
  if (!before || c.fetchingEarlier || !c.feed.loaded) return;
  c.fetchingEarlier = true;
  const gen = c.feed.resyncs;
  try {
    const h = await api('GET', '/api/sessions/' + enc(c.id) + '/messages?tailTasks=' + TAIL_TASKS + '&before=' + enc(before));
    if (c.closed || gen !== c.feed.resyncs || c.feed.earlier !== before) return;
    const shown = c.feed.model.items.length;
    c.feed.prepend(h);
    c.limit += Math.max(0, c.feed.model.items.length - shown);
    const log = $('transcript');
    const fromBottom = log.scrollHeight - log.scrollTop;
    // The Transcript was built again: its items have new keys.
    c.cache.clear();
    log.replaceChildren();
    draw(c);
    log.scrollTop = log.scrollHeight - fromBottom;
  } catch (err) {
    // the next scroll to the top asks again
  } finally {
    c.fetchingEarlier = false;
  }
}

let frame = 0;
function schedule(c) {
  if (frame || c !== current) return;
  frame = requestAnimationFrame(() => {
    frame = 0;
    if (current === c) draw(c);
  });
}

function drawHeader() {
  const c = current;
  if (!c) return;
  const s = c.session;
  const entry = sessions.get(c.id);
  const title = (entry && entry.session.title) || (s && s.title) || '';
  $('s-title').textContent = title || 'New session';
  $('s-title').title = c.id;
  document.title = (title || 'New session') + ' — Floe';
  $('s-model').textContent = s ? s.model + ' · ' + s.approvalMode + (s.workspace ? ' · ' + s.workspace : '') + sandboxLabel(s.sandbox) : '';
  drawForkedFrom(s && s.forkedFrom);
}

// drawForkedFrom links a fork's header to its parent (protocol.md §3: the fork
// route; GET shows forkedFrom {sessionId, seq}).
function drawForkedFrom(f) {
  const el = $('s-forked');
  el.textContent = '';
  el.hidden = !f;
  if (!f) return;
  const a = document.createElement('a');
  a.href = '#/s/' + enc(f.sessionId);
  a.textContent = f.sessionId;
  el.append('forked from ', a, f.record != null ? ' after record ' + f.record : ' at ' + f.seq);
}

// The header's Fork: a new Session with this one's history so far (a
// running Task is cut where it is, as an interrupt would leave it).
$('fork-session').addEventListener('click', () => {
  if (current) forkFrom(current, {});
});

// sandboxLabel shows the tool confinement the runners report (protocol.md §7);
// tools running unconfined say so plainly.
function sandboxLabel(sb) {
  if (!sb) return '';
  if (sb.backend === 'off') return ' · tools UNCONFINED';
  return ' · sandbox ' + sb.backend + (sb.network === 'off' ? ', network off' : '');
}

// ---- the title, editable in the header -----------------------------------------

function endTitleEdit() {
  $('title-form').hidden = true;
  $('s-title').hidden = false;
  $('edit-title').hidden = false;
}

$('edit-title').addEventListener('click', () => {
  const c = current;
  if (!c) return;
  const entry = sessions.get(c.id);
  $('title-input').value = (entry && entry.session.title) || (c.session && c.session.title) || '';
  $('s-title').hidden = true;
  $('edit-title').hidden = true;
  $('title-form').hidden = false;
  $('title-input').focus();
  $('title-input').select();
});
$('title-cancel').addEventListener('click', endTitleEdit);
$('title-input').addEventListener('keydown', (e) => {
  if (e.key === 'Escape') {
    e.preventDefault();
    e.stopPropagation();
    endTitleEdit();
  }
});
$('title-form').addEventListener('submit', async (e) => {
  e.preventDefault();
  const c = current;
  if (!c) return;
  const title = $('title-input').value.trim();
  try {
    const s = await api('PATCH', '/api/sessions/' + enc(c.id), { title });
    if (c.session) c.session.title = s.title;
    const entry = sessions.get(c.id);
    if (entry) entry.session.title = s.title;
    endTitleEdit();
    drawHeader();
    drawSessions();
  } catch (err) {
    alertError(err);
  }
});

function draw(c) {
  const m = c.feed.model;
  const log = $('transcript');
  drawHeader();
  const st = m.approvals.size > 0 && m.taskState === 'running' ? 'waiting for approval' : m.taskState;
  $('s-state').textContent = st;
  $('s-state').className = 'badge state-' + st.replace(/ /g, '_');
  $('stop').disabled = m.taskState === 'idle';
  $('compact').disabled = m.taskState !== 'idle';
  $('send').textContent = 'Send';
  $('message').placeholder = m.taskState === 'idle' ? 'Send a Task…' : 'Steer the running Task…';
  const u = m.usage;
  $('s-usage').textContent = u && u.session ? 'tokens: ' + (u.session.total ?? 0) + ' total · ' + (u.session.output ?? 0) + ' out' + (u.request ? ' · last request ' + (u.request.total ?? 0) : '') : '';
  if (c.lastState !== m.taskState) {
    if (m.taskState === 'idle' && c.lastState) drawTraces(c);
    c.lastState = m.taskState;
  }

  const items = m.items;
  const from = Math.max(0, items.length - c.limit);
  $('show-earlier').hidden = from === 0 && !c.feed.earlier;
  $('show-earlier').textContent = from > 0 ? 'Show earlier (' + from + ')' : 'Show earlier Tasks';
  drawList(log, items.slice(from), c.cache, c);
  followOutputs(log);
  if (c.feed.loaded && log.dataset.ready !== 'true') {
    log.dataset.ready = 'true';
    log.dataset.loadMs = String(Math.round(performance.now() - c.t0));
    $('transcript-loading').hidden = true;
    c.stick = true;
  }
  if (c.stick) toBottom(log);
  revealNewApprovals(c, log);
  drawFloaters(c);
}

// ---- following the bottom --------------------------------------------------------
//
// c.stick says the view follows the latest output: true on open, on send
// and after "Jump to latest"; a scroll that leaves the bottom (only the
// person's: ours always end there) clears it, and reaching the bottom
// again sets it. Every draw then scrolls to the bottom while it holds.

const NEAR_BOTTOM = 40; // px from the bottom that still count as "at the bottom"

function atBottom(el) {
  return el.scrollHeight - el.scrollTop - el.clientHeight < NEAR_BOTTOM;
}

function toBottom(log) {
  log.scrollTop = log.scrollHeight;
}

$('transcript').addEventListener('scroll', () => {
  const c = current;
  if (!c || $('transcript').dataset.ready !== 'true') return;
  c.stick = atBottom($('transcript'));
  drawFloaters(c);
}, { passive: true });

// Content that grows without a redraw (an image decoding, a card opened)
// keeps the bottom in view while following.
new ResizeObserver(() => {
  const c = current;
  if (c && c.stick && $('transcript').dataset.ready === 'true') toBottom($('transcript'));
}).observe($('transcript'));
$('transcript').addEventListener('load', (e) => {
  const c = current;
  if (c && c.stick && e.target.tagName === 'IMG') toBottom($('transcript'));
}, true);

function jumpToLatest() {
  const c = current;
  if (!c) return;
  c.stick = true;
  toBottom($('transcript'));
  drawFloaters(c);
}
$('jump-latest').addEventListener('click', jumpToLatest);

// visibleIn reports whether el's box is (mostly) inside the scroller's.
function visibleIn(el, scroller) {
  const r = el.getBoundingClientRect();
  const v = scroller.getBoundingClientRect();
  if (r.width === 0 && r.height === 0) return false;
  return r.top >= v.top - 1 && r.bottom <= v.bottom + 1;
}

// revealNewApprovals brings an approval that just arrived into view when
// the view follows the output (it is usually the last card, already in
// view at the bottom; a parallel call's or a subagent's may sit higher).
function revealNewApprovals(c, log) {
  for (const [k, t] of c.feed.model.approvals) {
    if (c.seenApprovals.has(k)) continue;
    c.seenApprovals.add(k);
    if (!c.stick) continue;
    const el = approvalElement(t.toolCallId);
    if (el && !visibleIn(el, log)) el.scrollIntoView({ block: 'nearest' });
  }
}

function approvalElement(toolCallId) {
  return document.querySelector('#transcript li[data-kind=tool][data-tool-call-id="' + CSS.escape(toolCallId) + '"] .approval');
}

// drawFloaters shows "Jump to latest" when the view does not follow, and
// the approval bar when a pending approval is out of view.
function drawFloaters(c) {
  const log = $('transcript');
  $('jump-latest').hidden = c.stick || !c.feed.loaded;
  const pending = [...c.feed.model.approvals.values()];
  const hidden = pending.filter((t) => {
    const el = approvalElement(t.toolCallId);
    return !el || !visibleIn(el, log);
  });
  const bar = $('approval-bar');
  if (hidden.length === 0) {
    bar.hidden = true;
    return;
  }
  const t = hidden[0];
  const sum = toolSummary(t.name, t.args);
  $('approval-bar-text').textContent = (pending.length > 1 ? pending.length + ' approvals needed: ' : 'Approval needed: ') + (t.name || 'tool') + (sum ? ' ' + sum : '');
  bar.dataset.toolCallId = t.toolCallId;
  bar.hidden = false;
}

$('approval-bar-show').addEventListener('click', () => {
  const c = current;
  if (!c) return;
  const id = $('approval-bar').dataset.toolCallId;
  let el = id && approvalElement(id);
  if (!el) {
    // Drawn further up than the window of items: draw them all.
    c.limit = Math.max(c.limit, c.feed.model.items.length);
    draw(c);
    el = id && approvalElement(id);
  }
  if (!el) return;
  el.closest('details').open = true;
  el.scrollIntoView({ block: 'center' });
  c.stick = atBottom($('transcript'));
  el.querySelector('button')?.focus({ preventScroll: true });
  drawFloaters(c);
});

// followOutputs scrolls the tool outputs that follow their tail (drawn
// anew this frame) to their end, and puts back where the person left the
// others.
function followOutputs(log) {
  for (const pre of log.querySelectorAll('pre.output[data-follow]')) {
    if (pre.dataset.follow === 'tail') pre.scrollTop = pre.scrollHeight;
    else pre.scrollTop = Number(pre.dataset.follow) || 0;
    delete pre.dataset.follow;
  }
}

$('show-earlier').addEventListener('click', () => {
  if (!current) return;
  if (current.feed.model.items.length <= current.limit) {
    loadEarlier(current);
    return;
  }
  current.limit += WINDOW;
  draw(current);
});

// Scrolled to the top with everything fetched drawn: fetch the page before.
$('transcript').addEventListener('scroll', () => {
  const c = current;
  if (c && $('transcript').scrollTop < NEAR_BOTTOM && c.feed.model.items.length <= c.limit) loadEarlier(c);
}, { passive: true });

// drawList makes container's children the elements of items, in order,
// (re)building only the items whose rev changed.
function drawList(container, items, cache, c) {
  const keep = new Set();
  let prev = null;
  for (const it of items) {
    keep.add(it.key);
    let ent = cache.get(it.key);
    if (!ent || ent.rev !== it.rev || ent.kind !== it.kind) {
      const el = withForkHere(drawItem(it, c, ent && ent.el), it, c);
      if (ent && ent.el !== el) ent.el.replaceWith(el);
      ent = { el, rev: it.rev, kind: it.kind };
      cache.set(it.key, ent);
    }
    const want = prev ? prev.nextSibling : container.firstChild;
    if (want !== ent.el) container.insertBefore(ent.el, want);
    prev = ent.el;
  }
  for (const [k, ent] of cache) {
    if (!keep.has(k)) {
      ent.el.remove();
      cache.delete(k);
    }
  }
}

function li(kind) {
  const e = document.createElement('li');
  e.dataset.kind = kind;
  return e;
}

function text(tag, cls, t) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  e.textContent = t;
  return e;
}

// The kinds of items a fork "from here" is offered on.
const FORKABLE = new Set(['user', 'text', 'thinking', 'tool']);

// withForkHere adds "Fork from here" to an item of the Session's own
// transcript that knows its cut (item.forkAt: its /messages position or
// its SSE id, protocol.md §3 the fork route).
function withForkHere(el, it, c) {
  if (!it.forkAt || it.streaming || !FORKABLE.has(it.kind) || it.lv !== c.feed.model.root) return el;
  // The label is drawn by CSS (like Copy's), so the message's text stays
  // its own.
  const b = button('', 'button', (ev) => {
    ev.stopPropagation();
    forkFrom(c, it.forkAt);
  });
  b.className = 'fork-here';
  b.dataset.label = 'Fork from here';
  b.setAttribute('aria-label', 'Fork from here');
  b.title = 'A new Session whose history ends with this message';
  el.append(b);
  return el;
}

// forkFrom forks the Session at cut ({} for everything so far) and opens
// the fork.
async function forkFrom(c, cut) {
  try {
    const s = await api('POST', '/api/sessions/' + enc(c.id) + '/fork', cut);
    sessions.set(s.id, { session: s, state: s.state, status: '', pendingApprovals: 0 });
    location.hash = '#/s/' + enc(s.id);
  } catch (e) {
    alert('Could not fork: ' + (e && e.message ? e.message : e));
  }
}

function drawItem(it, c, old) {
  switch (it.kind) {
    case 'user': {
      const e = li('user');
      if (it.steering) e.dataset.steering = 'true';
      // A text the harness wrote (a hook's context or continue input).
      if (it.sender === 'harness') e.dataset.sender = 'harness';
      const who = it.sender === 'harness' ? 'Harness (hook)' : it.steering ? 'You (steering)' : 'You';
      e.append(text('div', 'who', who), text('div', 'body plain', it.text));
      return e;
    }
    case 'text': {
      const e = li('text');
      if (it.streaming) e.dataset.streaming = 'true';
      const body = document.createElement('div');
      body.className = 'body md';
      body.append(renderMarkdown(document, it.text));
      e.append(body);
      if (!it.streaming && it.text) {
        const tools = document.createElement('div');
        tools.className = 'msg-tools';
        const copy = copyButton('message');
        copy.setAttribute('aria-label', 'Copy message');
        copyTexts.set(copy, it.text);
        tools.append(copy);
        e.append(tools);
      }
      return e;
    }
    case 'thinking': {
      const e = li('thinking');
      const d = document.createElement('details');
      if (old && old.querySelector('details')?.open) d.open = true;
      d.append(text('summary', '', it.streaming ? 'Thinking…' : 'Thought'), text('div', 'body plain', it.text));
      e.append(d);
      return e;
    }
    case 'tool':
      return drawTool(it, c, old);
    case 'subagent':
      return drawSubagent(it, c, old);
    case 'retry': {
      const e = li('retry');
      e.dataset.active = String(it.active);
      const msg = 'Request failed (' + it.status + (it.error ? ': ' + it.error : '') + ')' + (it.attempt ? ', attempt ' + it.attempt : '') + '. ';
      const span = text('span', 'msg', msg);
      e.append(span);
      if (it.active) {
        const cd = text('span', 'countdown', '');
        cd.dataset.deadline = String(it.deadline);
        tickOne(cd);
        e.append(cd, ' ');
        e.append(
          button('Retry now', 'button', async () => {
            try {
              await api('POST', '/api/sessions/' + enc(c.id) + '/retry-now');
            } catch (err) {
              alertError(err);
            }
          }),
        );
      } else e.append(text('span', 'muted', 'Retried.'));
      return e;
    }
    case 'compaction': {
      const e = li('compaction');
      e.dataset.status = it.status;
      const what = 'Compaction (' + [it.reason, it.mode].filter(Boolean).join(', ') + ')';
      const st = it.status === 'running' ? 'compacting…' : it.status === 'completed' ? 'done' : it.status + (it.error ? ': ' + it.error : '');
      if (it.summary) {
        const d = document.createElement('details');
        d.append(text('summary', '', what + ' — ' + st), text('div', 'body plain', it.summary));
        e.append(d);
      } else e.append(text('span', '', what + ' — ' + st));
      return e;
    }
    case 'notice': {
      const e = li('notice');
      e.dataset.notice = it.notice || '';
      e.append(text('span', '', it.text));
      return e;
    }
    default:
      return li(it.kind);
  }
}

const STATUS_LABEL = {
  streaming: 'preparing', pending: 'pending', waiting: 'waiting for approval', running: 'running',
  done: 'done', failed: 'failed', denied: 'denied', forbidden: 'forbidden', interrupted: 'interrupted',
};

function prettyArgs(s) {
  try {
    return JSON.stringify(JSON.parse(s), null, 2);
  } catch {
    return s;
  }
}

function drawTool(t, c, old) {
  const e = li('tool');
  e.dataset.toolCallId = t.toolCallId;
  e.dataset.status = t.status;
  if (t.decision) e.dataset.decision = t.decision;
  const d = document.createElement('details');
  const wasOpen = old && old.querySelector(':scope > details');
  d.open = wasOpen ? wasOpen.open : t.status !== 'done' || t.name === 'run_subagent';
  const sum = document.createElement('summary');
  const st = text('span', 'status', STATUS_LABEL[t.status] || t.status);
  if (t.status === 'running' && t.startedAt) {
    st.dataset.since = String(t.startedAt);
    tickOne(st);
  }
  sum.append(text('span', 'tool-name', t.name || 'tool'));
  const line = toolSummary(t.name, t.args);
  if (line) {
    const ls = text('span', 'tool-summary', line);
    ls.title = line;
    sum.append(ls);
  }
  sum.append(st);
  if (t.decision) {
    let label = t.decision === 'allow' ? 'allowed' : t.decision === 'deny' ? 'denied' : 'forbidden by policy';
    if (t.decision === 'deny' && t.deniedBy) label = 'denied by the ' + t.deniedBy.name + ' hook';
    sum.append(text('span', 'decision decision-' + t.decision, label));
  }
  d.append(sum);
  if (t.deniedBy) {
    const hd = text('div', 'hook-denial', 'Denied by the ' + t.deniedBy.name + ' hook' + (t.deniedBy.reason ? ': ' + t.deniedBy.reason : '.'));
    hd.dataset.hook = t.deniedBy.name;
    d.append(hd);
  }
  const diff = t.argsDone ? toolDiff(t.name, t.args) : null;
  if (diff) {
    d.append(drawDiff(diff));
    const raw = document.createElement('details');
    raw.className = 'raw-args';
    raw.append(text('summary', '', 'Arguments'), text('pre', 'args', prettyArgs(t.args)));
    d.append(raw);
  } else d.append(text('pre', 'args', prettyArgs(t.args)));
  if (t.awaitingApproval) {
    const ap = document.createElement('div');
    ap.className = 'approval';
    ap.setAttribute('role', 'group');
    ap.setAttribute('aria-label', 'Approve ' + (t.name || 'tool call'));
    // scope 'session': the tool is allowed for the rest of the Session,
    // stored with it (the engine asks no more, whichever client runs).
    const decide = (decision, scope) => async () => {
      ap.querySelectorAll('button').forEach((b) => (b.disabled = true));
      try {
        const body = scope ? { decision, scope } : { decision };
        await api('POST', '/api/sessions/' + enc(c.id) + '/approvals/' + enc(t.toolCallId), body);
        c.feed.model.markDecided(t.path, t.toolCallId);
        schedule(c);
      } catch (err) {
        alertError(err);
        ap.querySelectorAll('button').forEach((b) => (b.disabled = false));
      }
    };
    const always = button('Allow for this Session', 'button', decide('allow', 'session'));
    always.title = 'Allow ' + (t.name || 'this tool') + ' now and for the rest of this Session';
    ap.append(button('Allow', 'button', decide('allow')), always, button('Deny', 'button', decide('deny')));
    d.append(ap);
  }
  if (t.output || t.outputDone) {
    const head = document.createElement('div');
    head.className = 'output-head';
    const n = lineCount(t.output);
    head.append(text('span', 'line-count', n === 1 ? '1 line' : n + ' lines'));
    const copy = copyButton('output');
    copy.setAttribute('aria-label', 'Copy output');
    copyTexts.set(copy, t.output);
    head.append(copy);
    const pre = text('pre', 'output', t.output);
    // A running output follows its tail unless the person scrolled it up.
    const oldPre = old && old.querySelector(':scope > details > pre.output');
    pre.dataset.follow = !oldPre || atBottom(oldPre) ? 'tail' : String(oldPre.scrollTop);
    d.append(head, pre);
  }
  if (t.images && t.images.length) {
    const box = document.createElement('div');
    box.className = 'tool-images';
    t.images.forEach((src, i) => {
      const img = document.createElement('img');
      img.src = src; // data:image/* only (viewmodel imagesOf)
      img.alt = 'Image ' + (i + 1) + ' from ' + (t.name || 'the tool');
      img.loading = 'lazy';
      box.append(img);
    });
    d.append(box);
  }
  if (t.child) {
    const ol = document.createElement('ol');
    ol.className = 'nested';
    ol.append(drawSubagent(t.child, c, old && old.querySelector('[data-kind="subagent"]')));
    d.append(ol);
  }
  e.append(d);
  return e;
}

// drawDiff shows an edit_file or write_file call as a line diff.
function drawDiff(diff) {
  const box = document.createElement('div');
  box.className = 'diff';
  box.setAttribute('role', 'figure');
  box.setAttribute('aria-label', 'Changes to ' + (diff.path || 'the file'));
  const adds = diff.lines.filter((l) => l.op === '+').length;
  const dels = diff.lines.filter((l) => l.op === '-').length;
  box.append(text('div', 'diff-head', (diff.path || '') + '  +' + adds + ' −' + dels + (diff.replaceAll ? ' (every occurrence)' : '')));
  for (const l of diff.lines) {
    const row = text('div', 'diff-line ' + (l.op === '+' ? 'add' : l.op === '-' ? 'del' : 'ctx'), l.text);
    row.dataset.op = l.op;
    box.append(row);
  }
  return box;
}

function drawSubagent(card, c, old) {
  const e = li('subagent');
  e.dataset.sessionId = card.sessionId;
  e.dataset.status = card.status;
  const d = document.createElement('details');
  const wasOpen = old && old.querySelector(':scope > details');
  d.open = wasOpen ? wasOpen.open : true;
  d.append(text('summary', '', 'Subagent ' + card.sessionId + ' — ' + card.status));
  const ol = document.createElement('ol');
  ol.className = 'transcript nested-log';
  ol.setAttribute('role', 'log');
  ol.setAttribute('aria-label', 'Subagent transcript');
  if (!card.cache) card.cache = new Map();
  drawList(ol, card.level.items, card.cache, c);
  d.append(ol);
  e.append(d);
  return e;
}

// Elapsed times and countdowns tick once a second without a redraw.
function tickOne(el) {
  const now = Date.now();
  if (el.dataset.since) el.textContent = 'running ' + Math.max(0, Math.round((now - Number(el.dataset.since)) / 1000)) + 's';
  if (el.dataset.deadline) {
    const left = Math.max(0, Math.ceil((Number(el.dataset.deadline) - now) / 1000));
    el.textContent = left > 0 ? 'Retrying in ' + left + 's.' : 'Retrying…';
  }
}
setInterval(() => {
  document.querySelectorAll('[data-since],[data-deadline]').forEach(tickOne);
}, 1000);

async function drawTraces(c) {
  try {
    const r = await api('GET', '/api/sessions/' + enc(c.id) + '/traces');
    if (c !== current) return;
    const box = $('s-traces');
    box.replaceChildren(
      ...(r.traces || []).map((t) => {
        const a = document.createElement('a');
        a.href = '/api/sessions/' + enc(c.id) + '/traces/' + t.index;
        a.download = t.name;
        a.textContent = 'Trace ' + t.index;
        a.title = 'Download ' + t.name + ' (' + t.size + ' bytes)';
        return a;
      }),
    );
  } catch {}
}

// ---- copy buttons ---------------------------------------------------------------

const copyTexts = new WeakMap(); // a Copy button → the text it copies

async function copyText(t) {
  try {
    await navigator.clipboard.writeText(t);
    return true;
  } catch {
    // No clipboard API (plain http off loopback): the old way.
    const ta = document.createElement('textarea');
    ta.value = t;
    ta.setAttribute('readonly', '');
    ta.style.position = 'fixed';
    ta.style.opacity = '0';
    document.body.append(ta);
    ta.select();
    let ok = false;
    try {
      ok = document.execCommand('copy');
    } catch {}
    ta.remove();
    return ok;
  }
}

document.addEventListener('click', async (e) => {
  const b = e.target.closest && e.target.closest('button[data-copy]');
  if (!b) return;
  e.preventDefault();
  let t = copyTexts.get(b);
  if (t === undefined && b.dataset.copy === 'code') t = (b.closest('.code-block')?.querySelector('pre')?.textContent ?? '').replace(/\n$/, '');
  const ok = await copyText(t ?? '');
  b.dataset.label = ok ? 'Copied' : 'Copy failed';
  setTimeout(() => (b.dataset.label = 'Copy'), 1500);
});

// copyButton makes a Copy button; its label is drawn by CSS from
// data-label, so it never joins the text of what it copies.
function copyButton(what) {
  const b = document.createElement('button');
  b.type = 'button';
  b.className = 'copy';
  b.dataset.copy = what;
  b.dataset.label = 'Copy';
  return b;
}

// ---- the list as a drawer on narrow screens ------------------------------------

function closeDrawer() {
  document.body.classList.remove('drawer-open');
  $('drawer-toggle').setAttribute('aria-expanded', 'false');
}
$('drawer-toggle').addEventListener('click', () => {
  const open = document.body.classList.toggle('drawer-open');
  $('drawer-toggle').setAttribute('aria-expanded', String(open));
});
$('scrim').addEventListener('click', closeDrawer);

// ---- keys ------------------------------------------------------------------------

document.addEventListener('keydown', (e) => {
  if (e.key !== 'Escape' || e.defaultPrevented) return;
  if (document.body.classList.contains('drawer-open')) {
    closeDrawer();
    return;
  }
  if (e.target.closest && e.target.closest('form.rename, #title-form, #new-form')) return;
  if (current && current.feed.model.taskState !== 'idle') {
    e.preventDefault();
    stopTask();
  }
});

// ---- composer ---------------------------------------------------------------

$('composer').addEventListener('submit', async (e) => {
  e.preventDefault();
  const c = current;
  if (!c) return;
  const msg = $('message').value;
  if (!msg.trim()) return;
  $('composer-error').textContent = '';
  const running = c.feed.model.taskState !== 'idle';
  c.stick = true; // what was sent and its answer come into view
  toBottom($('transcript'));
  try {
    if (running) await api('POST', '/api/sessions/' + enc(c.id) + '/steer', { text: msg });
    else await api('POST', '/api/sessions/' + enc(c.id) + '/tasks', { input: [{ type: 'text', text: msg }] });
    $('message').value = '';
  } catch (err) {
    if (err.code === 'not_running') {
      // The Task ended meanwhile: send it as a new Task.
      try {
        await api('POST', '/api/sessions/' + enc(c.id) + '/tasks', { input: [{ type: 'text', text: msg }] });
        $('message').value = '';
        return;
      } catch (err2) {
        err = err2;
      }
    }
    $('composer-error').textContent = err.message;
  }
});

$('message').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $('composer').requestSubmit();
  }
});

async function stopTask() {
  if (!current) return;
  try {
    await api('POST', '/api/sessions/' + enc(current.id) + '/abort');
  } catch (err) {
    alertError(err);
  }
}
$('stop').addEventListener('click', stopTask);

$('compact').addEventListener('click', async () => {
  if (!current) return;
  $('composer-error').textContent = '';
  try {
    await api('POST', '/api/sessions/' + enc(current.id) + '/compact');
  } catch (err) {
    alertError(err);
  }
});

// A page left for another (or frozen in the back/forward cache) lets go
// of its two SSE connections: browsers allow only six per host over
// HTTP/1.1. Coming back reconnects, resuming from the last event seen.
window.addEventListener('pagehide', () => {
  closeEvents();
  if (current && current.es) current.es.close();
});
window.addEventListener('pageshow', (e) => {
  if (!e.persisted) return;
  openEvents();
  if (current) connect(current, current.feed.lastEventId);
});

start();

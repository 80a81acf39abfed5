// What a tool card shows besides its raw arguments: a one-line summary for
// the collapsed card (the command, the path) and, for edit_file and
// write_file, a line diff. Pure (node --test covers it).

function parseArgs(args) {
  if (args && typeof args === 'object') return args;
  try {
    const v = JSON.parse(args);
    return v && typeof v === 'object' ? v : null;
  } catch {
    return null;
  }
}

const oneLine = (s, max = 120) => {
  const t = String(s).replace(/\s+/g, ' ').trim();
  return t.length > max ? t.slice(0, max - 1) + '…' : t;
};

// toolSummary returns the line a collapsed card shows after the tool's
// name: exec_command's cmd, the file tools' path, a subagent's prompt,
// else the first short string argument; '' when there is none (or the
// arguments are still streaming and do not parse yet).
export function toolSummary(name, args) {
  const a = parseArgs(args);
  if (!a) return '';
  switch (name) {
    case 'exec_command':
      return a.cmd ? '$ ' + oneLine(a.cmd) : '';
    case 'read_file':
    case 'write_file':
    case 'edit_file':
      return a.file_path ? oneLine(a.file_path) : '';
    case 'run_subagent':
      return a.prompt ? oneLine(a.prompt) : '';
  }
  for (const k of ['file_path', 'path', 'cmd', 'command', 'url', 'query', 'pattern', 'prompt']) {
    if (typeof a[k] === 'string' && a[k]) return oneLine(a[k]);
  }
  for (const v of Object.values(a)) {
    if (typeof v === 'string' && v) return oneLine(v);
  }
  return '';
}

// MAX_DIFF_CELLS bounds the LCS table (lines × lines); beyond it the
// diff is every old line removed and every new line added.
const MAX_DIFF_CELLS = 4_000_000;

const splitLines = (s) => {
  if (s === '') return [];
  const l = String(s).split('\n');
  if (l[l.length - 1] === '') l.pop();
  return l;
};

// lineDiff returns the lines of a → b as [{op: ' '|'-'|'+', text}], the
// longest common subsequence kept as context.
export function lineDiff(a, b) {
  const x = splitLines(a);
  const y = splitLines(b);
  // Common head and tail first: most edits touch a few lines.
  let head = 0;
  while (head < x.length && head < y.length && x[head] === y[head]) head++;
  let tail = 0;
  while (tail < x.length - head && tail < y.length - head && x[x.length - 1 - tail] === y[y.length - 1 - tail]) tail++;
  const xs = x.slice(head, x.length - tail);
  const ys = y.slice(head, y.length - tail);
  const out = x.slice(0, head).map((text) => ({ op: ' ', text }));
  const n = xs.length;
  const m = ys.length;
  if (n * m > MAX_DIFF_CELLS) {
    for (const text of xs) out.push({ op: '-', text });
    for (const text of ys) out.push({ op: '+', text });
  } else {
    const L = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
    for (let i = n - 1; i >= 0; i--) {
      for (let j = m - 1; j >= 0; j--) L[i][j] = xs[i] === ys[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
    }
    let i = 0;
    let j = 0;
    while (i < n && j < m) {
      if (xs[i] === ys[j]) {
        out.push({ op: ' ', text: xs[i++] });
        j++;
      } else if (L[i + 1][j] >= L[i][j + 1]) out.push({ op: '-', text: xs[i++] });
      else out.push({ op: '+', text: ys[j++] });
    }
    while (i < n) out.push({ op: '-', text: xs[i++] });
    while (j < m) out.push({ op: '+', text: ys[j++] });
  }
  for (const text of x.slice(x.length - tail)) out.push({ op: ' ', text });
  return out;
}

// toolDiff returns {path, lines} for an edit_file or write_file call whose
// arguments parse, else null. write_file shows its content as added lines.
export function toolDiff(name, args) {
  if (name !== 'edit_file' && name !== 'write_file') return null;
  const a = parseArgs(args);
  if (!a) return null;
  if (name === 'edit_file') {
    if (typeof a.old_string !== 'string' || typeof a.new_string !== 'string') return null;
    return { path: String(a.file_path || ''), lines: lineDiff(a.old_string, a.new_string), replaceAll: !!a.replace_all };
  }
  if (typeof a.content !== 'string') return null;
  return { path: String(a.file_path || ''), lines: lineDiff('', a.content), replaceAll: false };
}

// lineCount is the number of lines of a tool output as a person counts
// them (a trailing newline does not start one).
export function lineCount(s) {
  return splitLines(s || '').length;
}

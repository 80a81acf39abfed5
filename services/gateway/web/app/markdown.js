// A small, safe Markdown renderer for model output.
//
// parseMarkdown(text) is pure: it returns a tree of blocks and inlines.
// renderMarkdown(doc, text) builds DOM nodes from that tree with
// createElement and textContent only: no HTML string from the model is
// ever parsed, so raw HTML in the text shows as text and nothing in it can
// run. Links keep only http:, https: and mailto: targets.
//
// Supported: paragraphs, ATX headings, fenced and indented code, block
// quotes, bullet and numbered lists (one level, plus nested by indent),
// horizontal rules, tables with a header row, inline code, **strong**,
// *emphasis* / _emphasis_, ~~strike~~, [links](url) and bare URLs.

const SAFE_SCHEMES = ['http:', 'https:', 'mailto:'];

// safeHref returns href when it is an absolute http(s)/mailto URL, else ''.
export function safeHref(href) {
  const h = String(href || '').trim();
  if (!h) return '';
  // No control characters or whitespace tricks inside the scheme.
  if (/[\u0000-\u001f\u007f]/.test(h)) return '';
  const m = /^([a-zA-Z][a-zA-Z0-9+.-]*):/.exec(h);
  if (!m) return '';
  return SAFE_SCHEMES.includes(m[1].toLowerCase() + ':') ? h : '';
}

// A closing mark is looked for at most this far ahead, so a long line
// full of unmatched marks costs linear time, not quadratic.
const REACH = 400;

function find(text, mark, from, start) {
  const j = text.slice(from, start + REACH + mark.length).indexOf(mark);
  return j >= 0 ? from + j : -1;
}

// parseInline splits a line of text into inline nodes.
export function parseInline(text) {
  const out = [];
  let buf = '';
  const flush = () => {
    if (buf) out.push({ type: 'text', text: buf });
    buf = '';
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (c === '\\' && i + 1 < text.length && /[\\`*_~[\]()#>!-]/.test(text[i + 1])) {
      buf += text[i + 1];
      i += 2;
      continue;
    }
    if (c === '`') {
      let n = 1;
      while (text[i + n] === '`') n++;
      const fence = '`'.repeat(n);
      const end = find(text, fence, i + n, i);
      if (end > i) {
        flush();
        out.push({ type: 'code', text: text.slice(i + n, end).replace(/^ (.*) $/, '$1') });
        i = end + n;
        continue;
      }
    }
    if ((c === '*' || c === '_' || c === '~') && text[i + 1] === c) {
      const mark = c + c;
      const end = find(text, mark, i + 2, i);
      if (end > i + 2) {
        flush();
        out.push({ type: c === '~' ? 'del' : 'strong', children: parseInline(text.slice(i + 2, end)) });
        i = end + 2;
        continue;
      }
    }
    if ((c === '*' || c === '_') && text[i + 1] && text[i + 1] !== ' ' && text[i + 1] !== c) {
      const prev = i > 0 ? text[i - 1] : ' ';
      if (c === '*' || !/\w/.test(prev)) {
        let end = -1;
        for (let j = i + 2, lim = Math.min(text.length, i + REACH); j < lim; j++) {
          if (text[j] === c && text[j - 1] !== ' ' && !(c === '_' && /\w/.test(text[j + 1] || ''))) {
            end = j;
            break;
          }
        }
        if (end > i + 1) {
          flush();
          out.push({ type: 'em', children: parseInline(text.slice(i + 1, end)) });
          i = end + 1;
          continue;
        }
      }
    }
    if (c === '[') {
      const close = findClose(text, i);
      if (close > 0 && text[close + 1] === '(') {
        const endParen = find(text, ')', close + 2, i);
        if (endParen > 0) {
          const label = text.slice(i + 1, close);
          const target = text.slice(close + 2, endParen).trim().split(/\s+/)[0] || '';
          flush();
          const href = safeHref(target);
          if (href) out.push({ type: 'link', href, children: parseInline(label) });
          else out.push(...parseInline(label));
          i = endParen + 1;
          continue;
        }
      }
    }
    if ((c === 'h' || c === 'H') && /^https?:\/\//i.test(text.slice(i, i + 8))) {
      const prev = i > 0 ? text[i - 1] : ' ';
      if (!/[\w/]/.test(prev)) {
        const m = /^https?:\/\/[^\s<>()]+[^\s<>().,;:!?'"]/i.exec(text.slice(i));
        if (m) {
          flush();
          out.push({ type: 'link', href: m[0], children: [{ type: 'text', text: m[0] }] });
          i += m[0].length;
          continue;
        }
      }
    }
    buf += c;
    i++;
  }
  flush();
  return out;
}

function findClose(text, open) {
  let depth = 0;
  for (let i = open; i < text.length && i - open <= REACH; i++) {
    if (text[i] === '\\') {
      i++;
      continue;
    }
    if (text[i] === '[') depth++;
    else if (text[i] === ']' && --depth === 0) return i;
  }
  return -1;
}

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const HR = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const BULLET = /^(\s*)[-*+]\s+(.*)$/;
const ORDERED = /^(\s*)(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^ {0,3}>\s?(.*)$/;
const TABLE_SEP = /^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$/;

function cells(line) {
  let s = line.trim();
  if (s.startsWith('|')) s = s.slice(1);
  if (s.endsWith('|') && !s.endsWith('\\|')) s = s.slice(0, -1);
  return s.split(/(?<!\\)\|/).map((c) => parseInline(c.trim().replace(/\\\|/g, '|')));
}

// parseMarkdown returns the block tree of text.
export function parseMarkdown(text) {
  const lines = String(text ?? '').replace(/\r\n?/g, '\n').split('\n');
  return parseBlocks(lines);
}

function parseBlocks(lines) {
  const blocks = [];
  let i = 0;
  let para = [];
  const endPara = () => {
    if (para.length) blocks.push({ type: 'p', children: joinLines(para) });
    para = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) {
      endPara();
      i++;
      continue;
    }
    if ((m = FENCE.exec(line))) {
      endPara();
      const fence = m[1];
      const body = [];
      i++;
      while (i < lines.length && !new RegExp('^ {0,3}' + fence[0] + '{' + fence.length + ',}\\s*$').test(lines[i])) body.push(lines[i++]);
      i++; // the closing fence (or the end)
      blocks.push({ type: 'codeblock', lang: m[2] || '', text: body.join('\n') });
      continue;
    }
    if (/^( {4}|\t)/.test(line) && !para.length) {
      const body = [];
      while (i < lines.length && (/^( {4}|\t)/.test(lines[i]) || !lines[i].trim())) body.push(lines[i++].replace(/^( {4}|\t)/, ''));
      while (body.length && !body[body.length - 1].trim()) body.pop();
      blocks.push({ type: 'codeblock', lang: '', text: body.join('\n') });
      continue;
    }
    if ((m = HEADING.exec(line))) {
      endPara();
      blocks.push({ type: 'h', level: m[1].length, children: parseInline(m[2]) });
      i++;
      continue;
    }
    if (HR.test(line)) {
      endPara();
      blocks.push({ type: 'hr' });
      i++;
      continue;
    }
    if (QUOTE.test(line)) {
      endPara();
      const body = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) {
        body.push(m[1]);
        i++;
      }
      blocks.push({ type: 'quote', children: parseBlocks(body) });
      continue;
    }
    if (BULLET.test(line) || ORDERED.test(line)) {
      endPara();
      const ordered = !BULLET.test(line);
      const start = ordered ? Number(ORDERED.exec(line)[2]) : 1;
      const items = [];
      const baseIndent = (ordered ? ORDERED : BULLET).exec(line)[1].length;
      let cur = null;
      while (i < lines.length) {
        const l = lines[i];
        const b = BULLET.exec(l) || ORDERED.exec(l);
        const marker = b && b[1].length <= baseIndent + 1 && (ordered ? ORDERED.test(l) && !BULLET.test(l) : BULLET.test(l));
        if (marker) {
          cur = [ordered ? ORDERED.exec(l)[3] : BULLET.exec(l)[2]];
          items.push(cur);
          i++;
        } else if (l.trim() && cur && /^\s+/.test(l)) {
          cur.push(l.replace(/^\s{1,4}/, ''));
          i++;
        } else if (!l.trim() && cur && i + 1 < lines.length && /^\s+\S/.test(lines[i + 1])) {
          cur.push('');
          i++;
        } else break;
      }
      blocks.push({ type: ordered ? 'ol' : 'ul', start, items: items.map((it) => (it.length === 1 ? [{ type: 'p', children: parseInline(it[0]), tight: true }] : parseBlocks(it))) });
      continue;
    }
    if (line.includes('|') && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes('-')) {
      endPara();
      const head = cells(line);
      const rows = [];
      i += 2;
      while (i < lines.length && lines[i].includes('|') && lines[i].trim()) rows.push(cells(lines[i++]));
      blocks.push({ type: 'table', head, rows });
      continue;
    }
    para.push(line);
    i++;
  }
  endPara();
  return blocks;
}

function joinLines(lines) {
  const out = [];
  lines.forEach((l, k) => {
    const hard = / {2,}$/.test(l) || l.endsWith('\\');
    out.push(...parseInline(l.trim().replace(/\\$/, '')));
    if (k < lines.length - 1) out.push(hard ? { type: 'br' } : { type: 'text', text: ' ' });
  });
  return out;
}

// renderMarkdown returns a DocumentFragment of text's Markdown, built with
// doc.createElement and textContent only.
export function renderMarkdown(doc, text) {
  const frag = doc.createDocumentFragment();
  for (const b of parseMarkdown(text)) frag.appendChild(renderBlock(doc, b));
  return frag;
}

function el(doc, tag, children) {
  const e = doc.createElement(tag);
  if (children) for (const c of children) e.appendChild(c);
  return e;
}

function renderBlock(doc, b) {
  switch (b.type) {
    case 'p':
      return el(doc, 'p', renderInlines(doc, b.children));
    case 'h':
      return el(doc, 'h' + Math.min(6, b.level + 2), renderInlines(doc, b.children)); // h3…h6 inside a card
    case 'hr':
      return doc.createElement('hr');
    case 'codeblock': {
      const code = doc.createElement('code');
      code.textContent = b.text;
      if (b.lang) code.dataset.lang = b.lang;
      return el(doc, 'pre', [code]);
    }
    case 'quote':
      return el(doc, 'blockquote', b.children.map((c) => renderBlock(doc, c)));
    case 'ul':
    case 'ol': {
      const list = doc.createElement(b.type);
      if (b.type === 'ol' && b.start !== 1) list.start = b.start;
      for (const item of b.items) {
        const li = doc.createElement('li');
        for (const c of item) {
          if (c.type === 'p' && c.tight) for (const n of renderInlines(doc, c.children)) li.appendChild(n);
          else li.appendChild(renderBlock(doc, c));
        }
        list.appendChild(li);
      }
      return list;
    }
    case 'table': {
      const table = doc.createElement('table');
      const thead = el(doc, 'thead', [el(doc, 'tr', b.head.map((c) => el(doc, 'th', renderInlines(doc, c))))]);
      const tbody = el(doc, 'tbody', b.rows.map((r) => el(doc, 'tr', r.map((c) => el(doc, 'td', renderInlines(doc, c))))));
      table.append(thead, tbody);
      return table;
    }
    default:
      return doc.createTextNode('');
  }
}

function renderInlines(doc, nodes) {
  return nodes.map((n) => renderInline(doc, n));
}

function renderInline(doc, n) {
  switch (n.type) {
    case 'text':
      return doc.createTextNode(n.text);
    case 'code': {
      const c = doc.createElement('code');
      c.textContent = n.text;
      return c;
    }
    case 'strong':
    case 'em':
    case 'del':
      return el(doc, n.type, renderInlines(doc, n.children));
    case 'br':
      return doc.createElement('br');
    case 'link': {
      const a = el(doc, 'a', renderInlines(doc, n.children));
      a.href = n.href;
      a.rel = 'noopener noreferrer nofollow';
      a.target = '_blank';
      return a;
    }
    default:
      return doc.createTextNode('');
  }
}

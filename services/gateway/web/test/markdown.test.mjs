import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseMarkdown, parseInline, safeHref } from '../app/markdown.js';

test('raw HTML stays text', () => {
  const b = parseMarkdown('<img src=x onerror=alert(1)> and <script>alert(1)</script>');
  assert.equal(b.length, 1);
  assert.equal(b[0].type, 'p');
  const texts = b[0].children.filter((n) => n.type === 'text').map((n) => n.text).join('');
  assert.equal(texts, '<img src=x onerror=alert(1)> and <script>alert(1)</script>');
});

test('links keep only http, https and mailto targets', () => {
  assert.equal(safeHref('https://example.com/a?b'), 'https://example.com/a?b');
  assert.equal(safeHref('mailto:a@b.c'), 'mailto:a@b.c');
  for (const bad of ['javascript:alert(1)', 'JaVaScRiPt:alert(1)', 'java\tscript:alert(1)', 'data:text/html,x', 'vbscript:x', '/relative', '']) {
    assert.equal(safeHref(bad), '', bad);
  }
  const n = parseInline('[click](javascript:alert(1)) [ok](https://floe.dev)');
  assert.ok(!n.some((x) => x.type === 'link' && x.href.startsWith('javascript')));
  assert.deepEqual(n.filter((x) => x.type === 'link').map((x) => x.href), ['https://floe.dev']);
});

test('blocks: headings, fences, lists, quotes, tables', () => {
  const b = parseMarkdown('# Title\n\nSome **bold** and `code`.\n\n```go\nfmt.Println("<b>")\n```\n\n- one\n- two\n\n1. first\n2. second\n\n> quoted\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n---');
  assert.deepEqual(b.map((x) => x.type), ['h', 'p', 'codeblock', 'ul', 'ol', 'quote', 'table', 'hr']);
  assert.equal(b[2].lang, 'go');
  assert.equal(b[2].text, 'fmt.Println("<b>")');
  assert.equal(b[3].items.length, 2);
  assert.deepEqual(b[1].children.map((n) => n.type), ['text', 'strong', 'text', 'code', 'text']);
  assert.equal(b[6].rows.length, 1);
});

test('an unterminated fence (mid-stream) is a code block', () => {
  const b = parseMarkdown('Here:\n```\nline 1\nline 2');
  assert.equal(b[1].type, 'codeblock');
  assert.equal(b[1].text, 'line 1\nline 2');
});

test('inline: emphasis, strike, escapes, bare URLs', () => {
  const n = parseInline('*it* _em_ ~~gone~~ \\*not\\* see https://floe.dev/x.');
  assert.deepEqual(n.map((x) => x.type), ['em', 'text', 'em', 'text', 'del', 'text', 'link', 'text']);
  assert.equal(n[6].href, 'https://floe.dev/x');
  assert.ok(n[5].text.includes('*not*'));
  assert.deepEqual(parseInline('snake_case_name').map((x) => x.type), ['text']);
});

test('long lines of unmatched marks parse to the same text', () => {
  for (const unit of ['*a ', '_b ', '**c ', '`d ', '[e ', '[f](g ', '~~h ']) {
    const line = unit.repeat(20000);
    const text = parseInline(line).map(function flat(n) {
      return n.text !== undefined && n.type !== 'code' ? n.text : n.children ? n.children.map(flat).join('') : n.text || '';
    }).join('');
    assert.ok(text.length > 0, unit);
  }
});

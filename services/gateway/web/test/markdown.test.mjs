import { test } from 'node:test';
import assert from 'node:assert/strict';
import { markdownHTML, safeHref } from '../app/markdown.js';

test('raw HTML is escaped, block and inline', () => {
  const h = markdownHTML('<img src=x onerror=alert(1)> and <script>alert(1)</script>\n\n<div onclick="x">block</div>');
  assert.ok(!/<img|<script|<div/i.test(h), h);
  assert.ok(h.includes('&lt;img src=x onerror=alert(1)&gt;'), h);
  assert.ok(h.includes('&lt;script&gt;'), h);
});

test('links keep only http, https and mailto targets', () => {
  assert.equal(safeHref('https://example.com/a?b'), 'https://example.com/a?b');
  assert.equal(safeHref('mailto:a@b.c'), 'mailto:a@b.c');
  for (const bad of ['javascript:alert(1)', 'JaVaScRiPt:alert(1)', 'java\tscript:alert(1)', 'data:text/html,x', 'vbscript:x', '/relative', '']) {
    assert.equal(safeHref(bad), '', bad);
  }
});

test('markdown images become links, never <img>', () => {
  const h = markdownHTML('![cat](https://example.com/cat.png) ![bad](javascript:alert(1))');
  assert.ok(!h.includes('<img'), h);
  assert.ok(h.includes('<a href="https://example.com/cat.png">cat</a>'), h);
  assert.ok(!h.includes('javascript'), h);
});

test('blocks: headings, fences with their language, lists, quotes, tables', () => {
  const h = markdownHTML('# Title\n\nSome **bold** and `code`.\n\n```go\nfmt.Println("<b>")\n```\n\n- one\n- two\n\n> quoted\n\n| a | b |\n|---|---|\n| 1 | 2 |');
  for (const want of ['<h1>Title</h1>', '<strong>bold</strong>', '<code>code</code>', '<code class="language-go">fmt.Println(&quot;&lt;b&gt;&quot;)', '<li>one</li>', '<blockquote>', '<table>']) {
    assert.ok(h.includes(want), want + ' in ' + h);
  }
});

test('an unterminated fence (mid-stream) is a code block', () => {
  const h = markdownHTML('Here:\n```\nline 1\nline 2');
  assert.ok(/<pre><code>line 1\nline 2\n?<\/code><\/pre>/.test(h), h);
});

test('long lines of unmatched marks render', () => {
  for (const unit of ['*a ', '_b ', '**c ', '`d ', '[e ', '[f](g ', '~~h ']) {
    const h = markdownHTML(unit.repeat(5000));
    assert.ok(h.length > 0, unit);
  }
});

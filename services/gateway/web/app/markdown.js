// Markdown for model output, with well-kept libraries: marked parses,
// DOMPurify sanitizes, highlight.js colours code (all vendored under
// vendor/, versions and licenses in vendor/README.md).
//
// markdownHTML(text) is pure (node --test covers it): marked's HTML with
// every raw HTML block and inline tag escaped, so HTML written by the
// model shows as text. renderMarkdown(doc, text) sanitizes that HTML into
// a DOM fragment (DOMPurify: no script, no event handler, no javascript:
// URL; links keep only http:, https: and mailto:), highlights fenced code
// and puts a Copy button on every code block.

import { Marked } from './vendor/marked.esm.js';
import DOMPurify from './vendor/purify.es.js';
import hljs from './vendor/highlight.min.js';

const SAFE_SCHEMES = ['http:', 'https:', 'mailto:'];

// safeHref returns href when it is an absolute http(s)/mailto URL, else ''.
export function safeHref(href) {
  const h = String(href || '').trim();
  if (!h) return '';
  if (/[\u0000-\u001f\u007f]/.test(h)) return '';
  const m = /^([a-zA-Z][a-zA-Z0-9+.-]*):/.exec(h);
  if (!m) return '';
  return SAFE_SCHEMES.includes(m[1].toLowerCase() + ':') ? h : '';
}

const escapeHTML = (s) => String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);

const marked = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    // Raw HTML from the model is text, never markup.
    html(token) {
      const t = escapeHTML(token.text || token.raw || '');
      return token.block ? '<p>' + t + '</p>' : t;
    },
    // Images would fetch from anywhere: shown as their link instead.
    image(token) {
      const href = safeHref(token.href);
      const label = escapeHTML(token.text || token.href || 'image');
      return href ? '<a href="' + escapeHTML(href) + '">' + label + '</a>' : label;
    },
  },
});

// markdownHTML renders text as HTML with raw HTML escaped (not yet
// sanitized: renderMarkdown does that).
export function markdownHTML(text) {
  return marked.parse(String(text ?? ''), { async: false }).trim();
}

const PURIFY = {
  RETURN_DOM_FRAGMENT: true,
  FORBID_TAGS: ['img', 'style', 'form', 'input', 'button', 'textarea', 'select', 'iframe', 'video', 'audio', 'svg', 'math'],
  FORBID_ATTR: ['style', 'id', 'name'],
};

// renderMarkdown returns a DocumentFragment for text.
export function renderMarkdown(doc, text) {
  const frag = DOMPurify.sanitize(markdownHTML(text), PURIFY);
  for (const a of frag.querySelectorAll('a')) {
    const href = safeHref(a.getAttribute('href'));
    if (!href) {
      a.replaceWith(doc.createTextNode(a.textContent));
      continue;
    }
    a.setAttribute('target', '_blank');
    a.setAttribute('rel', 'noopener noreferrer');
  }
  for (const pre of frag.querySelectorAll('pre')) decorateCode(doc, pre);
  return frag;
}

// decorateCode highlights a <pre><code> block (by its language-* class,
// else by guessing when the code is small enough) and wraps it with a
// header: the language and a Copy button (data-copy; main.js copies).
function decorateCode(doc, pre) {
  const code = pre.querySelector('code');
  if (code) {
    const m = /(?:^|\s)language-([\w+#.-]+)/.exec(code.className);
    const lang = m && hljs.getLanguage(m[1]) ? m[1] : '';
    const src = code.textContent;
    try {
      const r = lang ? hljs.highlight(src, { language: lang, ignoreIllegals: true }) : src.length < 20000 ? hljs.highlightAuto(src) : null;
      if (r) {
        // highlight.js escapes the code it returns; sanitize anyway.
        code.replaceChildren(DOMPurify.sanitize(r.value, { RETURN_DOM_FRAGMENT: true, ALLOWED_TAGS: ['span'], ALLOWED_ATTR: ['class'] }));
        code.classList.add('hljs');
        if (r.language) code.dataset.language = r.language;
      }
    } catch {
      // an unknown grammar: the plain text stays
    }
  }
  const box = doc.createElement('div');
  box.className = 'code-block';
  const head = doc.createElement('div');
  head.className = 'code-head';
  // Labels come from data-label through CSS, out of the text of the answer.
  const label = doc.createElement('span');
  label.className = 'code-lang';
  label.dataset.label = code?.dataset.language || '';
  const copy = doc.createElement('button');
  copy.type = 'button';
  copy.className = 'copy';
  copy.dataset.copy = 'code';
  copy.dataset.label = 'Copy';
  copy.setAttribute('aria-label', 'Copy code');
  head.append(label, copy);
  pre.replaceWith(box);
  box.append(head, pre);
}

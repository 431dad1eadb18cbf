// A small, safe Markdown + TeX renderer for model output.
// Safety invariant: every character of the input reaches the page either HTML-escaped or
// through KaTeX (which escapes its input, trust: false). No raw HTML is ever passed through,
// links are only http(s)/mailto, so a reply with <script> or onerror= shows as text.
"use strict";
(function () {
  const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const escapeHtml = (s) => s.replace(/[&<>"']/g, (c) => ESC[c]);

  function renderMath(tex, display) {
    if (typeof katex === "undefined") return escapeHtml(display ? `$$${tex}$$` : `$${tex}$`);
    try {
      return katex.renderToString(tex, { displayMode: display, throwOnError: false, trust: false, strict: "ignore" });
    } catch (e) {
      return escapeHtml(tex);
    }
  }

  function inline(text) {
    // `text` is already escaped; only add tags around it.
    return text
      .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
      .replace(/__([^_]+)__/g, "<strong>$1</strong>")
      .replace(/(^|[^*])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>")
      .replace(/~~([^~]+)~~/g, "<del>$1</del>")
      // The label holds no "[" (one scan per "[": linear, not quadratic on "[[[[..."); the
      // URL holds no slot (\u0000): rendered TeX or code never lands inside an href.
      .replace(/\[([^\[\]]+)\]\(((?:https?:\/\/|mailto:)[^\s)\u0000]+)\)/g,
        '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>');
  }

  function blocks(text) {
    const out = [];
    let para = [], list = null;
    const flushPara = () => { if (para.length) { out.push(`<p>${inline(para.join("<br>"))}</p>`); para = []; } };
    const flushList = () => { if (list) { out.push(`<${list.tag}>${list.items.map((i) => `<li>${inline(i)}</li>`).join("")}</${list.tag}>`); list = null; } };
    for (const line of text.split("\n")) {
      let m;
      if (/^\s*$/.test(line)) { flushPara(); flushList(); continue; }
      if ((m = line.match(/^(#{1,6})\s+(.*)$/))) { flushPara(); flushList(); out.push(`<h${m[1].length}>${inline(m[2])}</h${m[1].length}>`); continue; }
      if (/^\s*(---|\*\*\*)\s*$/.test(line)) { flushPara(); flushList(); out.push("<hr>"); continue; }
      if ((m = line.match(/^\s*[-*+]\s+(.*)$/)) || (m = line.match(/^\s*\d+[.)]\s+(.*)$/))) {
        const tag = /^\s*\d/.test(line) ? "ol" : "ul";
        flushPara();
        if (!list || list.tag !== tag) { flushList(); list = { tag, items: [] }; }
        list.items.push(m[1]);
        continue;
      }
      if ((m = line.match(/^&gt;\s?(.*)$/))) { flushPara(); flushList(); out.push(`<blockquote>${inline(m[1])}</blockquote>`); continue; }
      flushList();
      para.push(line);
    }
    flushPara(); flushList();
    return out.join("\n");
  }

  // Replace each open...close pair (non-empty body) in one left-to-right pass: linear, where a
  // lazy regex rescans to the end for every unclosed opener.
  function delimited(s, open, close, fn) {
    let out = "", pos = 0;
    for (;;) {
      const a = s.indexOf(open, pos);
      if (a < 0) break;
      const b = s.indexOf(close, a + open.length + 1);
      if (b < 0) break;  // no closer after a: none after any later opener either
      out += s.slice(pos, a) + fn(s.slice(a + open.length, b));
      pos = b + close.length;
    }
    return out + s.slice(pos);
  }

  function renderMarkdown(src) {
    const slots = [];
    const hold = (html) => `\u0000${slots.push(html) - 1}\u0000`;
    let s = String(src).replace(/\u0000/g, "");
    s = s.replace(/```([\w+-]*)\n?([\s\S]*?)(```|$)/g, (_, lang, code) =>
      hold(`<pre><code class="lang-${escapeHtml(lang)}">${escapeHtml(code)}</code></pre>`));
    s = delimited(s, "$$", "$$", (tex) => hold(renderMath(tex, true)));
    s = delimited(s, "\\[", "\\]", (tex) => hold(renderMath(tex, true)));
    s = delimited(s, "\\(", "\\)", (tex) => hold(renderMath(tex, false)));
    s = s.replace(/\$([^\s$](?:[^$\n]*[^\s$])?)\$/g, (_, tex) => hold(renderMath(tex, false)));
    s = s.replace(/`([^`\n]+)`/g, (_, code) => hold(`<code>${escapeHtml(code)}</code>`));
    let html = blocks(escapeHtml(s));
    // Slots may nest (none do today); restore until stable.
    for (let i = 0; i < 3 && html.includes("\u0000"); i++) {
      html = html.replace(/\u0000(\d+)\u0000/g, (_, n) => slots[Number(n)]);
    }
    return html;
  }

  window.renderMarkdown = renderMarkdown;
  window.escapeHtml = escapeHtml;
})();

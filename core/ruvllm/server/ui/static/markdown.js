// Markdown to DOM nodes. Model output is never parsed as HTML: every piece of text becomes a
// text node (textContent or append(string)), and only the elements named here are created, so
// "<script>" or "<img onerror=...>" in an answer is shown as the characters it is.

const FENCE = /^\s*```\s*([\w+#.-]*)\s*$/;
const HEADING = /^(#{1,6})\s+(.*)$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*\d+[.)]\s+(.*)$/;
const QUOTE = /^>\s?(.*)$/;
// Inline spans, first match wins: `code`, **bold**, *italic* or _italic_, [text](http(s) link).
const INLINE = /(`+)([^`]+?)\1|\*\*(.+?)\*\*|(?<![\w*])\*(?!\s)(.+?)\*(?!\w)|(?<!\w)_(?!\s)(.+?)_(?!\w)|\[([^\]]+)\]\((\S+?)\)/;

function element(tag, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

// Only web links become anchors; javascript:, data: and relative URLs stay text.
function safeHref(url) {
  try {
    const parsed = new URL(url);
    return parsed.protocol === "http:" || parsed.protocol === "https:" ? parsed.href : null;
  } catch {
    return null;
  }
}

function appendInline(parent, text) {
  let rest = text;
  while (rest) {
    const match = INLINE.exec(rest);
    if (!match) {
      parent.append(rest);
      return;
    }
    parent.append(rest.slice(0, match.index));
    const [whole, , code, bold, star, under, label, url] = match;
    if (code !== undefined) {
      parent.append(Object.assign(element("code"), { textContent: code }));
    } else if (bold !== undefined) {
      const strong = element("strong");
      appendInline(strong, bold);
      parent.append(strong);
    } else if (star !== undefined || under !== undefined) {
      const em = element("em");
      appendInline(em, star ?? under);
      parent.append(em);
    } else {
      const href = safeHref(url);
      if (href) {
        const link = Object.assign(element("a"), { href, target: "_blank", rel: "noopener noreferrer" });
        link.textContent = label;
        parent.append(link);
      } else {
        parent.append(whole);
      }
    }
    rest = rest.slice(match.index + whole.length);
  }
}

// Lines of a paragraph keep their breaks: chat answers use single newlines on purpose.
function appendLines(parent, lines) {
  lines.forEach((line, i) => {
    if (i > 0) parent.append(element("br"));
    appendInline(parent, line);
  });
}

function codeBlock(lines, language) {
  const pre = element("pre");
  const code = element("code", language ? `language-${language}` : "");
  code.textContent = lines.join("\n");
  pre.append(code);
  return pre;
}

// Consecutive lines matching `pattern` as one list.
function list(lines, start, pattern, tag) {
  const node = element(tag);
  let i = start;
  for (; i < lines.length && pattern.test(lines[i]); i++) {
    const item = element("li");
    appendInline(item, pattern.exec(lines[i])[1]);
    node.append(item);
  }
  return [node, i];
}

// A fragment of nodes for `text`; an unclosed code fence (an answer still streaming) runs to the end.
export function renderMarkdown(text) {
  const fragment = document.createDocumentFragment();
  const lines = text.split("\n");
  let paragraph = [];
  const flush = () => {
    if (paragraph.length) {
      const p = element("p");
      appendLines(p, paragraph);
      fragment.append(p);
      paragraph = [];
    }
  };
  for (let i = 0; i < lines.length;) {
    const line = lines[i];
    const fence = FENCE.exec(line);
    if (fence) {
      flush();
      const body = [];
      for (i++; i < lines.length && !FENCE.test(lines[i]); i++) body.push(lines[i]);
      fragment.append(codeBlock(body, fence[1]));
      i++;
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      flush();
      const h = element(`h${Math.min(heading[1].length + 2, 6)}`);
      appendInline(h, heading[2]);
      fragment.append(h);
      i++;
    } else if (BULLET.test(line) || NUMBERED.test(line)) {
      flush();
      const [node, next] = BULLET.test(line) ? list(lines, i, BULLET, "ul") : list(lines, i, NUMBERED, "ol");
      fragment.append(node);
      i = next;
    } else if (QUOTE.test(line)) {
      flush();
      const quoted = [];
      for (; i < lines.length && QUOTE.test(lines[i]); i++) quoted.push(QUOTE.exec(lines[i])[1]);
      const quote = element("blockquote");
      appendLines(quote, quoted);
      fragment.append(quote);
    } else if (!line.trim()) {
      flush();
      i++;
    } else {
      paragraph.push(line);
      i++;
    }
  }
  flush();
  return fragment;
}

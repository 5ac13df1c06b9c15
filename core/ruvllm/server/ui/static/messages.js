// One chat message as DOM nodes: the user's text as typed, the assistant's as Markdown (built
// as nodes, never parsed as HTML), its state, and the SONA feedback marks.

import { renderMarkdown } from "./markdown.js";

export function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function feedbackButtons(message, onFeedback) {
  const box = element("span", "feedback");
  for (const [score, label, name] of [[1, "▲ good", "good"], [-1, "▼ bad", "bad"]]) {
    const button = element("button", message.feedback === score ? `thumb ${name} chosen` : `thumb ${name}`, label);
    button.type = "button";
    button.title = score > 0 ? "Good answer: SONA learns from it" : "Bad answer: SONA learns from it";
    button.addEventListener("click", () => onFeedback(message, score));
    box.append(button);
  }
  return box;
}

// The thinking, folded away once the answer has begun; plain text, as the model wrote it.
function reasoningNode(message) {
  const details = element("details", "reasoning");
  details.open = message.state === "streaming" && !message.content;
  details.append(element("summary", "", "Thinking"), element("div", "thought", message.reasoning));
  return details;
}

// `onFeedback(message, score)`, when given (SONA is on), puts the good/bad marks on a finished answer.
export function messageNode(message, onFeedback) {
  const node = element("div", `message ${message.role}`);
  node.dataset.state = message.state ?? "done";
  node.append(element("div", "role", message.role === "user" ? "You" : "Assistant"));
  if (message.reasoning) node.append(reasoningNode(message));
  const content = element("div", "content");
  if (message.role === "assistant") content.append(renderMarkdown(message.content));
  else content.textContent = message.content;
  node.append(content);
  const meta = element("div", "meta");
  if (message.state === "stopped") meta.append(element("span", "note", "stopped"));
  if (message.error) meta.append(element("span", "note error", message.error));
  if (onFeedback && message.role === "assistant" && message.id && message.state !== "streaming") {
    meta.append(feedbackButtons(message, onFeedback));
  }
  node.append(meta);
  return node;
}

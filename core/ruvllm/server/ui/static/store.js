// Conversations and settings in the browser's localStorage: they never leave this browser except
// as the messages of a chat request.

const CONVERSATIONS = "ruvllm-chat/conversations";
const CURRENT = "ruvllm-chat/current";
const SETTINGS = "ruvllm-chat/settings";

function read(name, fallback) {
  try {
    return JSON.parse(localStorage.getItem(name)) ?? fallback;
  } catch {
    return fallback;  // Damaged by hand or by another version: start again rather than break.
  }
}

export function loadConversations() {
  const list = read(CONVERSATIONS, []);
  const conversations = Array.isArray(list)
    ? list.filter((c) => c && typeof c.id === "string" && Array.isArray(c.messages)) : [];
  // An answer saved while it streamed (a mark given meanwhile) was cut off when the page closed.
  for (const message of conversations.flatMap((c) => c.messages)) {
    if (message.state === "streaming") message.state = "stopped";
  }
  return conversations;
}

export function saveConversations(list) {
  localStorage.setItem(CONVERSATIONS, JSON.stringify(list));
}

export function currentId() {
  return localStorage.getItem(CURRENT);
}

export function setCurrentId(id) {
  localStorage.setItem(CURRENT, id);
}

// Not crypto.randomUUID: a page reached over plain http on another host is not a secure
// context, and there it is undefined.
export function newConversation() {
  return { id: `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`, title: "New chat", created: Date.now(), messages: [] };
}

export function loadSettings() {
  return read(SETTINGS, {});
}

export function saveSettings(settings) {
  localStorage.setItem(SETTINGS, JSON.stringify(settings));
}

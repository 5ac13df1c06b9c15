// The chat page: conversations kept in this browser, answers streamed from the server's own
// /v1/chat/completions, and the status panel. Nothing is shown, and nothing but /v1/models is
// asked, until the server has accepted the API key (when it has one).

import { Unauthorized, forgetKey, getJson, getText, postJson, storeKey, storedKey, streamChat } from "./api.js";
import { element, messageNode as buildMessage } from "./messages.js";
import { parseTotals } from "./prometheus.js";
import { chatRequest, restoreSettings, showModels } from "./settings.js";
import { StatusPanel } from "./status.js";
import { currentId, loadConversations, newConversation, saveConversations, setCurrentId } from "./store.js";

const $ = (id) => document.getElementById(id);
const METRICS_EVERY_MS = 2000;
const HEALTH_EVERY_MS = 10000;

const state = {
  conversations: loadConversations(),
  current: null,
  sona: false,
  streaming: null,  // the AbortController of the answer being streamed
  timers: [],
};
const status = new StatusPanel($("plot"));

function showError(message) {
  $("chat-error").textContent = message ?? "";
  $("chat-error").hidden = !message;
}

// --- conversations ------------------------------------------------------------------------------

function current() {
  return state.conversations.find((c) => c.id === state.current);
}

function select(id) {
  state.current = id;
  setCurrentId(id);
  renderConversations();
  renderMessages();
}

function startConversation() {
  const conversation = newConversation();
  state.conversations.unshift(conversation);
  saveConversations(state.conversations);
  select(conversation.id);
}

function deleteConversation(id) {
  state.conversations = state.conversations.filter((c) => c.id !== id);
  saveConversations(state.conversations);
  if (state.current === id) {
    if (state.conversations.length) select(state.conversations[0].id);
    else startConversation();
  } else {
    renderConversations();
  }
}

function renderConversations() {
  const list = $("conversation-list");
  list.replaceChildren(...state.conversations.map((c) => {
    const item = element("li", c.id === state.current ? "active" : "");
    const open = element("button", "open", c.title);
    open.type = "button";
    open.addEventListener("click", () => !state.streaming && select(c.id));
    const remove = element("button", "delete", "×");
    remove.type = "button";
    remove.title = "Delete this conversation";
    remove.addEventListener("click", () => !state.streaming && deleteConversation(c.id));
    item.append(open, remove);
    return item;
  }));
}

// --- messages -----------------------------------------------------------------------------------

function messageNode(message) {
  return buildMessage(message, state.sona ? sendFeedback : null);
}

function renderMessages() {
  const conversation = current();
  const messages = conversation ? conversation.messages : [];
  $("messages").replaceChildren(...messages.map(messageNode));
  $("messages").scrollTop = $("messages").scrollHeight;
  updateButtons();
}

function replaceLastMessage(message) {
  const nodes = $("messages").children;
  const node = messageNode(message);
  if (nodes.length) nodes[nodes.length - 1].replaceWith(node);
  else $("messages").append(node);
  $("messages").scrollTop = $("messages").scrollHeight;
}

function updateButtons() {
  const messages = current()?.messages ?? [];
  $("send").disabled = Boolean(state.streaming);
  $("stop").disabled = !state.streaming;
  $("regenerate").disabled = Boolean(state.streaming) || !messages.some((m) => m.role === "user");
}

async function sendFeedback(message, score) {
  try {
    await postJson("/v1/feedback", { id: message.id, score });
    message.feedback = score;
    saveConversations(state.conversations);
    renderMessages();
    showError(null);
  } catch (error) {
    showError(`feedback not recorded: ${error.message}`);
  }
}

// --- chat ---------------------------------------------------------------------------------------

function requestBody(conversation) {
  return chatRequest(conversation.messages.filter((m) => m.content && (m.role === "user" || m.role === "assistant"))
    .map((m) => ({ role: m.role, content: m.content })));
}

// Streams the answer to `conversation`'s messages into a new assistant message at its end.
async function answer(conversation) {
  const message = { role: "assistant", content: "", state: "streaming" };
  conversation.messages.push(message);
  $("messages").append(messageNode(message));
  const controller = new AbortController();
  state.streaming = controller;
  updateButtons();
  showError(null);
  const started = performance.now();
  let first = null;
  let usage = null;
  try {
    await streamChat(requestBody(conversation), controller.signal, (chunk) => {
      message.id ??= chunk.id;
      usage = chunk.usage ?? usage;
      const delta = chunk.choices?.[0]?.delta ?? {};
      if (!delta.content && !delta.reasoning_content) return;
      first ??= performance.now();
      // A thinking model's reasoning comes apart from its answer (the server splits <think>).
      if (delta.reasoning_content) message.reasoning = (message.reasoning ?? "") + delta.reasoning_content;
      message.content += delta.content ?? "";
      replaceLastMessage(message);
    });
    message.state = "done";
  } catch (error) {
    if (error instanceof Unauthorized) {
      message.error = error.message;
      askKey(error.message);
    }
    message.state = controller.signal.aborted ? "stopped" : "error";
    if (!controller.signal.aborted) message.error ??= error.message;
  } finally {
    state.streaming = null;
    saveConversations(state.conversations);
    replaceLastMessage(message);
    updateButtons();
  }
  if (message.state === "done") {
    status.showAnswer({ usage, firstMs: first && first - started, decodeMs: first && performance.now() - first });
  }
}

function send(text) {
  const conversation = current();
  if (!conversation.messages.length) conversation.title = text.slice(0, 40);
  conversation.messages.push({ role: "user", content: text });
  saveConversations(state.conversations);
  renderConversations();
  renderMessages();
  return answer(conversation);
}

function regenerate() {
  const conversation = current();
  while (conversation.messages.length && conversation.messages.at(-1).role === "assistant") {
    conversation.messages.pop();
  }
  renderMessages();
  return answer(conversation);
}

function bindComposer() {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || state.streaming) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => state.streaming?.abort());
  $("regenerate").addEventListener("click", () => !state.streaming && regenerate());
  $("new-chat").addEventListener("click", () => !state.streaming && startConversation());
}

// --- connection ---------------------------------------------------------------------------------

function stopPolling() {
  state.timers.forEach(clearInterval);
  state.timers = [];
}

// One poll of the status panel; a server that stopped answering is said so, not shown as it was.
async function poll(task) {
  try {
    await task();
    $("status-lost").hidden = true;
  } catch (error) {
    if (error instanceof Unauthorized) askKey(error.message);
    else $("status-lost").hidden = false;
  }
}

async function pollMetrics() {
  const sona = status.showMetrics(parseTotals(await getText("/metrics")), Date.now());
  if (sona !== state.sona && !state.streaming) {
    state.sona = sona;
    renderMessages();
  }
}

async function pollHealth() {
  status.showHealth(await getJson("/health"));
}

async function connect() {
  let models;
  try {
    models = await getJson("/v1/models");
  } catch (error) {
    if (error instanceof Unauthorized) askKey(storedKey() ? error.message : null);
    else showError(`cannot reach the server: ${error.message}`);
    return;
  }
  $("forget-key").hidden = !storedKey();
  showModels(models.data);
  document.body.classList.add("connected");
  const known = state.conversations.some((c) => c.id === currentId());
  if (known) select(currentId());
  else startConversation();
  await Promise.all([poll(pollHealth), poll(pollMetrics)]);
  stopPolling();
  state.timers.push(setInterval(() => poll(pollMetrics), METRICS_EVERY_MS),
                    setInterval(() => poll(pollHealth), HEALTH_EVERY_MS));
}

// Hides everything the server told this page, then asks for the key.
function askKey(message) {
  stopPolling();
  document.body.classList.remove("connected");
  $("messages").replaceChildren();
  $("model").replaceChildren();
  $("model-single").textContent = "";
  $("key-error").textContent = message ?? "";
  $("key-error").hidden = !message;
  if (!$("key-dialog").open) $("key-dialog").showModal();
  $("api-key").focus();
}

function bindKeyDialog() {
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    storeKey($("api-key").value.trim(), $("remember-key").checked);
    $("api-key").value = "";
    $("key-dialog").close();
    connect();
  });
  $("key-dialog").addEventListener("cancel", (event) => event.preventDefault());
  $("forget-key").addEventListener("click", () => {
    forgetKey();
    $("forget-key").hidden = true;
    askKey(null);
  });
}

restoreSettings();
bindComposer();
bindKeyDialog();
connect();

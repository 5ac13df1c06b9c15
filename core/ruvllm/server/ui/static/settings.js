// The settings form (system prompt, sampling, model), kept in localStorage, and the request
// fields it gives a chat request.

import { loadSettings, saveSettings } from "./store.js";

const $ = (id) => document.getElementById(id);
const INPUTS = { system: "system", temperature: "temperature", top_p: "top-p", max_tokens: "max-tokens" };

function persist() {
  const settings = { model: $("model").value };
  for (const [name, id] of Object.entries(INPUTS)) settings[name] = $(id).value;
  saveSettings(settings);
}

export function restoreSettings() {
  const saved = loadSettings();
  for (const [name, id] of Object.entries(INPUTS)) {
    if (saved[name] !== undefined) $(id).value = saved[name];
    $(id).addEventListener("change", persist);
  }
  $("model").addEventListener("change", persist);
}

// The picker lists every served model (and LoRA adapter); it is shown only when there is a choice.
export function showModels(cards) {
  const picker = $("model");
  const saved = loadSettings().model;
  picker.replaceChildren(...cards.map((card) => Object.assign(document.createElement("option"), {
    textContent: card.id, value: card.id,
  })));
  if (cards.some((card) => card.id === saved)) picker.value = saved;
  $("model-picker").hidden = cards.length < 2;
  $("model-single").textContent = cards.length === 1 ? cards[0].id : "";
}

function number(id) {
  const text = $(id).value.trim();
  return text === "" ? undefined : Number(text);
}

// A streamed chat request for `messages` ({role, content}), after the system prompt if any.
export function chatRequest(messages) {
  const system = $("system").value.trim();
  return {
    model: $("model").value || undefined,
    messages: system ? [{ role: "system", content: system }, ...messages] : messages,
    stream: true, stream_options: { include_usage: true },
    temperature: number("temperature"), top_p: number("top-p"), max_tokens: number("max-tokens"),
  };
}

// Every call the page makes to its own server: the key goes with each one as a bearer header,
// and a 401 is reported as such so the page can ask for the key instead of showing an error.

const KEY_NAME = "ruvllm-chat/api-key";

export class Unauthorized extends Error {}

export function storedKey() {
  return sessionStorage.getItem(KEY_NAME) ?? localStorage.getItem(KEY_NAME) ?? "";
}

export function storeKey(key, remember) {
  forgetKey();
  (remember ? localStorage : sessionStorage).setItem(KEY_NAME, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_NAME);
  localStorage.removeItem(KEY_NAME);
}

function headers(extra) {
  const key = storedKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : { ...extra };
}

async function failure(response) {
  if (response.status === 401) return new Unauthorized("the API key was refused");
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    message = body?.error?.message ?? message;
  } catch {
    // Not JSON: the status line says enough.
  }
  return new Error(message);
}

export async function getJson(path) {
  const response = await fetch(path, { headers: headers({}) });
  if (!response.ok) throw await failure(response);
  return response.json();
}

export async function getText(path) {
  const response = await fetch(path, { headers: headers({}) });
  if (!response.ok) throw await failure(response);
  return response.text();
}

export async function postJson(path, body) {
  const response = await fetch(path, {
    method: "POST", headers: headers({ "Content-Type": "application/json" }), body: JSON.stringify(body),
  });
  if (!response.ok) throw await failure(response);
  return response.json();
}

// POSTs a streaming chat request and calls onChunk with each parsed server-sent event until
// [DONE]; aborting `signal` (the Stop button) closes the connection, which cancels the request.
export async function streamChat(body, signal, onChunk) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST", headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(body), signal,
  });
  if (!response.ok) throw await failure(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message ?? "the server reported an error");
        onChunk(chunk);
      }
    }
  }
}

// The status panel: what /health says about the backend and machine, what /metrics says about
// the KV pool, queue, speculative decoding and SONA, what the page measured of its last answer,
// and the history the live plot draws.

import { drawPlot } from "./plot.js";

const WINDOW_MS = 5 * 60 * 1000;
const MIN_SPAN_MS = 20 * 1000;

function show(id, text) {
  document.getElementById(id).textContent = text;
}

export class StatusPanel {
  constructor(canvas) {
    this.canvas = canvas;
    this.samples = [];
    this.previous = null;
  }

  showHealth(health) {
    show("status-backend", health.backend ? `${health.backend} (${health.engine_path} path)` : "not loaded");
    show("status-reason", health.backend_choice ?? "named in the configuration, not chosen by auto");
    const m = health.machine ?? {};
    // ruvllm.hardware's CpuInfo.kind, the class of machine its measurements are keyed by (the
    // architecture where /health carries no kind).
    const kind = m.kind ? `${m.kind} kind` : m.arch;
    show("status-cpu", `${kind} · ${m.model || m.arch} · ${m.usable_cores} core${m.usable_cores === 1 ? "" : "s"}`);
  }

  // Returns whether SONA is attached (its series are on /metrics only then): thumbs are shown.
  showMetrics(totals, now) {
    const used = totals.get("ruvllm:kv_cache_used_tokens") ?? 0;
    const capacity = totals.get("ruvllm:kv_cache_capacity_tokens") ?? 0;
    const kv = capacity ? used / capacity : 0;
    show("status-kv", capacity ? `${used} of ${capacity} tokens (${(100 * kv).toFixed(1)}%)` : "–");
    show("status-requests", `${totals.get("ruvllm:num_requests_running") ?? 0} / ` +
         `${totals.get("ruvllm:num_requests_waiting") ?? 0}`);
    const drafted = totals.get("ruvllm:spec_decode_num_draft_tokens_total") ?? 0;
    const accepted = totals.get("ruvllm:spec_decode_num_accepted_tokens_total") ?? 0;
    for (const node of document.querySelectorAll(".spec")) node.hidden = drafted === 0;
    if (drafted) {
      show("status-spec", `${(100 * accepted / drafted).toFixed(1)}% of ${drafted} drafted tokens accepted ` +
           "since the start");
    }
    const sona = totals.has("ruvllm:sona_requests_stored");
    show("status-feedback", sona ? "on: SONA learns from good/bad marks" : "off (SONA is not attached)");

    const generated = totals.get("ruvllm:generation_tokens_total") ?? 0;
    if (this.previous && now > this.previous.t) {
      // A counter that went back is a reloaded model: no rate for that interval.
      const rate = Math.max(0, generated - this.previous.generated) / ((now - this.previous.t) / 1000);
      this.samples.push({ t: now, rate, kv });
    }
    this.previous = { t: now, generated };
    while (this.samples.length && this.samples[0].t < now - WINDOW_MS) this.samples.shift();
    // A page open for less than the window plots what it has over the whole width.
    const span = this.samples.length ? Math.max(MIN_SPAN_MS, now - this.samples[0].t) : WINDOW_MS;
    drawPlot(this.canvas, this.samples, span);
    return sona;
  }

  // `usage`: the stream's last usage (OpenAI's, with ruvllm's draft counts when it speculated).
  showAnswer({ usage, firstMs, decodeMs }) {
    const tokens = usage?.completion_tokens ?? 0;
    // Tokens after the first over the time after it: the decode rate, apart from the prompt's.
    const rate = tokens > 1 && decodeMs > 0 ? (tokens - 1) / (decodeMs / 1000) : null;
    const drafted = usage?.draft_tokens ?? 0;
    show("status-speed", `${tokens} tokens` + (rate ? `, ${rate.toFixed(1)} tokens/s` : "") +
         (drafted ? `, ${usage.accepted_draft_tokens} of ${drafted} drafted tokens accepted` : ""));
    show("status-ttft", firstMs == null ? "–" : `${Math.round(firstMs)} ms`);
  }
}

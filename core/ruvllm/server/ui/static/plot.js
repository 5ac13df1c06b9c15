// The status panel's live plot: generated tokens/s and the KV pool's use over a time window,
// drawn on a canvas (no chart library: the page loads nothing but its own files).

const THROUGHPUT = "#2f7de1";
const KV = "#d9822b";
const GRID = "#8884";
const TEXT = "#888";

function line(ctx, points, color) {
  if (points.length < 2) return;
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  points.forEach(([x, y], i) => (i ? ctx.lineTo(x, y) : ctx.moveTo(x, y)));
  ctx.stroke();
}

// samples: [{t: ms, rate: tokens/s, kv: 0..1}], oldest first; windowMs: the span shown.
export function drawPlot(canvas, samples, windowMs) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || canvas.width;
  const height = canvas.clientHeight || canvas.height;
  if (canvas.width !== Math.round(width * ratio)) {
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const top = 14;
  const bottom = height - 4;
  ctx.strokeStyle = GRID;
  ctx.lineWidth = 1;
  for (const f of [0, 0.5, 1]) {
    const y = bottom - f * (bottom - top);
    ctx.beginPath();
    ctx.moveTo(0, y);
    ctx.lineTo(width, y);
    ctx.stroke();
  }
  const now = samples.length ? samples[samples.length - 1].t : Date.now();
  const peak = Math.max(1, ...samples.map((s) => s.rate));
  const x = (t) => width - ((now - t) / windowMs) * width;
  const y = (f) => bottom - f * (bottom - top);
  line(ctx, samples.map((s) => [x(s.t), y(s.rate / peak)]), THROUGHPUT);
  line(ctx, samples.map((s) => [x(s.t), y(s.kv)]), KV);
  ctx.fillStyle = TEXT;
  ctx.font = "10px sans-serif";
  ctx.textAlign = "left";
  ctx.fillText(`${peak.toFixed(peak < 10 ? 1 : 0)} tok/s`, 2, 10);
  ctx.textAlign = "right";
  const span = windowMs < 90000 ? `${Math.round(windowMs / 1000)} s` : `${Math.round(windowMs / 60000)} min`;
  ctx.fillText(`100% · last ${span}`, width - 2, 10);
}

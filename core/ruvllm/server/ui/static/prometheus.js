// The few figures the status panel needs, read from /metrics' Prometheus text.

const LINE = /^([a-zA-Z_:][\w:]*)(\{.*\})?\s+(\S+)/;

// Sample name -> the sum over every label set (all models, all finish reasons): the server's total.
export function parseTotals(text) {
  const totals = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = LINE.exec(line);
    if (!match) continue;
    const value = Number(match[3]);
    if (Number.isFinite(value)) totals.set(match[1], (totals.get(match[1]) ?? 0) + value);
  }
  return totals;
}

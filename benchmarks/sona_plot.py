"""sona_learning.py's figures as a picture: held-out gain with its interval, forgetting, and serving
throughput while learning, each against its target; several runs (say bf16 and float32) side by side.

    .venv/bin/python benchmarks/sona_plot.py bf16.json:bf16 f32.json:"float32 (AVX2 numerics)" -o sona.png

Each argument is a ``--json`` file sona_learning.py wrote, with an optional ``:label``.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sona_costs import WINDOWS

#: Targets of the SONA issue, drawn as lines.
RATIO_TARGET, RATIO_LOW_TARGET, DRIFT_TARGET_PCT, THROUGHPUT_TARGET = 3.0, 2.0, 5.0, 0.9
LABELS = {"instructed": "base + instruction"}
#: The windows compared with not learning.
LEARNING = tuple((key, label) for key, label in WINDOWS.items() if key != "frozen")


def _finite(value: float) -> float:
    return value if math.isfinite(value) else math.nan


def plot(runs: Sequence[tuple[str, dict[str, Any]]], path: Path) -> Path:
    """One group of bars per run in each panel; ``runs`` are (label, sona_learning.py report)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(runs[0][1]["rows"])
    fig, (gain, drift, speed) = plt.subplots(1, 3, figsize=(16, 4.8))
    width = 0.8 / len(runs)
    for i, (label, report) in enumerate(runs):
        rows = [report["rows"][v] for v in variants]
        xs = [x + i * width for x in range(len(variants))]
        ratios = [_finite(r["ratio"]) for r in rows]  # no bar where the base rate was 0
        errors = [[_finite(r["ratio"] - r["ci"][0]) for r in rows],
                  [_finite(r["ci"][1] - r["ratio"]) for r in rows]]
        gain.bar(xs, ratios, width, yerr=errors, capsize=3, label=label)
        drift.bar(xs, [r["perplexity_change_pct"] for r in rows], width, label=label)
        t = report.get("throughput")
        if t:
            speed.bar([x + i * width for x in range(len(LEARNING))],
                      [t[f"{key}_tok_s"] / t["frozen_tok_s"] for key, _ in LEARNING], width,
                      label=f"{label} ({', '.join(str(t[f'{key}_updates']) for key, _ in LEARNING)} updates)")
    names = [LABELS.get(v, v) for v in variants]
    centre = 0.4 - width / 2
    for ax, ticks in ((gain, names), (drift, names), (speed, [name for _, name in LEARNING])):
        ax.set_xticks([x + centre for x in range(len(ticks))], ticks, rotation=20, ha="right", fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    highs = [r["ci"][1] for _, report in runs for r in report["rows"].values() if math.isfinite(r["ci"][1])]
    gain.set_ylim(0, 1.3 * max(highs, default=RATIO_TARGET))  # room for the legend above the intervals
    gain.axhline(RATIO_TARGET, color="k", linestyle="--", linewidth=1)
    gain.axhline(RATIO_LOW_TARGET, color="k", linestyle=":", linewidth=1)
    gain.set_ylabel("held-out short-answer rate, x base (95 % CI)")
    gain.set_title(f"learning: target {RATIO_TARGET:g}x (dashed), CI low end {RATIO_LOW_TARGET:g}x (dotted)",
                   fontsize=9)
    drift.axhline(DRIFT_TARGET_PCT, color="k", linestyle="--", linewidth=1)
    drift.set_ylabel("general-text perplexity change (%)")
    drift.set_title(f"forgetting: target <= {DRIFT_TARGET_PCT:g} %", fontsize=9)
    speed.axhline(THROUGHPUT_TARGET, color="k", linestyle="--", linewidth=1)
    speed.set_ylim(0, 1.2)
    speed.set_ylabel("C=16 throughput, x not learning")
    speed.set_title(f"serving while learning: target >= {THROUGHPUT_TARGET:g}x", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="JSON[:LABEL] written by sona_learning.py --json")
    ap.add_argument("-o", "--output", default="sona.png")
    args = ap.parse_args()
    runs = []
    for spec in args.runs:
        file, _, label = spec.partition(":")
        runs.append((label or Path(file).stem, json.loads(Path(file).read_text())))
    print(plot(runs, Path(args.output)))


if __name__ == "__main__":
    main()

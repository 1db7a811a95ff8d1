"""Plot predicted against published speculative speed-up: docs/predicted_vs_published.png.

Every usable row of ``tests/data/published``: hollow markers = the leave-one-source-out refit
(out of sample, the headline), filled = the engine defaults (in sample); the diagonal is a
perfect prediction, the band +-15 %, the grey cross the break-even lines (speed-up 1). Grey x: the EAGLE-3 paper's SGLang batch series (no
acceptance length of its own, predicted from the reference one in its notes; not in the figures
or the fit). Needs the ``plots`` extra (matplotlib).

    python scripts/plot_predicted_vs_published.py [--folder tests/data/published] [--out PNG]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MARKERS = {"trtllm": "o", "vllm": "s", "sglang": "^", "hf": "D"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", type=Path, default=ROOT / "tests/data/published")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/predicted_vs_published.png")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from spectool.io import atomic_write_bytes
    from spectool.predict.baselines import load_baselines
    from spectool.predict.loso import leave_one_source_out
    from spectool.predict.published import (
        evaluate,
        load_models,
        load_rows,
        predict_with_reference,
    )

    rows, models = load_rows(args.folder), load_models(args.folder)
    shipped = evaluate(rows, models)
    loso_ev = leave_one_source_out(rows, models, load_baselines(args.folder))
    loso = {r.row_id: p for r, p in loso_ev.rows}
    fig, ax = plt.subplots(figsize=(6.4, 6.0), dpi=120)
    top = max(max(r.speedup, p, loso[r.row_id]) for r, p in shipped.rows) * 1.08
    ax.fill_between([0, top], [0, top * 0.85], [0, top * 1.15], color="0.92", label="+-15 %")
    ax.plot([0, top], [0, top], color="0.5", lw=1)
    ax.axhline(1.0, color="0.7", lw=0.8, ls="--")
    ax.axvline(1.0, color="0.7", lw=0.8, ls="--")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, engine in enumerate(sorted({r.engine for r, _ in shipped.rows})):
        sub = [(r, p) for r, p in shipped.rows if r.engine == engine]
        color = colors[i % len(colors)]
        marker = MARKERS.get(engine, "o")
        ax.scatter(
            [r.speedup for r, _ in sub],
            [p for _, p in sub],
            color=color,
            marker=marker,
            label=f"{engine} ({len(sub)} rows)",
            zorder=3,
        )
        ax.scatter(
            [r.speedup for r, _ in sub],
            [loso[r.row_id] for r, _ in sub],
            facecolors="none",
            edgecolors=color,
            marker=marker,
            zorder=2,
        )
    ax.scatter([], [], facecolors="none", edgecolors="0.3", label="leave-one-source-out")
    trend = [
        (r.speedup, predict_with_reference(r, models))
        for r in rows
        if r.source_id == "eagle3-paper" and r.engine == "sglang" and r.ref_acceptance_length
    ]
    ax.scatter(
        [x for x, _ in trend],
        [y for _, y in trend],
        color="0.45",
        marker="x",
        s=18,
        label=f"SGLang batch 2-64, reference AL ({len(trend)}, not fitted)",
        zorder=1,
    )
    for r, p in shipped.wrong_side():
        ax.annotate(r.row_id, (r.speedup, p), fontsize=6, xytext=(4, 4), textcoords="offset points")
    ax.set_xlim(0.5, top)
    ax.set_ylim(0.5, top)
    ax.set_xlabel("published speed-up (spec / baseline)")
    ax.set_ylabel("predicted speed-up")
    ax.set_title(
        f"predicted vs published: leave-one-source-out median |error| "
        f"{loso_ev.median_abs_error:.1%} (in sample {shipped.median_abs_error:.1%})",
        fontsize=10,
    )
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out, buf.getvalue())
    print(f"wrote {args.out} ({len(shipped.rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The tune figures, as PNG files in the tune folder (matplotlib, Agg backend, imported lazily).

* ``speedup_heatmap.png``: speedup ``rhs / lhs`` (per-token time without speculation over with
  it) for every ``k >= 1`` x concurrency. Measured cells are drawn solid with their value and
  interval, cross-hatched when ``inconclusive``; cells ``tune`` did not measure show the
  model's prediction, hatched and marked ``pred``; the chosen cell of each concurrency is
  outlined. The colour scale is centred on 1 (no change).
* ``latency_vs_concurrency.png``: ms per output token (token-weighted TPOT) against concurrency,
  one line per measured ``k`` (``k = 0`` in black), with bootstrap intervals as error bars.
* ``acceptance_per_position.png``: ``alpha_i`` per draft position, one line per concurrency,
  pooled over that concurrency's speculative cells; a constant rate fitted to tokens per step
  where the engine counts no positions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spectool.decide.stats import acceptance_curves
from spectool.tuning.outcome import TuneOutcome
from spectool.tuning.setup import PLOT_NAMES

DPI = 120


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    """Save through a temporary name and a rename (a reader never sees half a PNG), then close
    the figure (also when saving fails)."""
    import io

    import matplotlib.pyplot as plt

    from spectool.io import atomic_write_bytes

    try:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
        return atomic_write_bytes(path, buffer.getvalue())
    finally:
        plt.close(fig)


def speedup_heatmap(outcome: TuneOutcome, path: Path) -> Path:
    """``speedup_heatmap.png`` (module docstring)."""
    import numpy as np
    from matplotlib.colors import Normalize
    from matplotlib.patches import Rectangle

    plt = _pyplot()
    result = outcome.result
    concs = list(result.concurrencies)
    ks = list(range(1, result.searched_max_draft_len + 1))
    measured = {(v.concurrency, v.k): 1.0 / v.ratio for v in result.cells}
    verdicts = {(v.concurrency, v.k): v for v in result.cells}
    predicted = {(p.concurrency, p.k): 1.0 / p.ratio for p in result.predictions if p.ratio > 0}
    grid = np.full((len(ks), len(concs)), np.nan)
    for i, k in enumerate(ks):
        for j, c in enumerate(concs):
            value = measured.get((c, k), predicted.get((c, k)))
            if value is not None:
                grid[i, j] = value
    finite = grid[np.isfinite(grid)]
    # Colour by log2(speedup), symmetric around 0 (= no change): 2x faster and 2x slower get
    # equally deep colours.
    spread = float(np.max(np.abs(np.log2(finite)))) if finite.size else 0.0
    spread = max(spread, 0.1)
    norm = Normalize(vmin=-spread, vmax=spread)
    fig, ax = plt.subplots(figsize=(1.3 + 1.1 * len(concs), 1.2 + 0.7 * len(ks)))
    image = ax.imshow(np.log2(grid), cmap="RdBu", norm=norm, aspect="auto", origin="lower")
    for i, k in enumerate(ks):
        for j, c in enumerate(concs):
            if not np.isfinite(grid[i, j]):
                ax.text(j, i, "n/a", ha="center", va="center", fontsize=8, color="grey")
                continue
            is_measured = (c, k) in measured
            v = verdicts.get((c, k))
            if v is not None:  # the speedup and its interval (the ratio's, inverted)
                label = f"{grid[i, j]:.2f}\n{1 / v.ci_high:.2f}-{1 / v.ci_low:.2f}"
            else:
                label = f"{grid[i, j]:.2f}\npred"
            dark = abs(float(norm(np.log2(grid[i, j]))) - 0.5) > 0.3  # deep colour: white text
            ax.text(
                j,
                i,
                label,
                ha="center",
                va="center",
                fontsize=8,
                color="white" if dark else "black",
                fontweight="bold" if is_measured else "normal",
            )
            hatch = None
            if v is not None and v.verdict == "inconclusive":
                hatch = ("xx", "dimgrey")
            elif not is_measured:
                hatch = ("///", "grey")
            if hatch is not None:
                ax.add_patch(
                    Rectangle(
                        (j - 0.5, i - 0.5),
                        1,
                        1,
                        fill=False,
                        hatch=hatch[0],
                        edgecolor=hatch[1],
                        linewidth=0,
                    )
                )
            if result.choices.get(c) == k:
                ax.add_patch(
                    Rectangle(
                        (j - 0.48, i - 0.48),
                        0.96,
                        0.96,
                        fill=False,
                        edgecolor="black",
                        linewidth=2.2,
                    )
                )
    ax.set_xticks(range(len(concs)), [str(c) for c in concs])
    ax.set_yticks(range(len(ks)), [str(k) for k in ks])
    ax.set_xlabel("concurrency")
    ax.set_ylabel("draft length k")
    ax.set_title(
        "speedup per token vs. no speculation, with its interval\n"
        "(bold: measured, ///: predicted, xx: inconclusive, box: chosen)",
        fontsize=9,
    )
    bar = fig.colorbar(image, ax=ax, label="rhs / lhs (>1: speculation pays)")
    ticks = [-spread, -spread / 2, 0.0, spread / 2, spread]
    bar.set_ticks(ticks, labels=[f"{2.0**t:.2f}" for t in ticks])
    return _save(fig, path)


def latency_vs_concurrency(outcome: TuneOutcome, path: Path) -> Path:
    """``latency_vs_concurrency.png`` (module docstring)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ks = sorted({k for _, k in outcome.stats})
    cmap = plt.get_cmap("viridis")
    top = max(ks) if ks else 1
    for k in ks:
        points = sorted((c, s) for (c, kk), s in outcome.stats.items() if kk == k)
        xs = [c for c, _ in points]
        ys = [s.ms_per_token.value for _, s in points]
        low = [s.ms_per_token.value - s.ms_per_token.low for _, s in points]
        high = [s.ms_per_token.high - s.ms_per_token.value for _, s in points]
        color = "black" if k == 0 else cmap(0.15 + 0.75 * (k - 1) / max(top - 1, 1))
        ax.errorbar(
            xs,
            ys,
            yerr=[low, high],
            marker="o",
            capsize=3,
            color=color,
            linewidth=2.2 if k == 0 else 1.3,
            label="k=0 (off)" if k == 0 else f"k={k}",
        )
    ax.set_xscale("log", base=2)
    concs = list(outcome.result.concurrencies)
    ax.set_xticks(concs, [str(c) for c in concs])
    ax.set_xlabel("concurrency")
    ax.set_ylabel("ms per output token (TPOT, token-weighted)")
    ax.set_title("per-token latency by draft length (measured cells, 95% CI)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def acceptance_per_position(outcome: TuneOutcome, path: Path) -> Path:
    """``acceptance_per_position.png`` (module docstring)."""
    plt = _pyplot()
    curves, per_position = acceptance_curves(outcome.cells)
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    cmap = plt.get_cmap("plasma")
    concs = sorted(curves)
    for n, c in enumerate(concs):
        alphas = curves[c]
        positions = list(range(1, len(alphas) + 1))
        ax.plot(
            positions,
            alphas,
            marker="o",
            color=cmap(0.1 + 0.8 * n / max(len(concs) - 1, 1)),
            label=f"c={c}",
        )
    if not curves:
        ax.text(
            0.5,
            0.5,
            "no speculative cell measured",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("draft position i")
    ax.set_ylabel("alpha_i = P(accepted | earlier accepted)")
    title = (
        "acceptance per position"
        if per_position
        else ("acceptance (constant rate fitted to tokens per step: no per-position counts)")
    )
    ax.set_title(title, fontsize=10)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(True, alpha=0.3)
    if curves:
        ax.legend(fontsize=8)
    return _save(fig, path)


def write_plots(outcome: TuneOutcome) -> list[Path]:
    """Write the three figures into the tune folder; returns their paths."""
    heatmap, latency, acceptance = (outcome.out / name for name in PLOT_NAMES)
    return [
        speedup_heatmap(outcome, heatmap),
        latency_vs_concurrency(outcome, latency),
        acceptance_per_position(outcome, acceptance),
    ]

"""The step-cost model against published speed-ups (done-when 2), with the overfit check.

For every usable row of ``tests/data/published`` (acceptance length, concurrency and draft
length published): predicted speed-up from the row's own acceptance length with the engine
defaults; the median absolute error and rows on the wrong side of 1 (published outside
0.9-1.1). Then the same with a leave-one-source-out refit (each source predicted with engine
overheads fitted on the other sources only; the unfitted prior where its engine has no other
source), and a check that refitting on the whole table gives the shipped defaults. Last, an
out-of-sample trend: rows that publish a speed-up per batch size but no acceptance length of
their own (the EAGLE-3 paper's SGLang series), predicted from the reference acceptance length in
their notes with the shipped factors and without the per-sequence speculative cost.

    python benchmarks/predict_published.py [--folder tests/data/published]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", type=Path, default=ROOT / "tests/data/published")
    args = parser.parse_args()
    from spectool.predict.published import (
        FITTED,
        Evaluation,
        engine_factors,
        evaluate,
        fit_engine_defaults,
        leave_one_source_out,
        load_models,
        load_rows,
        predict_with_reference,
        skip_reason,
    )

    rows, models = load_rows(args.folder), load_models(args.folder)
    skipped = [r for r in rows if skip_reason(r)]
    shipped = evaluate(rows, models)
    loso = leave_one_source_out(rows, models)
    loso_by_id = {r.row_id: p for r, p in loso.rows}
    print(f"{len(shipped.rows)} usable rows of {len(rows)} ({len(skipped)} skipped)")
    print(
        f"{'row':42} {'engine':7} {'c':>3} {'k':>2} {'AL':>5} {'pub':>5} {'pred':>5} "
        f"{'err':>7} {'LOSO':>5} {'err':>7}"
    )
    for r, p in shipped.rows:
        lp = loso_by_id[r.row_id]
        print(
            f"{r.row_id:42} {r.engine:7} {r.concurrency:>3} {r.draft_len:>2} "
            f"{r.acceptance_length:5.2f} {r.speedup:5.2f} {p:5.2f} {p / r.speedup - 1:+7.1%} "
            f"{lp:5.2f} {lp / r.speedup - 1:+7.1%}"
        )

    def summary(name: str, ev: Evaluation) -> bool:
        wrong = ev.wrong_side()
        print(
            f"{name}: median |error| {ev.median_abs_error:.1%} (target <= 15%); wrong side of 1: "
            + (
                ", ".join(f"{r.row_id} (pub {r.speedup:.2f}, pred {p:.2f})" for r, p in wrong)
                or "none"
            )
        )
        return ev.median_abs_error <= 0.15 and not wrong

    print()
    ok = summary("engine defaults", shipped)
    summary("leave-one-source-out", loso)
    refit = fit_engine_defaults(rows, models)
    for engine, f in refit.items():
        shipped_f = engine_factors(engine)
        same = all(getattr(f, n) == getattr(shipped_f, n) for n in FITTED)
        print(
            f"refit {engine}: "
            + ", ".join(f"{n}={getattr(f, n):.3g}" for n in FITTED)
            + (" (= shipped defaults)" if same else " (differs from the shipped defaults)")
        )
    print()
    print("out of sample, batch trend (reference acceptance length from another run, notes):")
    print(f"{'row':24} {'engine':7} {'c':>3} {'refAL':>5} {'pub':>5} {'pred':>5} {'no-seq':>6}")
    for r in rows:
        if r.ref_acceptance_length is None or not r.source_id.startswith("eagle3-paper"):
            continue
        if r.concurrency is None or r.draft_len is None:
            continue
        f = engine_factors(r.engine)
        p = predict_with_reference(r, models)
        p0 = predict_with_reference(r, models, {r.engine: f.but(spec_seq_overhead_s=0.0)})
        print(
            f"{r.row_id:24} {r.engine:7} {r.concurrency:>3} {r.ref_acceptance_length:5.2f} "
            f"{r.speedup:5.2f} {p:5.2f} {p0:6.2f}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

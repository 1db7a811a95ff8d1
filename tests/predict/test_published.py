"""Done-when 2: the step-cost model against published speed-ups (tests/data/published).

Each usable row (acceptance length, concurrency and draft length published) is predicted from
its own acceptance length, its models' geometry (models.yaml), its GPU and its engine's default
factors: engine-level, never per row.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spectool.errors import BadInputError
from spectool.predict.cost import ENGINE_DEFAULTS
from spectool.predict.published import (
    EXTRA_ENGINES,
    FITTED,
    evaluate,
    fit_engine_defaults,
    geometry_from_published,
    load_models,
    load_rows,
    predict_row,
    predict_with_reference,
    skip_reason,
    usable,
)

PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "published"

# Rows predicted on the wrong side of 1, each with the reason found (see the README's
# "Predict before you rent"). The test fails if any other row joins them.
KNOWN_WRONG_SIDE = {
    # AngelSlim #163 published, for one tree (4 steps x topk 4, 16 verified tokens) and the same
    # acceptance length (2.54-2.58): 0.85x at c=1, 0.94x at 4, 0.99x at 8, 0.82x at 32, 1.06x
    # at 64. SGLang's per-sequence speculative cost (spec_seq_overhead_s, fitted: 0.1 ms) takes
    # c=32 from 1.47x to 1.23x and c=64 from 1.51x to 1.10x. Any cost that grows with the batch
    # lowers c=64 at least as much as c=32: to put c=32 below 1 it must be >= 0.25 ms/sequence,
    # which predicts c=64 at 0.78x (published 1.06x) and the EAGLE-3 paper's SGLang EAGLE-3 at
    # c=64 at 0.84x (published 1.38x, from the reference acceptance length); the fit rejects it.
    # 0.82x also lies below every speed-up the series published at c <= 8, so the tail of a
    # finite prompt set (fewer sequences running at the end) explains it only if SGLang's own
    # speed-up at a full batch of 32 were below 0.82x, which its 1.06x at 64 argues against.
    # Unexplained: kept as an exception, not tuned away.
    "as163-bs32-s4k4n16",
}


@pytest.fixture(scope="module")
def table() -> tuple[list, dict]:
    return load_rows(PUBLISHED), load_models(PUBLISHED)


def test_enough_usable_rows(table: tuple[list, dict]) -> None:
    rows, _ = table
    assert len(usable(rows)) >= 20
    assert len({r.source_id for r in usable(rows)}) >= 4


def test_median_error_and_side_of_one(table: tuple[list, dict]) -> None:
    rows, models = table
    ev = evaluate(rows, models)
    assert ev.median_abs_error <= 0.15, f"median |error| {ev.median_abs_error:.1%}"
    wrong = {r.row_id for r, _ in ev.wrong_side()}
    assert wrong <= KNOWN_WRONG_SIDE, f"predicted on the wrong side of 1: {wrong}"


def test_unusable_rows_say_why(table: tuple[list, dict]) -> None:
    rows, models = table
    skipped = [r for r in rows if skip_reason(r)]
    assert skipped  # the batch tables without acceptance lengths
    with pytest.raises(BadInputError, match="cannot predict"):
        predict_row(skipped[0], models)


def test_published_geometry_matches_published_totals(table: tuple[list, dict]) -> None:
    _, models = table
    llama = geometry_from_published(models["llama-3.1-8b-instruct"], "l", "bf16")
    # 8.03 B total, of which the input embedding (128256 x 4096) is not read per token
    assert llama.dense_params == pytest.approx(8.03e9 - 128256 * 4096, rel=0.01)
    qwen = geometry_from_published(models["qwen3-30b-a3b"], "q", "bf16")
    assert qwen.total_params == pytest.approx(30.53e9 - 151936 * 2048, rel=0.02)
    assert qwen.active_params == pytest.approx(3.35e9 - 151936 * 2048, rel=0.05)


def test_sglang_speedup_falls_with_batch_out_of_sample(table: tuple[list, dict]) -> None:
    """The EAGLE-3 paper's SGLang series (batch 2-64, no acceptance length of its own, so not
    in the fit): published speed-ups fall with batch (1.40 -> 0.99, 1.81 -> 1.38). From the
    reference acceptance length in the notes, the shipped factors fall too and end within 20 %;
    without the per-sequence speculative cost they would rise."""
    rows, models = table
    f = ENGINE_DEFAULTS["sglang"]
    assert f.spec_seq_overhead_s > 0
    no_seq = {"sglang": f.but(spec_seq_overhead_s=0.0)}
    for method in ("eagle", "eagle3"):
        series = {
            r.concurrency: r
            for r in rows
            if r.source_id == "eagle3-paper" and r.engine == "sglang" and r.method == method
        }
        lo, hi = series[2], series[64]
        assert hi.speedup < lo.speedup
        assert predict_with_reference(hi, models) < predict_with_reference(lo, models)
        assert predict_with_reference(hi, models) == pytest.approx(hi.speedup, rel=0.2)
        assert predict_with_reference(hi, models, no_seq) > predict_with_reference(
            lo, models, no_seq
        )
    with pytest.raises(BadInputError, match="reference"):
        predict_with_reference(next(r for r in rows if r.ref_acceptance_length is None), models)


def test_per_sequence_cost_needs_rows_at_several_concurrencies(table: tuple[list, dict]) -> None:
    """Batch-1 rows cannot tell a per-sequence cost from a per-step one: refitting the eager
    HF rows keeps it at 0 and gives the shipped factors back."""
    rows, models = table
    hf = fit_engine_defaults([r for r in rows if r.engine == "hf"], models)["hf"]
    assert hf.spec_seq_overhead_s == 0.0
    assert all(getattr(hf, n) == getattr(EXTRA_ENGINES["hf"], n) for n in FITTED)

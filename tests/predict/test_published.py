"""Done-when 2: the step-cost model against published speed-ups (tests/data/published).

Each usable row (acceptance length, concurrency and draft length published) is predicted from
its own acceptance length, its models' geometry (models.yaml), its GPU and its engine's default
factors: engine-level, never per row.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from spectool.errors import BadInputError
from spectool.predict.cost import ENGINE_DEFAULTS
from spectool.predict.interval import UNCERTAIN, interval
from spectool.predict.loso import FITTED, fit_engine_defaults
from spectool.predict.published import (
    CLOSED_SET,
    EXTRA_ENGINES,
    effective_batch,
    evaluate,
    geometry_from_published,
    load_models,
    load_rows,
    predict_row,
    predict_with_reference,
    row_setup,
    skip_reason,
    usable,
)

PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "published"


@pytest.fixture(scope="module")
def table() -> tuple[list, dict]:
    return load_rows(PUBLISHED), load_models(PUBLISHED)


def test_enough_usable_rows(table: tuple[list, dict]) -> None:
    rows, _ = table
    assert len(usable(rows)) >= 20
    assert len({r.source_id for r in usable(rows)}) >= 4


def test_in_sample_error_and_no_confident_wrong_side(table: tuple[list, dict]) -> None:
    """In sample (the shipped factors were fitted to these rows): median |error| <= 15 %, and
    no row published outside 0.85-1.15 has its whole 80 % interval on the other side of 1.
    (Out of sample: tests/predict/test_interval.py.)"""
    rows, models = table
    ev = evaluate(rows, models)
    assert ev.median_abs_error <= 0.15, f"median |error| {ev.median_abs_error:.1%}"
    confident = {
        r.row_id for r, p in ev.wrong_side((0.85, 1.15)) if interval(p).verdict != UNCERTAIN
    }
    assert not confident, f"confidently on the wrong side of 1: {confident}"


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


def test_engine_without_baselines_fits_its_overheads_on_speedups(table: tuple[list, dict]) -> None:
    """The eager HF rows (batch 1, no baseline rows) fit their iteration, speculative and
    per-layer overheads on their speed-ups alone and give the shipped factors back; no
    per-sequence cost is set for them."""
    rows, models = table
    hf = fit_engine_defaults([r for r in rows if r.engine == "hf"], models)["hf"]
    assert hf.spec_seq_overhead_s == 0.0
    assert all(getattr(hf, n) == getattr(EXTRA_ENGINES["hf"], n) for n in FITTED)


def test_closed_set_rows_carry_their_baseline_scale(table: tuple[list, dict]) -> None:
    """SpecForge's benchmark rows (threads over a finite prompt set) carry the baseline
    throughput at their concurrency over the same source's batch-1 baseline; others none."""
    rows, _ = table
    closed = {r.row_id: r for r in rows if r.load_kind == CLOSED_SET}
    assert {r.source_id for r in closed.values()} == {"angelslim-163", "specforge-339"}
    assert closed["as163-bs32-s4k4n16"].baseline_scale == pytest.approx(1128.3 / 218.89)
    assert closed["as163-bs1-s4k4n16"].baseline_scale == pytest.approx(1.0)
    assert all(r.baseline_scale is None for r in rows if r.load_kind != CLOSED_SET)


def test_effective_batch_inverts_the_baseline_gain(table: tuple[list, dict]) -> None:
    rows, models = table
    row = next(r for r in rows if r.row_id == "as163-bs32-s4k4n16")
    setup = row_setup(row, models)

    def gain(b: float) -> float:
        return b * setup.base_step(1) / setup.base_step(b)

    b = effective_batch(setup, 32, row.baseline_scale)
    assert 1 < b < 32
    assert gain(b) == pytest.approx(row.baseline_scale, rel=1e-6)
    # a source that scaled like a steady batch keeps its concurrency; one that did not, 1
    assert effective_batch(setup, 32, gain(32) * 1.5) == 32
    assert effective_batch(setup, 32, 0.5) == 1
    # the prediction uses the effective batch: the same as predicting a steady batch of b
    steady = replace(row, load_kind="batch", baseline_scale=None, concurrency=b)
    assert predict_row(row, models) == pytest.approx(predict_row(steady, models), rel=1e-9)


def test_closed_set_loads_are_read_from_the_baseline_series(table: tuple[list, dict]) -> None:
    """AngelSlim #163's c=32 and c=64 ran at nearly the same average decode batch (its
    baseline gained 5.2x and 5.7x over batch 1), which is why its 0.82x and 1.06x cannot both
    be met by a model monotone in load (the 80 % interval of the c=32 row straddles 1)."""
    rows, models = table
    series = {
        r.concurrency: r for r in rows if r.source_id == "angelslim-163" and "s4k4n16" in r.row_id
    }
    loads = {
        c: effective_batch(row_setup(r, models), c, r.baseline_scale)
        for c, r in series.items()
        if c > 1
    }
    assert loads[4] < loads[8] < loads[32] < loads[64] < 10
    assert loads[64] / loads[32] < 1.2


def test_closed_set_row_without_a_batch_one_baseline_is_skipped(tmp_path: Path) -> None:
    import csv

    with (PUBLISHED / "results.csv").open(encoding="utf-8", newline="") as fh:
        raw = list(csv.DictReader(fh))
    raw = [r for r in raw if not (r["source_id"] == "angelslim-163" and r["concurrency"] == "1")]
    with (tmp_path / "results.csv").open("w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(raw[0]))
        w.writeheader()
        w.writerows(raw)
    row = next(r for r in load_rows(tmp_path) if r.row_id == "as163-bs32-s4k4n16")
    assert skip_reason(row) == "closed-set row without the source's baseline at concurrency 1"


def test_disagreeing_batch_one_baselines_are_an_error(tmp_path: Path) -> None:
    text = (PUBLISHED / "results.csv").read_text(encoding="utf-8")
    assert text.count(",218.89,185.28,") == 1
    (tmp_path / "results.csv").write_text(text.replace(",218.89,185.28,", ",230.0,185.28,"))
    with pytest.raises(BadInputError, match="batch-1 baseline"):
        load_rows(tmp_path)

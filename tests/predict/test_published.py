"""Done-when 2: the step-cost model against published speed-ups (tests/data/published).

Each usable row (acceptance length, concurrency and draft length published) is predicted from
its own acceptance length, its models' geometry (models.yaml), its GPU and its engine's default
factors: engine-level, never per row.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spectool.errors import BadInputError
from spectool.predict.published import (
    evaluate,
    geometry_from_published,
    load_models,
    load_rows,
    predict_row,
    skip_reason,
    usable,
)

PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "published"

# Rows predicted on the wrong side of 1, each with the reason found (see the README's
# "Predict before you rent"). The test fails if any other row joins them.
KNOWN_WRONG_SIDE = {
    # Published 0.99x at c=8, 0.82x at c=32, 1.06x at c=64 for the same tree: the source's own
    # series dips at 32 and recovers; no cost term does that (SGLang's CUDA graphs stop at a
    # batch size boundary, not modelled).
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

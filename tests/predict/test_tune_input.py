"""Acceptance and step points read from a tune run's tune.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectool.errors import BadInputError
from spectool.predict.tune_input import acceptance_from_tune, step_points_from_tune


def _cell(c: int, k: int, positions: tuple[list[int], list[int]] | None, steps: int) -> dict:
    raw = {
        "iterations": [
            {
                "draft_ms": 1.0,
                "verify_ms": 5.0 + k,
                "coord_ms": 0.1,
                "batch_size": c,
                "confirmed_tokens": c,
            }
            for _ in range(steps)
        ],
        "positions": None
        if positions is None
        else {"accepted_per_pos": positions[0], "reached_per_pos": positions[1]},
    }
    return {"concurrency": c, "k": k, "raw": raw}


@pytest.fixture
def tune_json(tmp_path: Path) -> Path:
    path = tmp_path / "tune.json"
    cells = [
        _cell(1, 0, None, 3),
        _cell(1, 2, ([80, 40], [100, 80]), 2),
        _cell(8, 3, ([160, 120, 60], [200, 160, 120]), 2),
    ]
    path.write_text(json.dumps({"format": "spectool.tune/1", "cells": cells}))
    return path


def test_pooled_acceptance(tune_json: Path) -> None:
    acc = acceptance_from_tune(tune_json)
    assert acc.alphas == pytest.approx((240 / 300, 160 / 240, 60 / 120))
    assert acc.max_k == 3 and "2 cells" in acc.source
    at8 = acceptance_from_tune(tune_json, concurrency=8)
    assert at8.alphas == pytest.approx((0.8, 0.75, 0.5))
    with pytest.raises(BadInputError, match="no per-position acceptance measured at conc"):
        acceptance_from_tune(tune_json, concurrency=64)


def test_step_points(tune_json: Path) -> None:
    points = step_points_from_tune(tune_json)
    assert (1, 1.0, 5.0) in points and (8, 4.0, 8.0) in points
    assert len(points) == 7


def test_bad_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "tune.json"
    bad.write_text("[1, 2]")
    with pytest.raises(BadInputError, match=r"tune.json: no 'cells' list"):
        acceptance_from_tune(bad)
    bad.write_text("{")
    with pytest.raises(BadInputError, match="cannot read tune.json"):
        step_points_from_tune(bad)

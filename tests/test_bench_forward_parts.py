"""benchmarks/forward_parts.py splits the demo target's forwards by the C step's profile: every
figure it prints is a real measurement whose products fit inside their forward."""

from __future__ import annotations

import pytest
from bench_support import load_benchmark

from spectool.engine import native_step

forward_parts = load_benchmark("forward_parts.py")


@pytest.mark.skipif(native_step.library() is None, reason="needs the C step")
def test_each_forward_splits_into_its_products_and_the_rest() -> None:
    got = forward_parts.measure(rounds=1, prefill_tokens=24, context=20, batch=3)
    assert set(got) == set(forward_parts.FIELDS)
    for name in ("prefill", "batch", "one"):
        assert 0 < got[name + "_products"] < got[name]
    # a 24-row prefill multiplies 24 rows by every weight, a batch-1 decode step one
    assert got["prefill_products"] > 3 * got["one_products"]
    text = forward_parts.line("this", got)
    assert text.split()[:2] == ["this", "prefill"] and f"{got['prefill']:7.3f}".strip() in text

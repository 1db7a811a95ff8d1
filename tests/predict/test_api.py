"""The integration API: setup from checkpoints, words, JSON, calibration, the CPU probe."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from spectool.ckpt.inspect import inspect_folder
from spectool.ckpt.refs import builtin_path
from spectool.errors import BadInputError
from spectool.predict import (
    ENGINE_DEFAULTS,
    Acceptance,
    Hardware,
    as_dict,
    describe,
    fit_step_points,
    forward_cost,
    geometry_from_checkpoint,
    predict,
    setup_for,
)
from spectool.profiles import load_gpu


@pytest.fixture(scope="module")
def demo_setup():
    target = inspect_folder(builtin_path("demo-target"))
    drafter = inspect_folder(builtin_path("demo-drafter"))
    return setup_for(target, "draft_model", load_gpu("l4"), drafter=drafter, engine="vllm")


def test_setup_from_checkpoints_and_words(demo_setup) -> None:
    assert demo_setup.target.num_layers == 12
    assert demo_setup.drafter is not None and demo_setup.drafter.num_layers == 1
    lines = describe(predict(demo_setup, None, concurrencies=(1, 8)))
    assert len(lines) == 2
    assert all(line.startswith(("c=1:", "c=8:")) for line in lines)
    assert all("tokens per step" in line or "cannot pay" in line for line in lines)
    acc = Acceptance.from_length(2.5, 4, "--acceptance-length")
    lines = describe(predict(demo_setup, acc, concurrencies=(1, 8), ks=range(1, 5)))
    assert "best k=" in lines[0]
    # the break-even line reads point estimates and says so: it never calls a concurrency
    # whose interval straddles 1 "pays"
    assert lines[-1].startswith(("no draft length is predicted", "predicted faster than no"))
    assert lines[-1].endswith("(point estimates)")


def test_json_is_serializable(demo_setup) -> None:
    acc = Acceptance.from_rate(0.6, "published: https://example.org")
    obj = as_dict(predict(demo_setup, acc, concurrencies=(1, 64), ks=range(1, 4)))
    text = json.dumps(obj)
    assert obj["predicted"] is True
    assert obj["acceptance"]["source"] == "published: https://example.org"
    assert [row["concurrency"] for row in obj["concurrency"]] == [1, 64]
    assert len(obj["concurrency"][0]["ks"]) == 3
    assert "speedup" in text


def test_words_and_json_follow_the_interval(demo_setup) -> None:
    """A prediction whose whole 80 % interval is under 1 "does not pay" (JSON: does_not_pay,
    the spelling of tune's cell verdicts); one whose interval straddles 1 is uncertain."""
    slow = demo_setup.factors.but(draft_step_overhead_s=20e-3)  # a drafter far too slow
    setup = setup_for(
        demo_setup.target,
        "draft_model",
        demo_setup.hardware,
        drafter=demo_setup.drafter,
        engine=slow,
    )
    acc = Acceptance.from_length(1.5, 2, "--acceptance-length")
    pred = predict(setup, acc, concurrencies=(1,), ks=(1, 2))
    assert pred.at(1).best is not None and (pred.at(1).best.speedup or 9) * 1.10 < 1.0
    assert describe(pred)[0].startswith("c=1: speculation does not pay: best k=")
    assert as_dict(pred)["concurrency"][0]["verdict"] == "does_not_pay"
    straddle = describe(predict(demo_setup, acc, concurrencies=(1,), ks=(1, 2)))[0]
    obj = as_dict(predict(demo_setup, acc, concurrencies=(1,), ks=(1, 2)))["concurrency"][0]
    best = next(k for k in obj["ks"] if k["k"] == obj["best_k"])
    low, high = best["speedup_interval"]
    assert (obj["verdict"] == "uncertain") == (low <= 1.0 <= high)
    assert ("uncertain" in straddle) == (obj["verdict"] == "uncertain")


def test_unknown_engine_is_one_line_error(demo_setup) -> None:
    with pytest.raises(BadInputError, match="engine 'tgi' not in"):
        setup_for(demo_setup.target, "eagle3", load_gpu("l4"), engine="tgi")


def test_refit_recovers_factors_from_step_points() -> None:
    geom = geometry_from_checkpoint(inspect_folder(builtin_path("demo-target")))
    hw = Hardware("synthetic", 50e9, 60e9)
    truth = ENGINE_DEFAULTS["torch-cpu"].but(bw_fraction=0.6, layer_overhead_s=50e-6)
    points = [
        (b, t, forward_cost(geom, hw, truth, b, t, 100).seconds * 1e3)
        for b, t in ((1, 1), (4, 1), (8, 1), (1, 5), (8, 5), (16, 3))
    ]
    fit = fit_step_points(
        geom,
        hw,
        ENGINE_DEFAULTS["torch-cpu"],
        points,
        context=100,
        names=("bw_fraction", "layer_overhead_s"),
    )
    assert fit.factors.bw_fraction == pytest.approx(0.6)
    assert fit.factors.layer_overhead_s == pytest.approx(50e-6)
    assert fit.loss < 1e-9 and fit.fitted == ("bw_fraction", "layer_overhead_s")
    assert "bw_fraction=0.6" in fit.describe()
    with pytest.raises(BadInputError, match="cannot fit"):
        fit_step_points(geom, hw, truth, points[:1], context=100)


def test_predict_imports_neither_torch_nor_numpy() -> None:
    code = (
        "import sys, spectool.predict, spectool.predict.published;"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cpu_probe_measures_positive_factors() -> None:
    from spectool.predict.probe import GRID, probe_cpu

    geom = geometry_from_checkpoint(inspect_folder(builtin_path("demo-drafter")))
    result = probe_cpu(
        geom,
        intermediate_size=512,
        num_kv_heads=1,
        vocab_size=4096,
        context=32,
        repeats=2,
        passes=1,
    )
    assert result.hardware.bandwidth > 1e8 and result.hardware.flops16 > 1e7
    assert result.factors.layer_overhead_s >= 0 and result.factors.forward_overhead_s >= 0
    assert not result.factors.overlap
    # the embedded engine's draft forwards are probed as forwards: no fitted per-draft-step cost
    # (the GPU engines' draft_step_overhead_s), so the CPU prediction is what it was
    assert result.factors.draft_step_overhead_s == 0.0
    assert set(result.layer_ms) == set(GRID)
    assert "GB/s" in result.describe()

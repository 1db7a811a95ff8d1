"""The deployment at the users' arrival rates (``tune --request-rate``, trace replays).

Blocks: both arms of a pair get the same send times and prompts, pairs differ, passes cover the
workload, a trace is replayed in windows at its own pace. The verdict follows the arm that is
slower (requests built with known latencies: the decision logic, not a measurement). End to end
on tiny real models: rates and a trace measured, saved, resumed without measuring again,
written to decision.json and the build's manifest, and read by serve's gate.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from spectool.cli.app import main
from spectool.decide.latency import RequestRecord
from spectool.deploy.decision import parse_decision
from spectool.deploy.launch import prepare_serve
from spectool.deploy.manifest import read_manifest
from spectool.errors import BadInputError
from spectool.measure.trial import TrialConfig, TrialResult
from spectool.measure.workloads import Prompt
from spectool.tuning import capacity, rates
from spectool.tuning.rates import (
    RateLevel,
    block_config,
    measure_level,
    parse_rates,
    rate_levels,
    report_lines,
    stops_paying,
)
from spectool.tuning.trials import CellPlan

PLAN = CellPlan("torch", "draft_model", "fp", "wid", num_prompts=8, max_tokens=8)
OPTIONS = {"threshold": 1.0, "confidence": 0.95, "seed": 0, "budget_s": 0.0, "objective": "tpot"}


def test_both_arms_of_a_pair_get_the_same_arrivals_and_prompts() -> None:
    level = RateLevel(2.0, burstiness=0.5)
    a = block_config(PLAN, level, 0, 3, True)
    b = block_config(PLAN, level, 0, 3, False)
    assert (a.seed, a.prompt_indices, a.burstiness, a.num_prompts) == (
        b.seed,
        b.prompt_indices,
        b.burstiness,
        b.num_prompts,
    )
    assert a.label != b.label and "deployed" in a.label and "none k=0" in b.label
    assert block_config(PLAN, level, 0, 4, True).seed != a.seed
    assert block_config(PLAN, level, 1, 3, True).seed != a.seed  # another level, other draws
    # a block is >= 16 requests, so every pair covers the 8-prompt workload twice
    assert a.num_prompts == 16 and set(a.prompt_indices) == set(range(8))
    assert block_config(PLAN, RateLevel(10.0), 0, 0, True).num_prompts == 40  # 4 s of arrivals


def test_a_trace_is_replayed_in_windows_at_its_own_pace(monkeypatch) -> None:
    monkeypatch.setattr(rates, "TRACE_BLOCK_REQUESTS", 4)
    times = [0.0, 0.5, 0.6, 2.0, 3.0, 3.1, 3.2, 9.0]
    prompts = [Prompt(f"p{i}", "c", f"text {i}", arrival_s=t) for i, t in enumerate(times)]
    (level,) = rate_levels((), 1.0, prompts)
    assert level.trace and level.rate_per_s == pytest.approx(7 / 9.0)
    first = block_config(PLAN, level, 0, 0, True, times)
    second = block_config(PLAN, level, 0, 1, False, times)
    assert first.prompt_indices == (0, 1, 2, 3) and first.arrivals_s == (0.0, 0.5, 0.6, 2.0)
    assert second.prompt_indices == (4, 5, 6, 7)
    assert second.arrivals_s == pytest.approx((0.0, 0.1, 0.2, 6.0))
    assert block_config(PLAN, level, 0, 2, True, times).prompt_indices == (0, 1, 2, 3)


def test_rates_are_parsed_and_checked() -> None:
    assert parse_rates("8, 2,4") == (2.0, 4.0, 8.0)
    assert parse_rates(None) == ()
    for bad in ("2,x", "0", "-1", "2,2", "inf"):
        with pytest.raises(BadInputError, match="--request-rate"):
            parse_rates(bad)
    with pytest.raises(BadInputError, match="--burstiness"):
        rate_levels((2.0,), 0.0, [])
    same = [Prompt("a", "c", "a", arrival_s=1.0), Prompt("b", "c", "b", arrival_s=1.0)]
    with pytest.raises(BadInputError, match="distinct timestamps"):
        rate_levels((), 1.0, same)


def _trial(config: TrialConfig, tpot_s: float) -> TrialResult:
    """A block whose every request streams 8 tokens at ``tpot_s`` after a 20 ms first token."""
    records = []
    for i in range(config.num_prompts):
        send = 0.05 * i
        first = send + 0.02
        chunks = tuple(first + tpot_s * j for j in range(8))
        records.append(
            RequestRecord(f"r{i}", "c", send, first, chunks, (1,) * 8, chunks[-1], 10, 8)
        )
    wall = records[-1].end_time_s
    return TrialResult(config, tuple(records), ("usage",) * len(records), (), (), wall, "now")


@pytest.mark.parametrize(("slow", "verdict"), [(True, "does_not_pay"), (False, "pays")])
def test_the_verdict_follows_the_slower_arm(slow: bool, verdict: str) -> None:
    """Inject a slow deployed arm (TPOT 30% above the baseline's, with noise per pair): the
    level is proven slower; a fast one (30% below) is proven to pay."""
    calls: list[tuple[int, bool]] = []

    def run_block(config: TrialConfig, deployed: bool) -> TrialResult:
        calls.append((len(calls), deployed))
        jitter = 1.0 + 0.03 * ((len(calls) * 7) % 5 - 2) / 2
        base = 0.010 * jitter
        return _trial(config, base * (1.3 if slow else 0.7) if deployed else base)

    cell = measure_level(
        PLAN,
        RateLevel(4.0),
        0,
        run_block,
        level_key=4,
        k=3,
        options=OPTIONS,
    )
    assert cell.estimate.verdict == verdict
    assert cell.pairs >= 4 and len(calls) == 2 * cell.pairs
    assert [d for _, d in calls[:4]] == [True, False, False, True]  # A B, B A
    assert (stops_paying([cell]) is cell) == slow
    text = "\n".join(report_lines([cell], "tpot"))
    assert ("stops paying" in text) == slow
    assert cell.base["tpot_p50_ms"] == pytest.approx(10.0, rel=0.05)


def _run_json(args: list[str]) -> dict[str, Any]:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(args)
    assert code == 0
    return json.loads(buffer.getvalue())


def test_a_rate_level_and_capacity_end_to_end_resumed_and_served(
    tmp_path: Path, monkeypatch
) -> None:
    """On the demo pair and its built-in prompts (where speculation pays at concurrency 1, so
    there is a deployment to measure): a rate level as a paired cell of real open-loop blocks.
    A trace level differs only by its blocks (tested above) and the send times the runner
    replays (tests/measure/test_runner.py). The objective is steps (the engine's decode steps
    per token): at 8 tokens per request a request's wall time is mostly prefill and HTTP, where
    on a loaded machine tpot left nothing deployed, hence no rate level, in 2 runs of 3 (3 in 6
    while another benchmark ran) and goodput one run in two; the levels' blocks and estimate are
    the same for every objective, only the source read differs (tpot and goodput end to end:
    tests/tune/test_goodput_tune.py and the tune tests)."""
    monkeypatch.setattr(rates, "BLOCK_SECONDS", 0.25)  # short blocks: a test, not a study
    monkeypatch.setattr(rates, "MIN_BLOCK_REQUESTS", 8)
    monkeypatch.setattr(capacity, "MAX_PROBES", 3)
    out = tmp_path / "run"
    args = [
        "tune",
        "spectool:demo-target",
        "spectool:demo-drafter",
        "--engine",
        "torch",
        "--max-draft-len",
        "2",
        "--concurrency",
        "1",
        "--num-prompts",
        "8",
        "--max-tokens",
        "8",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--out",
        str(out),
        "--request-rate",
        "16",
        "--budget",
        "1",
        "--capacity",
        "--slo",
        "tpot:40ms@p90",
        "--objective",
        "steps",
        "--json",
    ]
    first = _run_json(args)
    levels = first["rates"]
    assert [(lv["trace"], lv["rate_per_s"]) for lv in levels] == [(False, 16.0)]
    for lv in levels:
        assert lv["pairs"] >= 4 and lv["verdict"] in ("pays", "does_not_pay", "inconclusive")
        assert lv["base"]["requests"] > 0 and lv["spec"]["in_flight"] > 0
    found = first["capacity"]
    assert found["slo"] == ["tpot:40ms@p90"] and len(found["probes"]) == 3
    rates_seen = [p["rate_per_s"] for p in found["probes"]]
    assert rates_seen[0] == pytest.approx(found["start_req_per_s"])
    for arm in ("deployed", "baseline"):  # each arm's bracket agrees with its probes
        lo = found[arm]["sustains_req_per_s"] or 0.0
        hi = found[arm]["fails_at_req_per_s"] or float("inf")
        for p in found["probes"]:
            inside = lo < p["rate_per_s"] < hi
            assert not inside  # every probe narrowed the bracket it fell in
    probes = (out / "capacity" / "trials.jsonl").read_text().splitlines()
    assert len(probes) == 6
    saved = (out / "rates" / "trials.jsonl").read_text().splitlines()
    assert len(saved) == 2 * sum(lv["pairs"] for lv in levels)
    again = _run_json([*args, "--resume"])
    assert (out / "rates" / "trials.jsonl").read_text().splitlines() == saved  # none measured
    assert (out / "capacity" / "trials.jsonl").read_text().splitlines() == probes
    assert again["capacity"] == found
    assert [lv["objective_ratio"] for lv in again["rates"]] == [
        lv["objective_ratio"] for lv in levels
    ]
    decision = parse_decision(json.loads((out / "decision.json").read_text()), "decision.json")
    assert len(decision.rates) == 1 and decision.rates_objective == "steps"
    assert read_manifest(out).decision.rates  # the build in DIR was written again, with them
    plan = prepare_serve(out, expected_rate=8.0, port=8123)
    assert "16 req/s" in plan.gate.reason
    assert (
        plan.gate.speculate
        == (
            levels[0]["verdict"] == "pays"
            or (levels[0]["verdict"] == "inconclusive" and levels[0]["objective_ratio"] < 1)
        )
        or not decision.speculates_anywhere
    )
    assert {"rates.json", "rates.png", "capacity.png"} <= {p.name for p in out.iterdir()}
    report = (out / "report.md").read_text()
    assert "## At your arrival rates" in report and "## Capacity at the SLO" in report
    assert json.loads((out / "decision.json").read_text())["capacity"]["slo"] == found["slo"]


def test_rates_and_capacity_are_refused_on_tensorrt_llm_before_measuring() -> None:
    from spectool.decide.slo import parse_slo
    from spectool.tuning.request import TuneRequest, resolve

    base = {"target": "spectool:demo-target", "drafter": "spectool:demo-drafter"}
    with pytest.raises(BadInputError, match="--request-rate"):
        resolve(TuneRequest(**base, engine="trtllm", request_rates=(2.0,)))
    with pytest.raises(BadInputError, match="--capacity"):
        resolve(TuneRequest(**base, engine="trtllm", capacity=True, slo=parse_slo("tpot:30")))
    with pytest.raises(BadInputError, match="give both"):
        resolve(TuneRequest(**base, engine="torch", capacity=True))


def test_a_report_section_is_replaced_in_place_or_appended(tmp_path: Path) -> None:
    from spectool.tuning.deployed import add_to_decision, put_report_section

    report = tmp_path / "report.md"
    report.write_text("# tune\n\n## At your arrival rates\n\nold\n\n## Capacity at the SLO\n\nc\n")
    put_report_section(tmp_path, ["## At your arrival rates", "", "new"])
    assert report.read_text() == (
        "# tune\n\n## At your arrival rates\n\nnew\n\n## Capacity at the SLO\n\nc\n"
    )
    put_report_section(tmp_path, ["## Later", "", "x"])
    assert report.read_text().endswith("\n\nc\n\n## Later\n\nx\n")
    assert put_report_section(tmp_path / "none", ["## A"]) == []
    (tmp_path / "decision.json").write_text('{"schedule": {"1": 2}}')
    add_to_decision(tmp_path, {"rates": []})
    assert json.loads((tmp_path / "decision.json").read_text()) == {
        "schedule": {"1": 2},
        "rates": [],
    }

"""``spectool tune`` end to end on tiny real models: interrupted, resumed, every output checked.

One run is stopped with SIGTERM after its first saved trial (a real interruption of a real
process), then resumed in-process with ``--resume``; the tests check what the resumed run
measured, what it wrote, and that a folder with results is refused without ``--resume``.
With two concurrencies and ``--max-draft-len 2`` the search's initial plan (baselines, k=2 at
both ends, k=1 at the smallest) is five of the grid's six cells.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from spectool.cli.app import main
from spectool.decide.model import break_even_concurrency, capped_choices
from spectool.decide.verdict import TIE_MARGIN
from spectool.deploy.decision import parse_decision
from spectool.deploy.manifest import read_manifest

CONCURRENCIES = (1, 2)
MAX_DRAFT_LEN = 2
GRID_TRIALS = len(CONCURRENCIES) * (MAX_DRAFT_LEN + 1)
FIRST_TRIAL_DEADLINE_S = 180.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MARKER_ENV = "SPECTOOL_TUNE_TEST_MARKER"


def tune_args(models: tuple[Path, Path], workload: Path, out: Path) -> list[str]:
    target, drafter = models
    return [
        "tune",
        str(target),
        str(drafter),
        "--engine",
        "torch",
        "--max-draft-len",
        str(MAX_DRAFT_LEN),
        "--concurrency",
        ",".join(map(str, CONCURRENCIES)),
        "--workload",
        str(workload),
        "--num-prompts",
        "4",
        "--max-tokens",
        "8",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--budget",  # seconds per cell: the pairs the assertions need, not the default 30 s
        "1",
        "--out",
        str(out),
    ]


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines(keepends=True) if path.exists() else []


def _marked_processes(marker: str) -> list[int]:
    """Live processes of ours whose environment carries ``marker`` (the CLI and its worker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if f"{MARKER_ENV}={marker}".encode() in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def _run_json(args: list[str]) -> tuple[int, dict[str, Any] | None]:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(args)
    text = buffer.getvalue()
    return code, (json.loads(text) if code == 0 else None)


@pytest.fixture(scope="module")
def tuned(
    tune_models: tuple[Path, Path], tune_workload: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """A run interrupted (SIGTERM) after its first saved trial, then resumed in-process."""
    out = tmp_path_factory.mktemp("tune") / "run"
    args = tune_args(tune_models, tune_workload, out)
    marker = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-m", "spectool.cli.app", *args],
        env={**os.environ, MARKER_ENV: marker},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    trials = out / "trials.jsonl"
    deadline = time.monotonic() + FIRST_TRIAL_DEADLINE_S
    while not _lines(trials) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    before = _lines(trials)
    leftover = _marked_processes(marker)
    code, summary = _run_json([*args, "--resume", "--json"])
    return {
        "out": out,
        "args": args,
        "interrupted_code": proc.returncode,
        "interrupted_stderr": stderr,
        "leftover": leftover,
        "before": before,
        "code": code,
        "summary": summary,
    }


def test_sigterm_stops_cleanly_and_keeps_finished_trials(tuned: dict[str, Any]) -> None:
    assert tuned["interrupted_code"] == 130, tuned["interrupted_stderr"]
    # stderr is no terminal here: progress comes as plain lines, from the first cell on
    assert "cell 1: concurrency 1, baseline (no speculation)" in tuned["interrupted_stderr"]
    assert "--resume" in tuned["interrupted_stderr"]
    assert tuned["leftover"] == [], "a server process outlived the interrupted tune"
    assert 1 <= len(tuned["before"]) < GRID_TRIALS
    assert all(line.endswith("\n") for line in tuned["before"])


def test_resume_redoes_no_finished_trial(tuned: dict[str, Any]) -> None:
    assert tuned["code"] == 0
    summary = tuned["summary"]
    before = tuned["before"]
    after = _lines(tuned["out"] / "trials.jsonl")
    used = summary["runs"]["used"]
    # the planned cells at least: both baselines, K at concurrencies 1 and 2, 1 at concurrency 1
    assert 5 <= used <= GRID_TRIALS == summary["runs"]["full_grid"]
    # every trial of the decision: one per baseline cell, two per pair of a paired cell
    cells = json.loads((tuned["out"] / "decision.json").read_text())["cells"]
    assert {c["design"] for c in cells} == {"interleaved"}
    expected = len(CONCURRENCIES) + sum(2 * c["pairs"] for c in cells)
    assert summary["runs"]["trials_measured_now"] == len(after) - len(before)
    assert after[: len(before)] == before  # the saved trials were kept as they were
    assert len(after) == expected
    trials = [json.loads(line) for line in after]
    assert len({t["key"] for t in trials}) == expected  # no trial measured twice
    for cell in cells:  # each pair: the speculative block and the baseline block beside it
        c, k = cell["concurrency"], cell["k"]
        labels = [t["config"]["label"] for t in trials if t["config"]["concurrency"] == c]
        for i in range(cell["pairs"]):
            assert sum(f"k={k} #p{i} " in x for x in labels) == 1
            assert sum(f"k=0 #p{i}/k{k} " in x for x in labels) == 1


def _saved_estimate(trials_path: Path, cell: dict[str, Any]) -> float:
    """The cell's ratio recomputed from its pairs' baseline blocks in ``trials.jsonl``: their
    tokens and decode times (the weights) and prompts (the strata)."""
    import numpy as np

    from spectool.decide.pair_stats import fit_pairs

    c, k = cell["concurrency"], cell["k"]
    trials = [json.loads(line) for line in _lines(trials_path)]
    tokens, times, bags = [], [], []
    for i in range(cell["pairs"]):
        (base,) = [
            t
            for t in trials
            if t["config"]["concurrency"] == c and f"k=0 #p{i}/k{k} " in t["config"]["label"]
        ]
        used = [r for r in base["records"] if r["output_tokens"] >= 2]
        tokens.append(sum(r["output_tokens"] - 1 for r in used))
        times.append(sum(r["end_time_s"] - r["first_token_time_s"] for r in used))
        bags.append(tuple(sorted(base["config"]["prompt_indices"])))
    labels = {bag: n for n, bag in enumerate(dict.fromkeys(bags))}
    logs = np.log(np.array(cell["pair_ratios"]))
    fit = fit_pairs(logs, np.array(tokens, float), [labels[b] for b in bags], np.array(times))
    assert fit.strata == cell["strata"] and list(fit.set_aside) == cell["set_aside"]
    return fit.ratio


def test_decision_json_is_valid_and_consistent(tuned: dict[str, Any]) -> None:
    out = tuned["out"]
    data = json.loads((out / "decision.json").read_text())
    decision = parse_decision(data, out / "decision.json")  # what build and serve read
    assert data["engine"] == "torch"
    assert data["method"] == "draft_model"
    assert sorted(decision.schedule) == list(CONCURRENCIES)
    cells = {(c["concurrency"], c["k"]): c for c in data["cells"]}
    runs = data["runs"]
    assert runs["full_grid"] == GRID_TRIALS
    assert {(1, MAX_DRAFT_LEN), (2, MAX_DRAFT_LEN), (1, 1)} <= set(cells)  # planned ones
    assert len(cells) == runs["used"] - len(CONCURRENCIES)  # ... and no baseline among them
    for cell in cells.values():
        assert set(cell) == {
            "concurrency",
            "k",
            "lhs_ms_per_token",
            "rhs_ms_per_token",
            "ratio",
            "ci_low",
            "ci_high",
            "verdict",
            "tie_with_off",
            "design",
            "pairs",
            "pair_ratios",
            "spread",
            "within_se",
            "drift_base",
            "drift_spec",
            "looks",
            "rest_looks",
            "prompts_covered",
            "workload_prompts",
            "set_aside",
            "strata",
        }
        # the paired estimate: the mean of the pairs' ratios weighted by their baseline blocks'
        # tokens and decode times as saved in trials.jsonl (pairs of different prompts by time,
        # of the same prompts by tokens; lhs and rhs are both arms pooled, so their quotient
        # only approximates it), over whole passes of the workload
        assert cell["design"] == "interleaved" and len(cell["pair_ratios"]) == cell["pairs"]
        kept = [r for i, r in enumerate(cell["pair_ratios"]) if i not in cell["set_aside"]]
        assert len(cell["set_aside"]) <= cell["pairs"] // 8  # pairs set aside as disturbed
        assert min(kept) <= cell["ratio"] <= max(kept)
        assert cell["ratio"] == pytest.approx(_saved_estimate(out / "trials.jsonl", cell))
        assert cell["prompts_covered"] == cell["workload_prompts"] > 0
        tie = 1.0 - TIE_MARGIN <= cell["ci_low"] and cell["ci_high"] <= 1.0 + TIE_MARGIN
        assert cell["tie_with_off"] == (cell["verdict"] == "inconclusive" and tie)
        assert cell["ci_low"] <= cell["ci_high"]
        expected = (
            "pays"
            if cell["ci_high"] < 1
            else "does_not_pay"
            if cell["ci_low"] > 1
            else "inconclusive"
        )
        assert cell["verdict"] == expected
    first = min(decision.schedule)

    def gains(cell: dict) -> bool:
        """Measured to pay, or an uncertain gain (inconclusive, its estimate below 1 and its
        interval wider than 1 +- the tie margin, ``tie_with_off`` checked above: deployed on
        its estimate, spectool.decide.choose.unproven_gain)."""
        return cell["verdict"] == "pays" or (
            cell["verdict"] == "inconclusive" and cell["ratio"] < 1.0 and not cell["tie_with_off"]
        )

    for c, k in decision.schedule.items():
        if k > 0 and c == first and not gains(cells[(c, k)]):
            # an undecided first cell, kept only because it lets a larger concurrency use a
            # cell that gains
            assert cells[(c, k)]["verdict"] == "inconclusive"
            assert any(
                kk > 0 and gains(cells[(cc, kk)])
                for cc, kk in decision.schedule.items()
                if cc != first
            )
        elif k > 0:  # otherwise only a cell measured to gain is ever chosen
            assert gains(cells[(c, k)])
        else:  # off: no measured cell paid, or the schedule's cap ruled it out
            paying = [
                kk for (cc, kk), cell in cells.items() if cc == c and cell["verdict"] == "pays"
            ]
            assert not paying or min(paying) > decision.schedule[min(decision.schedule)]
    assert decision.schedule == capped_choices(decision.schedule)
    assert data["break_even_concurrency"] == break_even_concurrency(decision.schedule)
    assert data["max_draft_len"] == decision.schedule[min(decision.schedule)]


def test_engine_config_carries_the_decision(tuned: dict[str, Any]) -> None:
    from spectool.engine.engine import EngineConfig, scheduled_draft_len

    out = tuned["out"]
    decision = parse_decision(json.loads((out / "decision.json").read_text()), "decision.json")
    manifest = read_manifest(out)  # the tune folder is a build folder spectool serve runs
    assert manifest.engine == "torch"
    assert manifest.decision is not None
    spec = json.loads((out / "speculative.json").read_text())
    base = json.loads((out / "baseline.json").read_text())
    schedule = spec.get("draft_len_schedule")
    fields = {
        **spec,
        "draft_len_schedule": {int(b): k for b, k in schedule.items()} if schedule else None,
    }
    config = EngineConfig(**fields)  # the embedded engine accepts it
    assert base["method"] == "none" and "max_draft_len" not in base
    assert base["max_batch_size"] == spec["max_batch_size"]
    assert None not in spec.values()  # no null limit beside the gate that is written
    assert manifest.decision.source == "decision.json"  # inside the folder: relative
    if decision.speculates_anywhere:
        for c in CONCURRENCIES:  # the written gate gives each measured concurrency its choice
            k = scheduled_draft_len(
                c, config.max_draft_len, config.draft_len_schedule, config.max_concurrency
            )
            assert k == decision.schedule[c]


def test_tune_json_report_and_plots(tuned: dict[str, Any]) -> None:
    out = tuned["out"]
    record = json.loads((out / "tune.json").read_text())
    decision = json.loads((out / "decision.json").read_text())
    assert record["format"] == "spectool.tune/1"
    assert record["decision"] == decision
    assert record["runs"]["trials_measured_now"] == tuned["summary"]["runs"]["trials_measured_now"]
    measured = {(c["concurrency"], c["k"]) for c in record["cells"]}
    runs = record["runs"]
    assert measured == {tuple(key) for key in runs["measured_now"] + runs["reused"]}
    assert measured >= {(1, 0), (2, 0), (1, MAX_DRAFT_LEN), (2, MAX_DRAFT_LEN), (1, 1)}  # plan
    for cell in record["cells"]:
        raw = cell["raw"]
        c = cell["concurrency"]
        if cell["k"] > 0:  # every speculative block of its pairs: two waves each
            assert len(raw["requests"]) == cell["verdict"]["paired"]["log_ratios"].__len__() * 2 * c
        else:  # its own trial and every baseline block beside a speculative one
            assert len(raw["requests"]) >= max(4, 2 * c)
        assert all(r["output_tokens"] == 8 for r in raw["requests"])
        assert raw["iterations"], "the engine's step times were recorded"
        stats = cell["stats"]
        assert (
            stats["ms_per_token"]["low"]
            <= stats["ms_per_token"]["value"]
            <= stats["ms_per_token"]["high"]
        )
        if cell["k"] > 0:
            assert raw["positions"] is not None
            assert len(raw["positions"]["accepted_per_pos"]) == cell["k"]
            assert cell["verdict"]["k"] == cell["k"]
        else:
            assert cell["verdict"] is None
    resumed = sum(not cell["measured_now"] for cell in record["cells"])
    assert resumed == len(record["runs"]["reused"])
    assert record["cost_model"] is not None
    for cell in record["cells"]:
        verdict = cell["verdict"]
        if verdict is None:
            continue
        paired = verdict["paired"]
        assert verdict["design"] == paired["design"] == "interleaved"
        pairing = record["search"]["pairing"]["per_concurrency"][str(cell["concurrency"])]
        # looked at after whole passes over the workload
        assert len(paired["log_ratios"]) % pairing["look_every"] == 0
        assert pairing["look_every"] % pairing["pass_pairs"] == 0
        assert paired["prompts_covered"] == record["search"]["pairing"]["workload_prompts"]
        assert verdict["ci_low"] <= verdict["ratio"] <= verdict["ci_high"]
        assert paired["drift_base"] > 0 and paired["drift_spec"] > 0
    assert all(
        p["max_pairs"] >= 2 * p["look_every"] >= 8
        for p in record["search"]["pairing"]["per_concurrency"].values()
    )
    log = (out / "server.log").read_text()  # the server's own lines, not an empty file
    assert "serving " in log and "draft length set to 0" in log
    report = (out / "report.md").read_text()
    # a concurrency with several speculative cells gets the pooled row the plot draws
    if sum(1 for c in record["cells"] if c["concurrency"] == 1 and c["k"] > 0) > 1:
        assert "| 1 | pooled |" in report
    for heading in (
        "## Decision",
        "## Runs",
        "## The cost inequality per cell",
        "## Pairs and noise per cell",
        "## Acceptance per position",
    ):
        assert heading in report
    for c in CONCURRENCIES:
        assert f"| {c} | {decision['schedule'][str(c)]} |" in report
    for name in (
        "speedup_heatmap.png",
        "latency_vs_concurrency.png",
        "acceptance_per_position.png",
    ):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC)
        assert len(data) > 5000
        assert f"]({name})" in report


def test_existing_results_are_refused_without_resume_or_force(
    tuned: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tuned["out"]
    before = (out / "trials.jsonl").read_bytes()
    assert main(tuned["args"]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err
    assert "--force" in err
    assert main([*tuned["args"], "--resume", "--force"]) == 2
    assert (out / "trials.jsonl").read_bytes() == before  # nothing measured, nothing removed


def test_resume_with_other_settings_is_refused(
    tuned: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    args = list(tuned["args"])
    args[args.index("--max-tokens") + 1] = "9"
    assert main([*args, "--resume"]) == 2
    assert "max_tokens" in capsys.readouterr().err

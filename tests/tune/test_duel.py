"""Two methods head to head: the estimate from alternating blocks, the comparison that rests on
it, and a real run with both embedded-engine servers up at once."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from spectool.decide.duel import DuelPair, decided, duel_estimate
from spectool.decide.methods import choose_method
from spectool.errors import BadInputError
from spectool.tuning.trials import pooled_cell

from .test_pairing import K, Machine


def _pairs(spec_ms_a: float, spec_ms_b: float, n: int, speed) -> list[DuelPair]:  # noqa: ANN001
    """``n`` pairs of blocks of two methods on one simulated machine, alternating a b, b a."""
    machine_a = Machine(spec_ms_a, 2, speed, seed=1)
    machine_b = Machine(spec_ms_b, 2, speed, seed=2)
    pairs = []
    for i in range(n):
        first, second = (machine_a, machine_b) if i % 2 == 0 else (machine_b, machine_a)
        got = {}
        for m in (first, second):
            other = machine_b if m is machine_a else machine_a
            m.clock = max(m.clock, other.clock)  # one machine: the second block comes after
            got[id(m)] = pooled_cell([m.block(i, K)], K)
        pairs.append(DuelPair(got[id(machine_a)], got[id(machine_b)], a_first=i % 2 == 0))
    return pairs


def test_head_to_head_cancels_the_machines_drift_and_proves_a_gap_or_a_tie() -> None:
    drifting = lambda t: 1.0 + 0.8 * np.sin(t / 3)  # noqa: E731 (+-80% over the pairs)
    slower = duel_estimate(_pairs(22.0, 20.0, 8, drifting), ("ngram", "draft_model"))
    assert slower.ratio == pytest.approx(1.10, rel=0.03) and slower.pairs == 8
    assert decided(slower, confidence=0.95, margin=0.05)  # proven different
    low, high = slower.interval(2.0)
    assert low > 1.0
    same = duel_estimate(_pairs(20.0, 20.0, 8, drifting), ("ngram", "draft_model"))
    assert same.source == "iterations"  # objective "steps"
    with pytest.raises(BadInputError, match="objective"):
        duel_estimate(_pairs(20.0, 20.0, 2, drifting), ("a", "b"), objective="speed")
    assert same.ratio == pytest.approx(1.0, abs=0.03)
    assert decided(same, confidence=0.95, margin=0.05)  # proven equivalent
    data = json.loads(json.dumps(same.to_json()))
    assert data["methods"] == ["ngram", "draft_model"] and len(data["pair_ratios"]) == 8


def test_a_disturbed_pair_of_whole_workload_blocks_leaves_the_head_to_head() -> None:
    """Two methods equally fast; in one pair the second method's block ran 1.6x slower (the
    machine, not the method). Where every block sent the same prompts that pair is set aside
    and the tie is proven; counted, it keeps the head-to-head open."""
    pairs = _pairs(20.0, 20.0, 8, lambda t: 1.0)
    hit = pairs[5]
    slow = replace(hit.b, iterations=tuple(
        replace(s, verify_ms=1.6 * s.verify_ms) for s in hit.b.iterations
    ))  # fmt: skip
    pairs[5] = replace(hit, b=slow)
    counted = duel_estimate(pairs, ("ngram", "draft_model"))
    kept = duel_estimate(pairs, ("ngram", "draft_model"), strata=(0,) * 8)
    assert counted.set_aside == () and counted.pairs == 8
    assert not decided(counted, confidence=0.95, margin=0.05, looks=6)
    assert kept.set_aside == (5,) and kept.pairs == 7 and kept.to_json()["set_aside"] == [5]
    assert kept.ratio == pytest.approx(1.0, abs=0.03)
    assert decided(kept, confidence=0.95, margin=0.05, looks=6)  # proven equivalent


def test_the_comparison_rests_on_the_head_to_head_where_it_was_measured() -> None:
    """Independent cells put ngram 1.2% behind the draft model with wide intervals: uncertain.
    Head to head, ngram is measured 10% slower at every concurrency: proven worse. Head to head
    equal: a proven tie, and the cheaper ngram is deployed."""
    from tests.decide.test_methods import STRONG, _run, _scaled

    base, _ = _run(STRONG, "draft_model")
    ngram = _scaled(base, "ngram", 1.012, 1.9)
    draft = _scaled(base, "draft_model", 1.0, 1.9)
    assert choose_method([ngram, draft]).uncertain == ("ngram",)

    def duel(ratio: float):  # noqa: ANN202
        est = duel_estimate(_pairs(20.0 * ratio, 20.0, 8, lambda t: 1.0), ("ngram", "draft_model"))
        return [
            replace(est, concurrency=c, ks=(base.choices[c], base.choices[c]))
            for c in base.concurrencies
            if base.choices[c] > 0
        ]

    worse = choose_method([ngram, draft], duel=duel(1.10))
    assert worse.chosen == "draft_model" and worse.certain
    assert {s.method: s.standing for s in worse.scores}["ngram"] == "worse"
    tie = choose_method([ngram, draft], duel=duel(1.0))
    assert tie.chosen == "ngram" and set(tie.tied) == {"ngram", "draft_model"}
    assert json.loads(json.dumps(tie.to_json()))["head_to_head"]
    # head to head, the runner-up can turn out the faster one
    faster = choose_method([ngram, draft], duel=duel(0.85))
    assert faster.chosen == "ngram" and faster.chosen_estimate == "ngram"


def test_a_real_head_to_head_runs_both_servers_and_resumes(
    tmp_path: Path, tune_models: tuple[Path, Path], tune_workload: Path
) -> None:
    from spectool.tuning.duel import FOLDER, run_duel
    from spectool.tuning.request import TuneRequest, resolve
    from spectool.tuning.setup import TRIALS_NAME

    target, drafter = tune_models
    common = dict(
        target=str(target), engine="torch", concurrencies=(1,), max_tokens=8, num_prompts=4,
        workload=tune_workload, max_draft_len=2, threads=1, budget_s=0.0,
    )  # fmt: skip
    draft = resolve(
        TuneRequest(drafter=str(drafter), out=tmp_path / "run" / "draft_model", **common)
    )
    ngram = resolve(TuneRequest(method="ngram", out=tmp_path / "run" / "ngram", **common))

    def outcome(resolved, k: int) -> SimpleNamespace:  # noqa: ANN001
        return SimpleNamespace(
            resolved=resolved,
            out=Path(resolved.request.out),
            result=SimpleNamespace(choices={1: k}),
        )

    messages: list[str] = []
    estimates = run_duel(outcome(draft, 2), outcome(ngram, 1), [1], on_message=messages.append)
    assert len(estimates) == 1 and messages
    est = estimates[0]
    assert est.methods == ("draft_model", "ngram") and est.ks == (2, 1)
    assert est.source == "requests"  # the run's objective (tpot), as its cells compared
    # budget 0: one look, after a whole pass over the 4 prompts (2 a block at concurrency 1,
    # so 2 pairs a pass, repeated to the 4 pairs of a look)
    assert est.pairs == 4 and est.prompts_covered == est.workload_prompts == 4
    saved = (tmp_path / "run" / FOLDER / TRIALS_NAME).read_text().splitlines()
    assert len(saved) == 8
    labels = [json.loads(line)["config"]["label"] for line in saved]
    assert sum("draft_model k=2 #h" in x for x in labels) == 4
    assert sum("ngram k=1 #h" in x for x in labels) == 4
    # both sides of a pair sent the same prompts
    configs = [json.loads(line)["config"] for line in saved]
    by_pair: dict[str, list] = {}
    for cfg in configs:
        by_pair.setdefault(cfg["label"].split("#h")[1].split()[0], []).append(cfg["prompt_indices"])
    assert all(len(v) == 2 and v[0] == v[1] for v in by_pair.values())
    # resumed: the saved blocks are reused, nothing is measured again, the same estimate
    resumed = [
        outcome(replace(r, request=replace(r.request, resume=True)), k)
        for r, k in ((draft, 2), (ngram, 1))
    ]
    again = run_duel(*resumed, [1])
    assert (tmp_path / "run" / FOLDER / TRIALS_NAME).read_text().splitlines() == saved
    assert again[0].ratio == est.ratio


def test_the_comparison_measures_head_to_head_only_when_the_rival_is_not_proven_slower(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """run_methods asks for a head-to-head of the best estimate and its closest rival when
    that rival is uncertain, and decides on it; a rival proven slower costs no head-to-head."""
    from spectool.tuning import compare
    from tests.decide.test_methods import STRONG, _run, _scaled

    base, _ = _run(STRONG, "draft_model")
    monkeypatch.setattr(compare, "write_comparison", lambda *a, **k: [])

    def outcomes_for(results):  # noqa: ANN001, ANN202
        return {
            r.method: SimpleNamespace(
                resolved=SimpleNamespace(method=r.method, request=SimpleNamespace(confidence=0.95)),
                result=r,
                out=tmp_path / r.method,
                cells={},
                wall_s=0.0,
            )
            for r in results
        }

    asked: list[tuple[str, str]] = []

    def duel(a, b, concs):  # noqa: ANN001, ANN202
        asked.append((a.resolved.method, b.resolved.method))
        est = duel_estimate(
            _pairs(22.0, 20.0, 8, lambda t: 1.0), (b.resolved.method, a.resolved.method)
        )
        return [
            replace(est, concurrency=c, ks=(b.result.choices[c], a.result.choices[c]))
            for c in concs
            if a.result.choices[c] > 0 and b.result.choices[c] > 0
        ]

    close = outcomes_for([_scaled(base, "ngram", 1.012, 1.9), _scaled(base, "draft_model", 1, 1.9)])
    resolved = [close["draft_model"].resolved, close["ngram"].resolved]
    done = compare.run_methods(resolved, lambda r, rival, bl: close[r.method], duel=duel)
    assert asked == [("draft_model", "ngram")]
    assert done.choice.duel and done.choice.chosen == "draft_model" and done.choice.certain
    asked.clear()
    far = outcomes_for([_scaled(base, "ngram", 1.3, 1.02), _scaled(base, "draft_model", 1, 1.02)])
    done = compare.run_methods(resolved, lambda r, rival, bl: far[r.method], duel=duel)
    assert asked == [] and not done.choice.duel and done.choice.chosen == "draft_model"


def test_a_choice_against_the_separate_estimates_says_the_head_to_head_decided() -> None:
    from tests.decide.test_methods import STRONG, _run, _scaled

    base, _ = _run(STRONG, "draft_model")
    ngram, draft = _scaled(base, "ngram", 1.03, 1.9), _scaled(base, "draft_model", 1.0, 1.9)
    est = duel_estimate(_pairs(17.0, 20.0, 8, lambda t: 1.0), ("ngram", "draft_model"))
    duel = [
        replace(est, concurrency=c, ks=(base.choices[c], base.choices[c]))
        for c in base.concurrencies
        if base.choices[c] > 0
    ]
    choice = choose_method([ngram, draft], duel=duel)
    assert choice.chosen == "ngram"
    assert "ahead of draft_model by the head-to-head measurement" in choice.why


def test_a_head_to_head_is_the_workloads_time_over_the_rivals_not_a_mean_per_token() -> None:
    """Four prompts (strata), each sent in three passes; the rival's cost per token depends on
    the prompt (its acceptance), as ``a``'s does. The workload's ratio is its time with ``a``
    over its time with ``b``: 70 / 100 ms per token summed over the prompts, 0.70. The pairs'
    token-weighted mean (what it was) reads 0.81, and would call n-gram against a draft model
    on prose a tie where the times put it 6% ahead."""
    from spectool.decide.cell import CellMeasurement, IterationSample

    a_ms, b_ms = (8.0, 20.0, 12.0, 30.0), (10.0, 40.0, 10.0, 40.0)  # per token, per prompt

    def block(ms: float, speed: float) -> CellMeasurement:
        steps = tuple(IterationSample(0.0, ms * speed, 0.0, 1, 2) for _ in range(16))
        return CellMeasurement(1, K, iterations=steps)  # 16 steps of 2 tokens: 32 tokens

    pairs, strata = [], []
    for p in range(3):
        for s in range(4):
            speed = 1.0 + 0.1 * ((p + s) % 3)  # both blocks of a pair on the same machine
            pairs.append(DuelPair(block(a_ms[s], speed), block(b_ms[s], speed), a_first=s % 2 == 0))
            strata.append(s)
    est = duel_estimate(pairs, ("ngram", "draft_model"), strata=strata)
    assert est.strata == 4
    assert est.ratio == pytest.approx(sum(a_ms) / sum(b_ms))  # 0.70
    token_mean = float(np.mean([a / b for a, b in zip(a_ms, b_ms, strict=True)]))
    assert token_mean == pytest.approx(0.8125) and abs(est.ratio - token_mean) > 0.1
    # each pair its own prompts (the first pass alone): the same weighting, between pairs
    first = duel_estimate(pairs[:4], ("ngram", "draft_model"), strata=strata[:4])
    assert first.strata == 0 and first.ratio == pytest.approx(
        sum(a * (1 + 0.1 * (s % 3)) for s, a in enumerate(a_ms))
        / sum(b * (1 + 0.1 * (s % 3)) for s, b in enumerate(b_ms))
    )

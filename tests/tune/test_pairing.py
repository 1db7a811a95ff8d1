"""Interleaved pairs and sequential stopping, on blocks shaped like the engine's real output.

Each fake block is what the runner returns for a trial: request records and iteration stats in
the ``/metrics`` JSON the embedded server sends (built by the server's own encoder and read back
by the real parser). A "machine" gives every block a speed that changes with time, so a test can
slow everything, or one stretch of the run, the way a neighbour on a shared host does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from spectool.decide.cost import evaluate_cell
from spectool.decide.latency import RequestRecord
from spectool.engine.engine import IterationStats
from spectool.errors import BadInputError
from spectool.measure.runner import TrialConfig, TrialResult
from spectool.server.metrics import iteration_stats_json
from spectool.trtllm.iter_stats import parse_iteration_stats
from spectool.tuning.pairing import (
    LOOK_EVERY,
    MAX_PAIRS,
    MIN_PAIRS_OVER_BUDGET,
    NotSaved,
    measure_paired,
)
from spectool.tuning.trials import pooled_cell

C, K, TOKENS = 2, 3, 16  # concurrency, draft length, output tokens per request
BASE_MS = 10.0


class Machine:
    """Blocks on a simulated machine: a clock, and a speed factor as a function of the clock."""

    def __init__(
        self,
        spec_ms: float,
        accepted: int,
        speed: Callable[[float], float],
        seed: int = 0,
        noise: float = 0.05,
    ):
        self.spec_ms = spec_ms  # step time at k=K (drafting + verifying) on a quiet machine
        self.noise = noise  # each step's own jitter (log-normal sigma)
        self.accepted = accepted  # drafts accepted per request-step
        self.speed = speed
        self.clock = 0.0
        self.rng = np.random.default_rng(seed)
        self.calls: list[tuple[int, int]] = []

    def block(self, pair: int, arm: int) -> TrialResult:
        self.calls.append((pair, arm))
        tokens_per_step = 1 + (self.accepted if arm else 0)
        steps = -(-(TOKENS - 1) // tokens_per_step)
        entries, t = [], 0.0
        for i in range(2 * steps):  # two waves of C requests
            ms = (
                (self.spec_ms if arm else BASE_MS)
                * self.speed(self.clock + t)
                * float(self.rng.lognormal(0, self.noise))
            )
            t += ms / 1000
            stats = IterationStats(
                timestamp=0.0, iter=i, iter_latency_ms=ms, num_active_requests=C,
                num_queued_requests=0, num_new_active_requests=0, num_completed_requests=0,
                max_batch_size=8, max_num_tokens=8192, used_num_tokens=0, prefill_ms=0.0,
                draft_ms=0.0, verify_ms=ms, coord_ms=0.0, draft_len=arm,
                num_draft_tokens=C * arm, num_accepted_tokens=C * (tokens_per_step - 1),
                num_requests_with_draft_tokens=C if arm else 0,
                accepted_per_pos=tuple(C if j < tokens_per_step - 1 else 0 for j in range(arm)),
                drafted_per_pos=(C,) * arm, num_decoded_requests=C,
            )  # fmt: skip
            entries.append(iteration_stats_json(stats))
        wave = t / 2
        records = tuple(
            RequestRecord(
                request_id=f"r{r}",
                category="code",
                send_time_s=(r // C) * wave,
                first_token_time_s=(r // C) * wave + 0.001,
                chunk_times_s=((r // C + 1) * wave,),
                chunk_token_counts=(TOKENS,),
                end_time_s=(r // C + 1) * wave,
                prompt_tokens=10,
                output_tokens=TOKENS,
            )  # fmt: skip
            for r in range(2 * C)
        )
        self.clock += t + 0.05
        config = TrialConfig(label=f"k={arm} #p{pair}", concurrency=C, num_prompts=2 * C)
        return TrialResult(
            config, records, ("usage",) * len(records), tuple(parse_iteration_stats(entries)),
            tuple(entries), t, "",
        )  # fmt: skip


def quiet(_: float) -> float:
    return 1.0


def test_a_clear_gain_settles_at_the_first_look_in_alternating_order() -> None:
    machine = Machine(spec_ms=18.0, accepted=2, speed=quiet)  # ratio 18 / 3 / 10 = 0.6
    cell = measure_paired(C, K, machine.block)
    assert len(cell.pairs) == LOOK_EVERY
    assert machine.calls[:4] == [(0, K), (0, 0), (1, 0), (1, K)]  # A B, B A
    assert [p.spec_first for p in cell.pairs] == [True, False, True, False]
    assert cell.key == (C, K)


def test_a_noisy_ratio_at_the_threshold_runs_to_the_last_pair_and_stays_inconclusive() -> None:
    from spectool.decide.paired import evaluate_paired

    # ratio exactly 1.0, steps too noisy for 24 pairs to prove a tie within 1 +- 5%
    machine = Machine(spec_ms=30.0, accepted=2, speed=quiet, noise=0.6)
    cell = measure_paired(C, K, machine.block, budget_s=1e9)
    assert len(cell.pairs) == MAX_PAIRS
    v = evaluate_paired(cell, looks=MAX_PAIRS // LOOK_EVERY)
    assert v.verdict == "inconclusive" and (v.ci_low < 0.95 or v.ci_high > 1.05)


def test_a_proven_tie_with_off_ends_the_cell_early() -> None:
    """Issue 21: once the interval lies within 1 +- 5% the cell is as fast as off, proven, and
    more pairs would not change what is deployed (off, the cheaper); the cell stops there."""
    from spectool.decide.choose import unproven_gain
    from spectool.decide.paired import evaluate_paired

    for seed in range(3):
        machine = Machine(spec_ms=30.0, accepted=2, speed=quiet, seed=seed)  # ratio 1.0
        cell = measure_paired(C, K, machine.block, budget_s=1e9)
        assert len(cell.pairs) < MAX_PAIRS and len(cell.pairs) % LOOK_EVERY == 0
        v = evaluate_paired(cell, looks=MAX_PAIRS // LOOK_EVERY)
        assert v.verdict == "inconclusive" and 0.95 <= v.ci_low and v.ci_high <= 1.05
        assert not unproven_gain(v)  # a proven tie is never deployed on its estimate


def test_the_budget_stops_an_unsettled_cell_at_a_look_once_it_has_enough_pairs() -> None:
    """Over budget at the first look (4 pairs: a t interval on 3 degrees of freedom), the cell
    measures on to the next look; there the budget ends it."""
    machine = Machine(spec_ms=30.0, accepted=2, speed=quiet, noise=0.6)
    cell = measure_paired(C, K, machine.block, budget_s=0.5)
    assert len(cell.pairs) == MIN_PAIRS_OVER_BUDGET == 2 * LOOK_EVERY
    # the budget, not the pairs, made the second look the last: it spends the four untaken
    assert cell.rest_looks == MAX_PAIRS // LOOK_EVERY - 2 == 4
    unbudgeted = measure_paired(C, K, Machine(30.0, 2, quiet, noise=0.6).block, budget_s=1e9)
    assert len(unbudgeted.pairs) == MAX_PAIRS and unbudgeted.rest_looks == 0
    settles = measure_paired(C, K, Machine(18.0, 2, quiet).block, budget_s=0.0)
    assert len(settles.pairs) == LOOK_EVERY and settles.rest_looks == 0  # its data ended it


def test_a_resumed_run_stops_where_the_first_one_did() -> None:
    machine = Machine(spec_ms=27.0, accepted=2, speed=lambda t: 1.0 + 0.8 * np.sin(t))
    saved: dict[tuple[int, int], TrialResult] = {}

    def record(pair: int, arm: int) -> TrialResult:
        saved[(pair, arm)] = machine.block(pair, arm)
        return saved[(pair, arm)]

    first = measure_paired(C, K, record, budget_s=1e9)

    def lookup(pair: int, arm: int) -> TrialResult:
        if (pair, arm) not in saved:
            raise NotSaved
        return saved[(pair, arm)]

    again = measure_paired(C, K, lookup, budget_s=1e9)
    assert len(again.pairs) == len(first.pairs)
    assert [p.spec for p in again.pairs] == [p.spec for p in first.pairs]


def hog(start: float, length: float, factor: float) -> Callable[[float], float]:
    """A neighbour that slows the machine ``factor`` times from ``start`` for ``length`` s."""
    return lambda t: factor if start <= t < start + length else 1.0


@pytest.mark.parametrize("spec_ms", [18.0, 24.0, 36.0])  # true ratios 0.6, 0.8, 1.2
def test_a_cpu_hog_mid_cell_never_flips_the_verdict(spec_ms: float) -> None:
    """A hog that doubles or triples step times for a while, started at many points of the
    cell: the paired verdict is the quiet one or inconclusive, never the opposite. The unpaired
    design (the cell against a baseline measured before it) flips under the same hogs."""
    from spectool.decide.paired import evaluate_paired

    looks = MAX_PAIRS // LOOK_EVERY
    quiet_verdict = evaluate_paired(
        measure_paired(C, K, Machine(spec_ms, 2, quiet).block), looks=looks
    ).verdict
    assert quiet_verdict == ("pays" if spec_ms < 30 else "does_not_pay")
    flips_unpaired = 0
    for i, (start, factor) in enumerate(
        (s, f) for s in np.linspace(0.0, 1.5, 8) for f in (2.0, 3.0)
    ):
        machine = Machine(spec_ms, 2, hog(float(start), 0.6, factor), seed=i)
        verdict = evaluate_paired(measure_paired(C, K, machine.block), looks=looks).verdict
        assert verdict in (quiet_verdict, "inconclusive"), (start, factor, verdict)
        # unpaired: a baseline block measured first (quiet), then the speculative block under
        # the hog (or the converse): what tune did before pairing
        base_machine = Machine(spec_ms, 2, hog(0.0, 0.3, factor) if i % 2 else quiet, seed=i)
        spec_machine = Machine(spec_ms, 2, quiet if i % 2 else hog(0.0, 0.3, factor), seed=i)
        unpaired = evaluate_cell(
            pooled_cell([spec_machine.block(0, K)], K),
            pooled_cell([base_machine.block(0, 0)], 0),
            n_boot=200,
        ).verdict
        flips_unpaired += unpaired not in (quiet_verdict, "inconclusive")
    assert flips_unpaired > 0  # the harness does bite: without pairs the verdict flips


# -- prompt-dependent acceptance ------------------------------------------------------------

GOOD, BAD = 3, 0  # drafts accepted per step on a prompt the drafter knows / does not know
DECODE = 16  # decode tokens per request (the first token comes from the prefill)


class Workload:
    """Blocks on a quiet machine whose acceptance depends on the prompt: the file's first half
    accepts ``GOOD`` drafts per step, its second half ``BAD``. ``order`` gives each block's
    prompts: the plan's shuffled passes, or the file's order (the design before passes)."""

    def __init__(self, prompts: int, spec_ms: float, order: Callable[[int], tuple[int, ...]]):
        self.prompts, self.spec_ms, self.order = prompts, spec_ms, order
        self.rng = np.random.default_rng(5)

    def accepted(self, prompt: int) -> int:
        return GOOD if prompt < self.prompts // 2 else BAD

    def truth(self) -> float:
        """The workload's speculative time over its baseline time (every prompt once)."""
        spec = sum(DECODE // (1 + self.accepted(p)) * self.spec_ms for p in range(self.prompts))
        return spec / (self.prompts * DECODE * BASE_MS)

    def block(self, pair: int, arm: int) -> TrialResult:
        sent = self.order(pair)
        entries, records, t = [], [], 0.0
        for r, prompt in enumerate(sent):
            per_step = 1 + (self.accepted(prompt) if arm else 0)
            start = t
            for _ in range(DECODE // per_step):
                ms = (self.spec_ms if arm else BASE_MS) * float(self.rng.lognormal(0, 0.03))
                t += ms / 1000
                stats = IterationStats(
                    timestamp=0.0, iter=len(entries), iter_latency_ms=ms, num_active_requests=1,
                    num_queued_requests=0, num_new_active_requests=0, num_completed_requests=0,
                    max_batch_size=8, max_num_tokens=8192, used_num_tokens=0, prefill_ms=0.0,
                    draft_ms=0.0, verify_ms=ms, coord_ms=0.0, draft_len=arm,
                    num_draft_tokens=arm, num_accepted_tokens=per_step - 1,
                    num_requests_with_draft_tokens=1 if arm else 0,
                    accepted_per_pos=tuple(1 if j < per_step - 1 else 0 for j in range(arm)),
                    drafted_per_pos=(1,) * arm, num_decoded_requests=1,
                )  # fmt: skip
                entries.append(iteration_stats_json(stats))
            records.append(
                RequestRecord(
                    request_id=f"r{r}",
                    category="code",
                    send_time_s=start,
                    first_token_time_s=start + 0.001,
                    chunk_times_s=(t,),
                    chunk_token_counts=(DECODE + 1,),
                    end_time_s=t,
                    prompt_tokens=10,
                    output_tokens=DECODE + 1,
                )  # fmt: skip
            )
        config = TrialConfig(
            label=f"k={arm} #p{pair}", concurrency=1, num_prompts=len(sent), prompt_indices=sent
        )
        return TrialResult(
            config, tuple(records), ("usage",) * len(records),
            tuple(parse_iteration_stats(entries)), tuple(entries), t, "",
        )  # fmt: skip


def test_prompt_dependent_acceptance_does_not_bias_a_cell_that_stops_early() -> None:
    """16 prompts at concurrency 1 (two a block), half of which the drafter knows: the
    workload's ratio is 0.81. Blocks in the file's order settled on the first half alone (0.33,
    "pays" by far) after 4 pairs; blocks that walk shuffled passes, looked at after whole
    passes, estimate the whole workload and say how many prompts they covered."""
    from spectool.decide.paired import evaluate_paired
    from spectool.tuning.trials import CellPlan

    prompts, spec_ms = 16, 13.0
    plan = CellPlan("torch", "m", "fp", "wl", num_prompts=prompts, max_tokens=DECODE + 1)
    passes = Workload(prompts, spec_ms, lambda p: plan.block_config(1, K, p, K).prompt_indices)
    truth = passes.truth()
    assert truth == pytest.approx(0.8125)

    cell = measure_paired(1, K, passes.block, budget_s=1e9, **plan.pass_options(1))
    estimate = evaluate_paired(cell)
    assert len(cell.pairs) % plan.pass_pairs(1) == 0  # stopped after whole passes
    assert estimate.ratio == pytest.approx(truth, rel=0.05)
    assert estimate.ci_low <= truth <= estimate.ci_high
    assert estimate.paired.prompts_covered == estimate.paired.workload_prompts == prompts

    # the same cell in the file's order, as blocks ran before passes: a prefix of the workload
    in_order = Workload(prompts, spec_ms, lambda p: (2 * p, 2 * p + 1))
    prefix = evaluate_paired(measure_paired(1, K, in_order.block, budget_s=1e9))
    assert len(prefix.paired.log_ratios) == LOOK_EVERY and prefix.verdict == "pays"
    assert prefix.ratio < 0.5 * truth and prefix.paired.prompts_covered == 8


def test_the_first_look_waits_for_a_whole_pass_even_over_budget() -> None:
    from spectool.tuning.pairing import look_every, looks_of, max_pairs
    from spectool.tuning.trials import CellPlan

    plan = CellPlan("torch", "m", "fp", "wl", num_prompts=20, max_tokens=DECODE + 1)
    work = Workload(20, 13.0, lambda p: plan.block_config(1, K, p, K).prompt_indices)
    cell = measure_paired(1, K, work.block, budget_s=0.0, **plan.pass_options(1))
    assert len(cell.pairs) == plan.pass_pairs(1) == 10 and cell.prompts_covered == 20
    # two prompts a block: one pass, ten strata of a pair each (the next pass repeats them)
    assert not cell.same_prompts and cell.strata == tuple(range(10))
    # blocks of concurrency 10's plan: two waves are the whole workload, so blocks differ by
    # the machine alone and a far-off pair may be set aside as disturbed
    whole = Workload(20, 13.0, lambda p: plan.block_config(10, K, p, K).prompt_indices)
    assert plan.pass_pairs(10) == 1
    cell = measure_paired(1, K, whole.block, budget_s=0.0, **plan.pass_options(10))
    assert cell.same_prompts and cell.prompts_covered == 20
    # looks fall on whole passes; a pass shorter than LOOK_EVERY pairs is repeated to reach it
    assert (look_every(10), max_pairs(10), looks_of(10)) == (10, 20, 2)
    assert (look_every(3), max_pairs(3), looks_of(3)) == (6, 24, 4)
    assert (look_every(1), max_pairs(1), looks_of(1)) == (LOOK_EVERY, MAX_PAIRS, 6)


def test_the_users_metric_decides_where_steps_and_users_disagree() -> None:
    """Decode steps at 0.6 of the baseline's cost per token, but each speculative request also
    waits 90 ms outside decode steps (arrivals' prefills): users' time per output token is 1.2
    of the baseline's. Judged by steps the cell pays; by the users' TPOT (the default
    objective) it does not, and the interval says so from the clients' records."""
    import dataclasses

    from spectool.decide.paired import evaluate_paired

    machine = Machine(spec_ms=18.0, accepted=2, speed=quiet)

    def stalled(pair: int, arm: int) -> TrialResult:
        trial = machine.block(pair, arm)
        if not arm:
            return trial
        extra = 0.09
        records = tuple(
            dataclasses.replace(
                r,
                end_time_s=r.end_time_s + extra,
                chunk_times_s=tuple(t + extra for t in r.chunk_times_s),
            )
            for r in trial.records
        )
        return dataclasses.replace(trial, records=records)

    steps = evaluate_paired(measure_paired(C, K, stalled, objective="steps"))
    assert steps.source == "iterations" and steps.verdict == "pays"
    assert steps.ratio == pytest.approx(0.6, rel=0.05)
    users = evaluate_paired(measure_paired(C, K, stalled, objective="tpot"))
    assert users.source == "requests" and users.verdict == "does_not_pay"
    assert users.ratio == pytest.approx(1.2, rel=0.05)
    with pytest.raises(BadInputError, match="objective"):
        evaluate_paired(measure_paired(C, K, stalled, objective="latency"))

"""Measure two tuned methods head to head (:mod:`spectool.decide.duel`): both servers up at once.

When the method comparison cannot tell the best method from its closest rival (the rival is
not proven slower), ``tune`` runs each of the two at its chosen draft length on its own
embedded-engine server, both servers up, and alternates their blocks (a b, b a, ...) at every
concurrency where both speculate: the same prompts (the same shuffled passes over the
workload), the same minute. Looks fall after whole passes, as for paired cells; a
concurrency stops once the two one-sided tests prove the methods equivalent within
:data:`~spectool.decide.methods.TIE_MARGIN` or the interval proves one faster, after the
paired cells' most pairs, or when ``--budget`` seconds are spent there.

Blocks are saved in ``DIR/head_to_head/trials.jsonl`` (labels ``#h<pair>``) the moment they
end; ``--resume`` reuses them and stops where an uninterrupted run would. On TensorRT-LLM (a
restart per draft length) no head-to-head runs: the comparison keeps the independent cells.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from spectool.decide.duel import DuelEstimate, DuelPair, decided, duel_estimate
from spectool.decide.methods import TIE_MARGIN
from spectool.errors import BadInputError
from spectool.measure.runner import TrialResult, load_trials
from spectool.tuning.outcome import TuneOutcome
from spectool.tuning.pairing import look_every, looks_of, max_pairs, prompt_bag, strata_of
from spectool.tuning.plan import METRICS_INTERVAL_S, make_driver, measurement_plan
from spectool.tuning.request import TuneRequest
from spectool.tuning.resume import check_requests
from spectool.tuning.setup import TRIALS_NAME
from spectool.tuning.trials import CellPlan, pooled_cell

FOLDER = "head_to_head"


def run_duel(
    a: TuneOutcome,
    b: TuneOutcome,
    concurrencies: Sequence[int],
    *,
    on_message: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[DuelEstimate]:
    """Head-to-head estimates of ``a``'s method over ``b``'s at ``concurrencies`` (where both
    speculate); see the module docstring. Empty on an engine that restarts per draft length."""
    from spectool.measure.runner import measure

    if a.resolved.engine != "torch" or b.resolved.engine != "torch":
        return []
    methods = (a.resolved.method, b.resolved.method)
    top = a.out.parent
    folder = top / FOLDER
    results_path = folder / TRIALS_NAME
    req = a.resolved.request
    if not req.resume and results_path.exists():
        results_path.unlink()  # --force (tune refused the folder otherwise)
    count_tokens, prompts, _, plan_a = measurement_plan(a.resolved)
    _, prompts_b, _, plan_b = measurement_plan(b.resolved)
    if prompts.workload_id != prompts_b.workload_id:
        raise BadInputError("tune", f"{methods[0]} and {methods[1]} were tuned on other prompts")
    saved = load_trials(results_path)
    for method in methods:
        (folder / method).mkdir(parents=True, exist_ok=True)
    estimates: list[DuelEstimate] = []
    with (
        make_driver(a.resolved, folder / methods[0]) as driver_a,
        make_driver(b.resolved, folder / methods[1]) as driver_b,
    ):
        sides = ((driver_a, plan_a), (driver_b, plan_b))

        def block(side: int, c: int, k: int, pair: int) -> TrialResult:
            if should_stop is not None and should_stop():
                raise KeyboardInterrupt
            driver, plan = sides[side]
            config = dataclasses.replace(
                plan.block_config(c, k, pair, k), label=plan.label(k, f"h{pair}")
            )
            trial = saved.get(config.key())
            if trial is None:
                info = driver.serve(k)
                trial = measure(
                    info.base_url,
                    info.model_name,
                    prompts.prompts,
                    [config],
                    results_path=results_path,
                    count_tokens=count_tokens,
                    metrics_interval_s=METRICS_INTERVAL_S,
                    metrics_path=info.metrics_path,
                )[0]
            check_requests([trial], f"head to head (concurrency={c}, {methods[side]} k={k})")
            return trial

        for c in concurrencies:
            ks = (a.result.choices[c], b.result.choices[c])
            if min(ks) < 1:
                continue
            if on_message is not None:
                on_message(
                    f"head to head at concurrency {c}: {methods[0]} k={ks[0]} against "
                    f"{methods[1]} k={ks[1]}, both servers up, blocks alternating"
                )
            estimates.append(_measure_at(c, ks, methods, block, plan_a, req))
    return estimates


def _measure_at(
    c: int,
    ks: tuple[int, int],
    methods: tuple[str, str],
    block: Callable[[int, int, int, int], TrialResult],
    plan: CellPlan,
    req: TuneRequest,
) -> DuelEstimate:
    """Pairs at one concurrency until decided, at the most pairs, or over budget."""
    passes = plan.pass_pairs(c)
    every, most, looks = look_every(passes), max_pairs(passes), looks_of(passes)
    workload = plan.prompts_in_workload
    pairs: list[DuelPair] = []
    sent: set[int] = set()
    bags: list[tuple[int, ...]] = []  # each pair's prompts (duel_estimate's strata)
    spent = 0.0
    estimate: DuelEstimate | None = None
    for i in range(most):
        a_first = i % 2 == 0
        got: dict[int, TrialResult] = {}
        for side in (0, 1) if a_first else (1, 0):
            trial = block(side, c, ks[side], i)
            spent += trial.wall_time_s
            sent.update(prompt_bag(trial))
            got[side] = trial
        pairs.append(DuelPair(pooled_cell([got[0]], ks[0]), pooled_cell([got[1]], ks[1]), a_first))
        bags.append(prompt_bag(got[0]))
        if len(pairs) % every:
            continue
        estimate = duel_estimate(
            pairs,
            methods,
            prompts_covered=len(sent),
            workload_prompts=workload,
            objective=req.objective,
            strata=strata_of(bags),
        )
        if (
            decided(estimate, confidence=req.confidence, margin=TIE_MARGIN, looks=looks)
            or spent >= req.budget_s
        ):
            break
    assert estimate is not None
    return estimate

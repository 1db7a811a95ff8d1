"""``spectool tune`` comparing methods on one embedded-engine server, their cells measured
together (:mod:`spectool.tuning.joint`).

Each method keeps its own folder ``DIR/<method>/`` (trials, decision, report), its own search
(:func:`spectool.decide.tune.tune`) and its own schedule, exactly as when methods run one after
another (:mod:`spectool.tuning.compare`); what changes is who measures:

1. one server holds the target and every method's drafter (:func:`~spectool.tuning.plan.
   make_driver` with alternatives);
2. the searches run *dry*, in the profile's order: the first method measures the baselines
   (one cell per concurrency, shared by all); each search then raises
   :class:`~spectool.tuning.joint.Wanted` at the first paired cell it lacks, or
   :class:`~spectool.tuning.joint.Ready`. A method's rival (the ratios cells must beat,
   :func:`~spectool.decide.methods.rival_ratios`) is made of the methods before it that are
   ready, and every method after the first lets the roofline prior stand in for its ``k = 1``
   cost cell, as in the sequential comparison;
3. the cells wanted at the first wanting method's concurrency are measured as one joint cell
   (:func:`~spectool.tuning.joint.measure_joint`) and the searches run again, until none wants
   more;
4. a last pass of every search writes its outputs; the method is chosen
   (:func:`~spectool.decide.methods.choose_method`), with the head-to-head estimate of the best
   method and its closest rival taken from the joint cell that held both
   (:func:`~spectool.tuning.joint.duel_from_joint`); where none did, the two are measured head to
   head (:func:`spectool.tuning.duel.run_duel`).

A resumed run replays the same loop over the saved blocks and measures only what is missing.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from spectool.decide.cell import CellMeasurement
from spectool.decide.duel import DuelEstimate
from spectool.decide.methods import choose_method, closest_rival, rival_ratios
from spectool.decide.result import TuneResult
from spectool.measure.runner import TrialConfig, TrialResult
from spectool.methods import serving_cost_rank
from spectool.tuning.compare import MethodsOutcome, write_comparison
from spectool.tuning.joint import (
    INDEX_NAME,
    Arm,
    JointBlocks,
    MethodFiles,
    Ready,
    Slot,
    Wanted,
    duel_from_joint,
    measure_joint,
    out_raced,
    record_joint,
)
from spectool.tuning.outcome import CellKey, TuneOutcome
from spectool.tuning.plan import METRICS_INTERVAL_S, make_driver, measurement_plan
from spectool.tuning.request import ResolvedTune
from spectool.tuning.resume import check_requests, finished_cells, paired_options
from spectool.tuning.session import TuneProgress, run_tune
from spectool.tuning.setup import PRIOR_NAME, TRIALS_NAME

SHARED_SERVER_SETTINGS = ("engine", "target_dir", "max_batch_size", "max_seq_len", "threads")


def can_share(resolved: Sequence[ResolvedTune]) -> bool:
    """Whether the methods can be measured together: the embedded engine, the same target and
    server settings, and a server that switches draft lengths in place."""
    first = resolved[0]
    return (
        len(resolved) > 1
        and all(r.engine == "torch" for r in resolved)
        and all(
            getattr(r, name) == getattr(first, name)
            for r in resolved
            for name in SHARED_SERVER_SETTINGS
        )
        and all(
            (r.request.device, r.request.dtype) == (first.request.device, first.request.dtype)
            for r in resolved
        )
    )


def run_joint(
    resolved: Sequence[ResolvedTune],
    *,
    progress: TuneProgress | None = None,
    should_stop: Callable[[], bool] | None = None,
    duel: Callable[[TuneOutcome, TuneOutcome, Sequence[int]], Sequence[DuelEstimate]] | None = None,
) -> MethodsOutcome:
    """Measure and compare ``resolved``'s methods on one server; see the module docstring."""
    from spectool.measure.runner import measure
    from spectool.tuning.session import _CountingHooks

    started = time.perf_counter()
    say = progress.on_message if progress is not None else (lambda _text: None)
    first = resolved[0]
    top = Path(first.request.out).expanduser().resolve().parent
    count_tokens, prompts, _, _ = measurement_plan(first)
    hooks = _CountingHooks(progress, should_stop)
    runs = list(resolved)
    shared = make_driver(first, top / first.method, alternatives=resolved[1:])
    if not first.request.resume:  # --force (or a fresh folder): no joint cells of a run before
        (top / INDEX_NAME).unlink(missing_ok=True)

    known: dict[CellKey, CellMeasurement] = {}

    def baselines() -> dict[CellKey, CellMeasurement]:
        """The first method's baseline cells (measured by its first search)."""
        if len(known) < len(first.concurrencies):
            plan = measurement_plan(first)[3]
            saved = MethodFiles.load(plan, Path(first.request.out) / TRIALS_NAME).saved
            known.update(finished_cells(saved, plan, [(c, 0) for c in first.concurrencies]))
        return dict(known)

    def search(i: int, results: Mapping[str, TuneResult], *, dry: bool) -> TuneOutcome:
        r = runs[i]
        probed = Path(resolved[1].request.out) / PRIOR_NAME
        mine = Path(r.request.out) / PRIOR_NAME
        if i > 1 and probed.is_file() and not mine.is_file():  # one machine, one probe
            mine.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(probed, mine)
        earlier = [results[m.method] for m in resolved[:i] if m.method in results]
        return run_tune(
            r,
            progress=progress,
            should_stop=should_stop,
            rival=rival_ratios(earlier) if earlier else None,
            baselines=baselines() if i > 0 else None,
            driver=shared.for_method(r.method),  # type: ignore[attr-defined]
            dry=dry,
            use_prior=i > 0,
            quiet_resume=True,
            stops=out_raced(top, r.method),
        )

    def measure_block(slot: Slot, config: TrialConfig, path: Path) -> TrialResult:
        info = shared.serve(0 if slot is None else slot.k, None if slot is None else slot.method)  # type: ignore[call-arg]
        trial = measure(
            info.base_url,
            info.model_name,
            prompts.prompts,
            [config],
            results_path=path,
            progress=hooks,
            count_tokens=count_tokens,
            metrics_interval_s=METRICS_INTERVAL_S,
            metrics_path=info.metrics_path,
            finished={},
        )[0]
        check_requests(
            [trial], f"joint cell (concurrency={config.concurrency}, {slot or 'baseline'})"
        )
        return trial

    files: dict[str, MethodFiles] = {}
    measured: set[tuple[int, Arm]] = set()
    with shared:
        while True:
            results: dict[str, TuneResult] = {}
            wanted: dict[str, tuple[int, int]] = {}
            for i, r in enumerate(resolved):
                try:
                    search(i, results, dry=True)
                except Ready as ready:
                    results[r.method] = ready.result
                except Wanted as want:
                    wanted[r.method] = (want.c, want.k)
                runs[i] = _resuming(r)
            if not wanted:
                break
            c = next(iter(wanted.values()))[0]
            arms = [Arm(m, k) for m, (cc, k) in wanted.items() if cc == c]
            again = [a for a in arms if (c, a) in measured]
            if again:  # its search did not find the cell it was given: never loop on it
                raise RuntimeError(f"joint cell at concurrency {c} not read back for {again[0]}")
            measured.update((c, a) for a in arms)
            say(
                f"concurrency {c}: baseline, {', '.join(map(str, arms))} together on one "
                "server, blocks in rotating rounds"
            )
            files = files or {
                r.method: MethodFiles.load(
                    measurement_plan(r)[3], Path(r.request.out) / TRIALS_NAME
                )
                for r in resolved
            }
            blocks = JointBlocks(files, measure_block)
            plan = files[arms[0].method].plan
            cell = measure_joint(
                c,
                arms,
                lambda pair, slot, c=c, arms=arms, b=blocks: b.block(c, arms, pair, slot),
                **plan.pass_options(c),
                **paired_options(first),  # type: ignore[arg-type]
            )
            record_joint(top, cell)
            for arm, (n, lead, why) in sorted(cell.out_raced.items()):
                say(f"concurrency {c}: {arm} left after {n} rounds ({why}; {lead} leads)")
        outcomes: list[TuneOutcome] = []
        done: dict[str, TuneResult] = {}
        for i, r in enumerate(resolved):
            say(f"method {i + 1}/{len(resolved)}: {r.method}")
            outcome = search(i, done, dry=False)
            done[r.method] = outcome.result
            outcomes.append(outcome)
    files = files or {
        o.resolved.method: MethodFiles.load(measurement_plan(o.resolved)[3], o.out / TRIALS_NAME)
        for o in outcomes
    }

    def joint_duel(a: TuneOutcome, b: TuneOutcome, concs: Sequence[int]) -> list[DuelEstimate]:
        estimates, missing = [], []
        for c in concs:
            ka, kb = a.result.choices[c], b.result.choices[c]
            if min(ka, kb) < 1:
                continue
            est = duel_from_joint(
                top,
                files,
                Arm(a.resolved.method, ka),
                Arm(b.resolved.method, kb),
                c,
                objective=first.request.objective,
            )
            if est is None:
                missing.append(c)
            else:
                estimates.append(est)
        if missing and duel is not None:
            estimates += duel(a, b, missing)
        return sorted(estimates, key=lambda e: e.concurrency)

    by_cost = sorted(outcomes, key=lambda o: serving_cost_rank(o.resolved.method))
    confidence = first.request.confidence
    choice = choose_method([o.result for o in by_cost], confidence=confidence)
    rival = closest_rival(choice)
    if rival is not None:
        best = next(o for o in outcomes if o.resolved.method == choice.chosen_estimate)
        other = next(o for o in outcomes if o.resolved.method == rival)
        estimates = joint_duel(best, other, list(choice.concurrencies))
        if estimates:
            choice = choose_method(
                [o.result for o in by_cost], confidence=confidence, duel=estimates
            )
    written = write_comparison(outcomes, choice, top, together=True)
    for path in written:
        say(f"wrote {path}")
    return MethodsOutcome(
        tuple(outcomes), choice, top, tuple(written), time.perf_counter() - started
    )


def _resuming(r: ResolvedTune) -> ResolvedTune:
    """``r`` as a resumed run: the later passes of the loop continue its folder."""
    if r.request.resume:
        return r
    return dataclasses.replace(r, request=dataclasses.replace(r.request, resume=True, force=False))

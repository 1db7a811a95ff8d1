"""Replay tune's method comparison on recorded method sweeps, and judge it against the rest.

A *method round* is one round of ``benchmarks/tune_vs_method_sweep.py``: at every concurrency,
every method at every draft length measured once, and the round's baseline blocks (shared by
every method: ``(c, 0)`` of each method's grid is the same cell). :func:`replay_methods` takes
each recorded round in turn as tune's measurements and runs what ``spectool tune`` runs on a
profile with alternatives: each method's search (:func:`spectool.decide.tune.tune`) in the
profile's order, every later one with the ratios the earlier ones chose as its rival (cells
that cannot beat them within the predictor's error are not measured), then the method choice
(:func:`spectool.decide.methods.choose_method`, cheapest to serve first). The deployed method
and its draft length per concurrency are judged against the *other* rounds pooled, cell by
cell, over every method and draft length the rounds hold (compared or not): the share of the
best per-user tokens/s (1 / TPOT pooled over requests) and the on/off check of
:mod:`spectool.decide.replay`.

What it leaves out: the live run's pairing (these cells are single blocks against the round's
baseline, judged with the request bootstrap) and its head-to-head rounds; what it keeps is every
rule that turns measured cells into a deployment. Pure: grids in, judgments out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spectool.decide.cell import pooled
from spectool.decide.methods import choose_method, rival_ratios
from spectool.decide.replay import QUALITY, VERDICT_MARGIN, Grid, grid_shape, per_user_tokens_per_s
from spectool.decide.tune import tune
from spectool.decide.verdict import DEFAULT_OBJECTIVE
from spectool.errors import BadInputError
from spectool.methods import serving_cost_rank

MethodRound = Mapping[str, Grid]  # method -> its full grid of (concurrency, k) cells


@dataclass(frozen=True)
class MethodReplay:
    """One round replayed: the deployment tune chose from it, judged against the others."""

    source: str
    chosen: str
    choices: dict[int, int]
    rows: list[dict[str, Any]]
    quality: bool
    verdicts: bool
    cells_measured: int
    cells_in_round: int

    @property
    def worst_share(self) -> float:
        return min(row["share_of_best"] for row in self.rows)


def _judge(
    chosen: str, choices: Mapping[int, int], tps: Mapping[str, Mapping[tuple[int, int], float]]
) -> tuple[list[dict[str, Any]], bool, bool]:
    rows = []
    quality_ok = verdicts_ok = True
    for c in sorted(choices):
        base = next(iter(tps.values()))[(c, 0)]
        configs = {(m, k): v for m, by in tps.items() for (cc, k), v in by.items() if cc == c}
        best = max(configs, key=lambda key: (configs[key], key[1] == 0))
        best_spec = max((key for key in configs if key[1] > 0), key=configs.__getitem__)
        k = choices[c]
        got = base if k == 0 else tps[chosen][(c, k)]
        share = got / configs[best]
        diff = configs[best_spec] / base - 1.0
        agree = (k > 0) == (diff > 0) if abs(diff) > VERDICT_MARGIN else None
        quality_ok &= share >= QUALITY
        verdicts_ok &= agree is not False
        rows.append(
            {
                "concurrency": c,
                "best": "off" if best[1] == 0 else f"{best[0]} k={best[1]}",
                "chosen": "off" if k == 0 else f"{chosen} k={k}",
                "share_of_best": share,
                "verdict_agrees": agree,
            }
        )
    return rows, quality_ok, verdicts_ok


def replay_methods(
    rounds: Sequence[MethodRound],
    sources: Sequence[str],
    order: Sequence[str],
    *,
    n_boot: int = 300,
    confidence: float = 0.95,
    objective: str = DEFAULT_OBJECTIVE,
    switches_in_place: bool = False,
) -> list[MethodReplay]:
    """Replay the comparison of ``order``'s methods once per round (module docstring), each
    search deciding on ``objective`` (tune's default: users' time per output token);
    ``switches_in_place``: searched as on the embedded engine (steps 5b and 5c of
    :func:`~spectool.decide.tune.tune`), else as on a server that restarts per draft length."""
    if len(rounds) < 2 or len(sources) != len(rounds):
        raise BadInputError("method grids", "need two or more rounds, one source name each")
    if not order or any(m not in r for r in rounds for m in order):
        raise BadInputError("method grids", "every round must hold every method compared")
    if any(set(r) != set(rounds[0]) for r in rounds):
        raise BadInputError("method grids", "the rounds hold different methods")
    concs, n = grid_shape([r[m] for r in rounds for m in r])
    out = []
    for i, round_ in enumerate(rounds):
        others = [r for j, r in enumerate(rounds) if j != i]
        tps = {  # the reference: every method the rounds hold, compared or not
            m: per_user_tokens_per_s({key: pooled([r[m][key] for r in others]) for key in grid})
            for m, grid in round_.items()
        }
        results = []
        measured = 0
        for m in order:
            result = tune(
                concs,
                n,
                lambda c, k, grid=round_[m]: grid[(c, k)],
                method=m,
                n_boot=n_boot,
                confidence=confidence,
                rival=rival_ratios(results) if results else None,
                objective=objective,
                switches_in_place=switches_in_place,
            )
            results.append(result)
            measured += sum(1 for _, k in result.measured_now if k > 0)
        by_cost = sorted(results, key=lambda r: serving_cost_rank(r.method))
        choice = choose_method(by_cost, confidence=confidence)
        chosen = next(r for r in results if r.method == choice.chosen)
        rows, quality, verdicts = _judge(choice.chosen, chosen.choices, tps)
        out.append(
            MethodReplay(
                source=sources[i],
                chosen=choice.chosen,
                choices=dict(chosen.choices),
                rows=rows,
                quality=quality,
                verdicts=verdicts,
                cells_measured=measured,
                cells_in_round=len(order) * len(concs) * n,
            )
        )
    return out


def rounds_from_grids(
    grids: Sequence[Grid], names: Sequence[str], meta: Mapping[str, Any]
) -> list[tuple[list[dict[str, Grid]], list[str], list[str]]]:
    """Per workload of a ``spectool.grids/1`` file of method rounds (one grid per round and
    method, source ``WORKLOAD/ROUND/METHOD``; ``meta["workloads"]``: ``name`` and ``methods`` in
    the profile's order): ``(rounds, round names, methods)``."""
    out = []
    for workload in meta.get("workloads") or ():
        rounds: dict[str, dict[str, Grid]] = {}
        for grid, name in zip(grids, names, strict=True):
            round_name, _, method = name.rpartition("/")
            if round_name.startswith(workload["name"] + "/"):
                rounds.setdefault(round_name, {})[method] = grid
        if not rounds:
            raise BadInputError("method grids", f"no rounds of workload {workload['name']}")
        out.append((list(rounds.values()), list(rounds), list(workload["methods"])))
    if not out:
        raise BadInputError("method grids", "no workloads named in the file's meta")
    return out

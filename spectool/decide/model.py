"""Step-cost model for ``tune``: fit, predict every (concurrency, k), choose k, write a schedule.

**Form.** One engine step (draft + verify + coordination) at generation batch ``b`` and draft
length ``k`` costs, in milliseconds,

    t_step(b, k) = fixed + per_request*b
                   + [k > 0] * (spec_fixed + per_draft_token*b*k + per_draft_pass*k)

* ``fixed``: reading the target's weights once per step, launch overhead. Dominant at small batch,
  where decoding is memory-bound, which is why verifying ``k + 1`` tokens is nearly free there.
* ``per_request * b``: per-sequence work that does not grow with ``k`` (KV-cache reads, sampling).
* ``spec_fixed``: the price of having speculation on at all (drafter bookkeeping, extra launches,
  two-model coordination).
* ``per_draft_token * b * k``: compute for the ``b*k`` extra tokens verified and drafted. Once the
  batch makes the target compute-bound this term is what kills speculation.
* ``per_draft_pass * k``: the drafter's ``k`` sequential passes, each a memory-bound pass of a small
  model whose cost hardly depends on the batch.

The brief's ``a + b*batch*(k+1) + c*k`` is the special case ``per_request = per_draft_token``,
``spec_fixed = 0``. Coefficients are fitted by least squares constrained to be non-negative (a
cost cannot be negative), solved exactly by trying every support set (at most 31 tiny problems).
Terms the measured cells cannot tell apart (e.g. ``k`` and ``[k > 0]`` when only one ``k`` was
measured) are dropped, in the order listed, before fitting. The form is linear: it cannot show the
knee where the target turns compute-bound, nor the staircase of CUDA-graph batch sizes, which is
why ``tune`` confirms each predicted optimum by measuring it.

**Prediction.** ``t_spec(c, k) = t_base_measured(c) + t_step(b, k) - t_step(b, 0)``: the measured
baseline plus the modelled extra cost of speculation, so the model only has to get the *extra*
right. ``b`` is the generation batch the cell is expected to run at: with speculation, requests
finish in fewer steps and newcomers' prefills come more often, so at the same client concurrency
the decode batch is smaller than the baseline's (measured on the embedded engine: 8.0 against
15.5 at concurrency 16, k=8). The smaller batch's cheaper step is not credited: the requests
missing from it are waiting, which a per-step ratio does not see. Per-token ratio
``= t_spec / (E[tokens | k] * t_base_measured)``, with ``E`` from per-position acceptance; the
best ``k`` minimises it, and is 0 when no ``k`` goes below ``1 - min_gain``.

**Stall.** A user's time per output token is not only the decode steps: while a request
decodes, the engine also runs the other requests' prefills, and it waits through them. On a
closed loop at concurrency ``c`` each request sits through about ``c - 1`` of them whatever the
draft length (they are the requests that replace the ones finishing), so per decode token the
wait ``s`` (the baseline's time per token less its mean step,
:func:`spectool.decide.search.stall_ms`) is added to both sides: ratio ``= (t_spec / E + s) /
(t_base + s)``. On the embedded engine's main job (2026-12-05) the steps were 96 % of the
baseline's time per token at concurrency 1, 36 % at 4 and 21 % at 16: a step ratio of 0.84 at
4 was a users' 0.97-0.99. The objectives of a user's time per token take it (``tpot`` and its
tails); the others keep the step ratio (``stall_ms`` 0).

**Schedule.** TensorRT-LLM's ``draft_len_schedule`` maps batch size to draft length; see
:func:`draft_len_for_batch` for both semantics it has had.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from spectool.decide.acceptance import expected_tokens_per_step
from spectool.decide.cell import CellMeasurement
from spectool.decide.cost import request_terms
from spectool.errors import BadInputError

TERMS = ("fixed_ms", "per_request_ms", "spec_fixed_ms", "per_draft_token_ms", "per_draft_pass_ms")

ScheduleSemantics = Literal["up_to", "from"]


def _features(batch: float, k: int) -> np.ndarray:
    on = 1.0 if k > 0 else 0.0
    return np.array([1.0, batch, on, on * batch * k, on * k], dtype=float)


@dataclass(frozen=True)
class StepCostObservation:
    """A cell's mean generation batch, draft length and mean step time (ms)."""

    batch: float
    k: int
    step_ms: float


@dataclass(frozen=True)
class StepCostModel:
    """Fitted coefficients (ms) of the step-cost form in the module docstring.

    ``fitted`` names the terms the data could identify; the others are 0. ``rms_residual_ms`` is
    the fit's root-mean-square residual over ``n_observations`` cells.
    """

    fixed_ms: float
    per_request_ms: float
    spec_fixed_ms: float
    per_draft_token_ms: float
    per_draft_pass_ms: float
    fitted: tuple[str, ...]
    rms_residual_ms: float
    n_observations: int

    @property
    def coefficients(self) -> np.ndarray:
        """Coefficients in :data:`TERMS` order."""
        return np.array([getattr(self, t) for t in TERMS], dtype=float)

    def step_ms(self, batch: float, k: int) -> float:
        """Modelled step time at generation batch ``batch`` and draft length ``k``."""
        return float(_features(batch, k) @ self.coefficients)

    def spec_extra_ms(self, batch: float, k: int) -> float:
        """Modelled extra step time of speculation: ``t_step(b, k) - t_step(b, 0)``."""
        return self.step_ms(batch, k) - self.step_ms(batch, 0)


def observation_from_cell(cell: CellMeasurement) -> StepCostObservation | None:
    """A cell's step cost: from iterations when present, else from client timings.

    Client timings give a step time as token-weighted TPOT times the measured tokens per step, at
    batch = concurrency. None when neither iterations nor (for ``k > 0``) acceptance is known.
    """
    batch, step = cell.mean_batch_size(), cell.mean_step_ms()
    if batch is not None and step is not None:
        return StepCostObservation(batch, cell.k, step)
    tokens = cell.tokens_per_step()
    num, den = request_terms(cell.records)
    if tokens is None or den.size == 0:
        return None
    return StepCostObservation(
        float(cell.concurrency), cell.k, float(num.sum() / den.sum()) * tokens
    )


def _identifiable_columns(x: np.ndarray) -> list[int]:
    """Greedily keep each column, in order, that raises the rank of the kept set."""
    kept: list[int] = []
    rank = 0
    for j in range(x.shape[1]):
        trial = kept + [j]
        r = int(np.linalg.matrix_rank(x[:, trial]))
        if r > rank:
            kept, rank = trial, r
    return kept


def _nnls_by_support(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a handful of columns.

    The optimum is the unconstrained least-squares solution on its own support, so trying every
    support and keeping the best feasible one finds it. Smaller supports win ties.
    """
    m = x.shape[1]
    best = np.zeros(m)
    best_sse = float(y @ y)
    margin = 1e-24 * max(best_sse, 1.0)  # round-off only: real terms, however small, count
    for size in range(1, m + 1):
        for support in itertools.combinations(range(m), size):
            cols = list(support)
            coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if (coef < 0).any():
                continue
            resid = y - x[:, cols] @ coef
            sse = float(resid @ resid)
            if sse < best_sse - margin:
                best = np.zeros(m)
                best[cols] = coef
                best_sse = sse
    return best


def fit_step_cost(observations: Sequence[StepCostObservation]) -> StepCostModel:
    """Fit the step-cost form to measured cells by non-negative least squares."""
    if not observations:
        raise BadInputError("step-cost model", "no measured cells to fit")
    x = np.stack([_features(o.batch, o.k) for o in observations])
    y = np.array([o.step_ms for o in observations], dtype=float)
    cols = _identifiable_columns(x)
    coef = np.zeros(len(TERMS))
    coef[cols] = _nnls_by_support(x[:, cols], y)
    resid = y - x @ coef
    return StepCostModel(
        *(float(c) for c in coef),
        fitted=tuple(TERMS[j] for j in cols),
        rms_residual_ms=float(np.sqrt(np.mean(resid**2))),
        n_observations=len(observations),
    )


@dataclass(frozen=True)
class CellPrediction:
    """Predicted cost of one (concurrency, k) cell; times in ms, ``ratio`` as in the cost module."""

    concurrency: int
    k: int
    batch: float
    base_step_ms: float
    step_ms: float
    expected_tokens: float
    ms_per_token: float
    ratio: float
    # per decode token, the time a user waits through other requests' prefills (ms; 0: steps
    # only): in ms_per_token and ratio, the same with speculation as without (module docstring)
    stall_ms: float = 0.0


def predict_cell(
    model: StepCostModel,
    concurrency: int,
    k: int,
    alphas: Sequence[float],
    *,
    base_step_ms: float | None = None,
    batch: float | None = None,
    stall_ms: float = 0.0,
) -> CellPrediction:
    """Predict a cell from the model, per-position acceptance and the measured baseline step.

    ``batch`` defaults to ``concurrency``; ``base_step_ms`` to the model's own ``t_step(b, 0)``;
    ``stall_ms``: the baseline's wait per decode token through other requests' prefills, added
    to both sides of the ratio (module docstring).
    """
    b = float(concurrency if batch is None else batch)
    base = model.step_ms(b, 0) if base_step_ms is None else float(base_step_ms)
    if not base > 0:
        raise BadInputError(
            f"concurrency {concurrency}", f"baseline step time {base} ms is not > 0"
        )
    if not stall_ms >= 0:
        raise BadInputError(f"concurrency {concurrency}", f"stall {stall_ms} ms is not >= 0")
    step = base + model.spec_extra_ms(b, k)
    tokens = expected_tokens_per_step(alphas, k)
    return CellPrediction(
        concurrency=concurrency,
        k=k,
        batch=b,
        base_step_ms=base,
        step_ms=step,
        expected_tokens=tokens,
        ms_per_token=step / tokens + stall_ms,
        ratio=(step / tokens + stall_ms) / (base + stall_ms),
        stall_ms=stall_ms,
    )


def predict_grid(
    model: StepCostModel,
    alphas_by_concurrency: Mapping[int, Sequence[float]],
    max_draft_len: int,
    *,
    base_step_ms: Mapping[int, float] | None = None,
    batch_by_concurrency: Mapping[int, float] | None = None,
    batch_by_cell: Mapping[tuple[int, int], float] | None = None,
    stall_ms: Mapping[int, float] | None = None,
) -> tuple[CellPrediction, ...]:
    """Predict every ``k = 0..max_draft_len`` at every concurrency in ``alphas_by_concurrency``.

    A cell's generation batch is ``batch_by_cell[(c, k)]`` when given, else
    ``batch_by_concurrency[c]``, else ``c``; ``stall_ms[c]``: the baseline's prefill stall per
    decode token there (none: 0, the step ratio).
    """
    base_step_ms = base_step_ms or {}
    batch_by_concurrency = batch_by_concurrency or {}
    batch_by_cell = batch_by_cell or {}
    stall_ms = stall_ms or {}
    return tuple(
        predict_cell(
            model,
            c,
            k,
            alphas_by_concurrency[c],
            base_step_ms=base_step_ms.get(c),
            batch=batch_by_cell.get((c, k), batch_by_concurrency.get(c)),
            stall_ms=stall_ms.get(c, 0.0),
        )
        for c in sorted(alphas_by_concurrency)
        for k in range(max_draft_len + 1)
    )


def choose_k(predictions: Sequence[CellPrediction], *, min_gain: float = 0.0) -> dict[int, int]:
    """Best ``k`` per concurrency: lowest predicted ratio, 0 unless it is below ``1 - min_gain``."""
    best: dict[int, CellPrediction] = {}
    for p in predictions:
        if p.k == 0:
            best.setdefault(p.concurrency, p)
            continue
        cur = best.get(p.concurrency)
        if (
            cur is None
            or cur.k == 0
            or p.ratio < cur.ratio
            or (p.ratio == cur.ratio and p.k < cur.k)
        ):
            best[p.concurrency] = p
    return {
        c: (p.k if p.k > 0 and p.ratio < 1.0 - min_gain else 0) for c, p in sorted(best.items())
    }


def break_even_concurrency(choices: Mapping[int, int]) -> int | None:
    """Smallest concurrency from which the choice is 0 for every larger measured concurrency.

    None when speculation is still chosen at the largest concurrency measured.
    """
    result = None
    for c in sorted(choices, reverse=True):
        if choices[c] != 0:
            break
        result = c
    return result


def capped_choices(choices: Mapping[int, int]) -> dict[int, int]:
    """Lower every choice to at most the choice at the smallest concurrency.

    TensorRT-LLM requires the schedule's smallest key to map to ``max_draft_len`` and every value
    to be ``<= max_draft_len``, so a later, larger ``k`` is not representable.
    """
    if not choices:
        return {}
    items = sorted(choices.items())
    cap = items[0][1]
    return {c: min(k, cap) for c, k in items}


def _runs(choices: Mapping[int, int]) -> list[tuple[int, int]]:
    """Collapse consecutive equal choices to ``(last concurrency of the run, k)``."""
    runs: list[tuple[int, int]] = []
    for c, k in sorted(choices.items()):
        if runs and runs[-1][1] == k:
            runs[-1] = (c, k)
        else:
            runs.append((c, k))
    return runs


def _check_choices(choices: Mapping[int, int]) -> None:
    where = "draft-length choices"
    if any(c < 1 for c in choices) or any(k < 0 for k in choices.values()):
        raise BadInputError(where, "concurrencies must be >= 1 and draft lengths >= 0")
    if choices != capped_choices(choices):
        raise BadInputError(
            where,
            "a larger draft length at a larger concurrency cannot be written as a TensorRT-LLM "
            "draft_len_schedule (its smallest key must hold max_draft_len); cap them first",
        )


def choice_for_batch(choices: Mapping[int, int], batch_size: int) -> int:
    """The draft length ``choices`` imply for any batch size.

    A batch size between two measured concurrencies takes the choice of the next larger one (the
    bucket ``(c_prev, c]`` belongs to ``c``); beyond the largest measured concurrency, 0. This is
    the function every schedule written here encodes.
    """
    keys = sorted(choices)
    idx = bisect.bisect_left(keys, batch_size)
    return choices[keys[idx]] if idx < len(keys) else 0


def schedule_from_choices(
    choices: Mapping[int, int], semantics: ScheduleSemantics = "up_to"
) -> dict[int, int]:
    """TensorRT-LLM ``draft_len_schedule`` applying :func:`choice_for_batch` at every batch size.

    ``up_to`` (TensorRT-LLM main since PR #10860, 2026): a key covers batch sizes above the
    previous key up to itself; beyond the largest key speculation is off. One key per run of
    equal choices (its last concurrency); trailing zeros are implicit. ``from`` (1.2.x): a key
    covers batch sizes from itself to the next key; the schedule starts at key 1 and needs an
    explicit 0 after the last speculating run. Either way the smallest key holds the choice at
    the smallest concurrency, which must be used as ``max_draft_len``. Speculation off everywhere
    gives ``{}``: write no ``speculative_config`` then. Choices must already be capped
    (:func:`capped_choices`).
    """
    _check_choices(choices)
    runs = _runs(choices)
    if not runs or all(k == 0 for _, k in runs):
        return {}
    if semantics == "up_to":
        while runs[-1][1] == 0:
            runs.pop()
        return dict(runs)
    if semantics == "from":
        schedule: dict[int, int] = {}
        start = 1
        for end, k in runs:
            schedule[start] = k
            start = end + 1
        if runs[-1][1] != 0:
            schedule[start] = 0
        return schedule
    raise BadInputError("draft_len_schedule", f"unknown semantics {semantics!r}")


def draft_len_for_batch(
    schedule: Mapping[int, int], batch_size: int, semantics: ScheduleSemantics = "up_to"
) -> int:
    """The draft length TensorRT-LLM applies at ``batch_size`` under ``schedule``.

    Mirrors ``get_draft_len_for_batch_size``: ``up_to`` takes the first key ``>= batch_size``
    (``bisect_left``) and 0 beyond the last key; ``from`` takes the last key ``<= batch_size``
    (``bisect_right``) and 0 below the first. An empty schedule means speculation off: 0.
    """
    keys = sorted(schedule)
    if not keys:
        return 0
    if semantics == "up_to":
        idx = bisect.bisect_left(keys, batch_size)
        return schedule[keys[idx]] if idx < len(keys) else 0
    if semantics == "from":
        idx = bisect.bisect_right(keys, batch_size)
        return schedule[keys[idx - 1]] if idx > 0 else 0
    raise BadInputError("draft_len_schedule", f"unknown semantics {semantics!r}")


@dataclass(frozen=True)
class ConcurrencyGate:
    """TensorRT-LLM's simpler gate: draft ``max_draft_len`` while batch ``<= max_concurrency``."""

    max_draft_len: int
    max_concurrency: int


def gate_from_choices(choices: Mapping[int, int]) -> ConcurrencyGate | None:
    """The ``max_draft_len`` + ``max_concurrency`` pair equal to ``choices``, when one exists.

    It exists when the choices are one draft length ``k > 0`` up to some concurrency and 0 after
    it; ``max_concurrency`` is then the last concurrency that speculates (same bucket rule as
    :func:`choice_for_batch`). None otherwise, including when speculation is never chosen.
    """
    _check_choices(choices)
    runs = _runs(choices)
    if runs and runs[-1][1] == 0:
        runs = runs[:-1]
    if len(runs) != 1 or runs[0][1] == 0:
        return None
    return ConcurrencyGate(max_draft_len=runs[0][1], max_concurrency=runs[0][0])

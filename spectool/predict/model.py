"""Speculative speed-up per concurrency and draft length, from step costs and acceptance.

Per-user speed-up at concurrency ``c`` and draft length ``k``::

    speedup = t_target(c, 1) / ((t_draft(c, k) + t_verify(c, k + 1) + t_coord(c)) / AL(k))

``t_target(c, 1)``: one plain decode step; ``t_verify(c, k+1)``: the target verifying ``c x
(k+1)`` tokens; ``AL(k)``: confirmed tokens per step, bonus included. ``t_draft`` by method:

* ``draft_model``: ``k`` single-token drafter steps; the first carries two tokens per sequence
  when some sequence of the batch had all ``k`` drafts accepted (its last draft is not yet in
  the drafter's cache);
* ``eagle3`` / ``eagle``: ``k`` forwards of the head (its decoder layer, ``fc`` and the
  draft-vocabulary LM head are all in its geometry), the first over the ``AL`` tokens confirmed
  last step;
* ``mtp``: ``k`` forwards of one MTP layer (the target's geometry cut to one layer, its LM head):
  TensorRT-LLM's default for a checkpoint with one MTP layer replays it ``k`` times
  (``MTPDecodingConfig``, ``MTP_EAGLE_ONE_MODEL``; NVIDIA/TensorRT-LLM
  ``tensorrt_llm/llmapi/llm_args.py`` @ 0004396, ~1.4 dev);
* ``ngram``: 0 (prompt lookup on the host; its cost is in the coordination overhead);
* ``medusa``: ``k`` LM-head-sized heads in one pass.

Every draft forward also pays the engine's ``draft_step_overhead_s`` (sampling, bookkeeping,
launches): ``k`` of them for a head, a draft model or MTP, one for Medusa, none for n-gram.

Without acceptance, :func:`break_even_length` answers the question backwards: the acceptance
length at which speculation pays.

With a :class:`~spectool.parallel.ParallelLayout` (``Setup.layout``) every forward is one rank's
(:func:`spectool.predict.parallel_cost.rank_forward`: attention DP's MoE exchange, the TP link
across nodes), and with PP a step is :func:`~spectool.predict.parallel_cost.pipelined` over the
stages, the last carrying the iteration overhead, the drafting and the coordination (the LM
head, the sampler and a one-model drafter live there); see :mod:`spectool.predict.parallel_cost`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spectool import methods
from spectool.decide.chain import constant_alpha_for
from spectool.errors import BadInputError
from spectool.parallel import ParallelLayout
from spectool.predict import parallel_cost as pc
from spectool.predict.acceptance import Acceptance
from spectool.predict.cost import EngineFactors, Hardware, StepCost, forward_cost
from spectool.predict.geometry import Geometry

METHODS = methods.METHODS
# Methods whose cost needs the drafter's sizes (spectool.methods)
DRAFTER_GEOMETRY_METHODS = methods.DRAFTER_GEOMETRY_METHODS


@dataclass(frozen=True)
class Setup:
    """Everything but acceptance: models, method, device, engine factors, parallelism, context.

    ``drafter``: the draft model's or head's geometry (``draft_model``, ``eagle3``, ``eagle``);
    None for ``mtp`` (uses ``mtp_layer`` or the target cut to one layer), ``ngram`` and
    ``medusa``. ``context``: tokens of context per sequence during decode (prompt + half the
    output is a fair mean). ``drafter_hardware`` / ``drafter_factors``: the drafter's own
    figures where they differ (the CPU probe run at the drafter's shapes); None = the target's.
    ``layout``: the parallel layout (None: ``tp`` GPUs of one node); its ``tp`` must be ``tp``.
    """

    target: Geometry
    method: str
    hardware: Hardware
    factors: EngineFactors
    drafter: Geometry | None = None
    tp: int = 1
    context: int = 1024
    mtp_layer: Geometry | None = None
    drafter_hardware: Hardware | None = None
    drafter_factors: EngineFactors | None = None
    layout: ParallelLayout | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise BadInputError("prediction", f"method {self.method!r} not in {', '.join(METHODS)}")
        if self.method in DRAFTER_GEOMETRY_METHODS and self.drafter is None:
            raise BadInputError("prediction", f"method {self.method} needs the drafter's geometry")
        if self.tp < 1 or self.context < 0:
            raise BadInputError("prediction", "tp must be >= 1 and context >= 0")
        lay = self.layout
        if lay is not None and lay.tp != self.tp:
            raise BadInputError("prediction", f"tp {self.tp} differs from the layout's {lay.tp}")
        if lay is not None and lay.pp > 1 and self.method in pc.PP_REFUSED_METHODS:
            raise BadInputError(
                "prediction", f"TensorRT-LLM runs no {self.method} drafter with PP {lay.pp}"
            )

    def forward(
        self,
        geom: Geometry,
        hw: Hardware,
        f: EngineFactors,
        batch: float,
        tokens: float,
        ctx: float,
    ) -> StepCost:
        """One forward of ``geom`` on one rank (of the layout's TP group; no pipeline)."""
        if self.layout is None:
            return forward_cost(geom, hw, f, batch, tokens, ctx, self.tp)
        return pc.rank_forward(geom, hw, f, batch, tokens, ctx, self.layout)

    def _stepped(self, batch: float, tokens: float, last: Callable[[float], float]) -> float:
        """A step with a layout: the target's stages at ``tokens`` per sequence, ``last(b)``
        added to the last stage (``b`` sequences per micro-batch), pipelined."""
        assert self.layout is not None
        in_flight, b = pc.micro_batches(self.layout, batch)
        stages = pc.stage_seconds(
            self.target, self.hardware, self.factors, b, tokens, self.context, self.layout
        )
        stages[-1] += last(b)
        return pc.pipelined(stages, in_flight)

    def base_step(self, batch: float) -> float:
        """Seconds of one plain decode step: the iteration overhead + one target forward."""
        if self.layout is not None:
            return self._stepped(batch, 1, lambda b: self.factors.step_overhead_s)
        return self.factors.step_overhead_s + self.target_step(batch, 1)

    def target_step(self, batch: float, tokens: float) -> float:
        """Seconds of one target forward of ``batch x tokens`` tokens (no iteration overhead;
        with PP every stage in turn, nothing overlapped)."""
        if self.layout is not None:
            return sum(
                pc.stage_seconds(
                    self.target,
                    self.hardware,
                    self.factors,
                    batch,
                    tokens,
                    self.context,
                    self.layout,
                )
            )
        return forward_cost(
            self.target, self.hardware, self.factors, batch, tokens, self.context, self.tp
        ).seconds

    def draft_time(self, batch: float, k: int, tokens: float, p_all: float) -> float:
        """Seconds of drafting ``k`` tokens for ``batch`` sequences.

        ``tokens``: confirmed tokens per step (what an EAGLE head catches up on first);
        ``p_all``: P(all ``k`` drafts of a sequence accepted), when a draft model must also feed
        its last draft token (its cache holds every other confirmed token): a batch pads to two
        tokens if any sequence needs it, P = 1 - (1 - p_all) ** batch.
        """
        if k == 0 or self.method == "ngram":
            return 0.0
        hw, f, ctx, fwd = self.hardware, self.factors, self.context, self.forward
        per_step = f.draft_step_overhead_s  # sampling and launches of one draft step
        if self.method == "mtp":
            layer = self.mtp_layer or self.target.with_layers(1, name="mtp layer")
            return k * (fwd(layer, hw, f, batch, 1, ctx).seconds + per_step)
        if self.method == "medusa":
            heads = self.target.with_layers(1)
            step = fwd(heads, hw, f, batch, 1, 0)
            return step.seconds + (k - 1) * step.memory_s + per_step
        assert self.drafter is not None
        # a probe can measure the drafter at its own shapes (small matmuls run slower per FLOP)
        hw = self.drafter_hardware or hw
        f = self.drafter_factors or f
        one = fwd(self.drafter, hw, f, batch, 1, ctx).seconds
        if self.method == "draft_model":
            q = 1.0 - (1.0 - p_all) ** batch
            two = fwd(self.drafter, hw, f, batch, 2, ctx).seconds
            first = q * two + (1.0 - q) * one
        else:  # EAGLE heads re-read the hidden states of every token confirmed last step
            first = fwd(self.drafter, hw, f, batch, max(1.0, tokens), ctx).seconds
        return first + (k - 1) * one + k * per_step

    def coord_time(self, batch: float) -> float:
        """Iteration overhead of a speculative step: the plain one plus speculation's own."""
        f = self.factors
        return f.step_overhead_s + f.spec_overhead_s + batch * f.spec_seq_overhead_s

    def spec_step(self, batch: float, k: int, tokens: float, p_all: float) -> float:
        """Seconds of one speculative step: draft + verify ``k + 1`` tokens + coordination."""
        if self.layout is not None:
            return self._stepped(
                batch,
                k + 1,
                lambda b: self.draft_time(b, k, tokens, p_all) + self.coord_time(b),
            )
        return (
            self.draft_time(batch, k, tokens, p_all)
            + self.target_step(batch, k + 1)
            + self.coord_time(batch)
        )


def leviathan_alpha(length: float, k: int) -> float:
    """The constant alpha giving ``length`` tokens per step at ``k`` (clamped to [1, k+1])."""
    return constant_alpha_for(min(max(length, 1.0), k + 1.0), k)


def break_even_length(setup: Setup, batch: int, k: int) -> float:
    """Tokens per step (bonus included) at which draft length ``k`` breaks even at ``batch``.

    Self-consistent: the drafter's catch-up grows with the acceptance length, so iterate.
    """
    base = setup.base_step(batch)
    length = 1.0
    for _ in range(8):  # p_all from a constant alpha with this length
        p_all = leviathan_alpha(length, k) ** k
        length = min(float(k + 1), setup.spec_step(batch, k, length, p_all) / base)
    return setup.spec_step(batch, k, length, leviathan_alpha(length, k) ** k) / base


@dataclass(frozen=True)
class KPrediction:
    k: int
    spec_step_s: float
    break_even_length: float
    tokens_per_step: float | None
    speedup: float | None  # per-user tokens/s ratio spec : baseline


@dataclass(frozen=True)
class ConcurrencyPrediction:
    concurrency: int
    base_step_s: float
    ks: tuple[KPrediction, ...]

    @property
    def best(self) -> KPrediction | None:
        """The draft length with the largest predicted speed-up (None without acceptance)."""
        known = [p for p in self.ks if p.speedup is not None]
        return max(known, key=lambda p: p.speedup or 0.0) if known else None

    @property
    def min_break_even(self) -> KPrediction:
        """The draft length that needs the least acceptance length to pay."""
        return min(self.ks, key=lambda p: p.break_even_length)


@dataclass(frozen=True)
class Prediction:
    setup: Setup
    acceptance: Acceptance | None
    rows: tuple[ConcurrencyPrediction, ...]
    break_even_concurrency: int | None  # the lowest concurrency at which no k pays

    def at(self, concurrency: int) -> ConcurrencyPrediction:
        for row in self.rows:
            if row.concurrency == concurrency:
                return row
        raise KeyError(concurrency)


def _k_prediction(setup: Setup, batch: int, k: int, acc: Acceptance | None) -> KPrediction:
    base = setup.base_step(batch)
    tokens = acc.tokens_per_step(k) if acc is not None else None
    if tokens is None or acc is None:
        length = break_even_length(setup, batch, k)
        p_all = leviathan_alpha(length, k) ** k
        return KPrediction(k, setup.spec_step(batch, k, length, p_all), length, None, None)
    spec = setup.spec_step(batch, k, tokens, acc.all_accepted(k))
    return KPrediction(
        k=k,
        spec_step_s=spec,
        break_even_length=break_even_length(setup, batch, k),
        tokens_per_step=tokens,
        speedup=base * tokens / spec,
    )


def speedup(setup: Setup, acceptance: Acceptance, concurrency: int, k: int) -> float:
    """Predicted per-user speed-up at one concurrency and draft length."""
    tokens = acceptance.tokens_per_step(k)
    if tokens is None:
        raise BadInputError(
            "prediction", f"acceptance measured up to k={acceptance.max_k}, not {k}"
        )
    base = setup.base_step(concurrency)
    spec = setup.spec_step(concurrency, k, tokens, acceptance.all_accepted(k))
    return base * tokens / spec


def _pays(setup: Setup, acc: Acceptance | None, batch: int, ks: Sequence[int]) -> bool:
    for k in ks:
        p = _k_prediction(setup, batch, k, acc)
        if (p.speedup if p.speedup is not None else 0.0) > 1.0:
            return True
    return False


def break_even_concurrency(
    setup: Setup, acceptance: Acceptance, ks: Sequence[int], limit: int = 4096
) -> int | None:
    """The lowest concurrency (<= ``limit``) at which no draft length in ``ks`` pays; None if
    some k pays up to ``limit``, 1 if none pays at all. Bisection: speed-up falls with batch."""
    if not _pays(setup, acceptance, 1, ks):
        return 1
    if _pays(setup, acceptance, limit, ks):
        return None
    lo, hi = 1, limit  # pays at lo, not at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _pays(setup, acceptance, mid, ks):
            lo = mid
        else:
            hi = mid
    return hi


def predict(
    setup: Setup,
    acceptance: Acceptance | None,
    concurrencies: Sequence[int] = (1, 8, 64),
    ks: Sequence[int] = tuple(range(1, 9)),
) -> Prediction:
    """Predict every (concurrency, k): step times, break-even acceptance length and, given
    acceptance, speed-up and the best k. Draft lengths the acceptance does not cover (measured
    per position up to a smaller k) get a break-even figure only."""
    if not concurrencies or any(c < 1 for c in concurrencies) or any(k < 1 for k in ks):
        raise BadInputError("prediction", "concurrencies and draft lengths must be >= 1")
    rows = tuple(
        ConcurrencyPrediction(
            concurrency=c,
            base_step_s=setup.base_step(c),
            ks=tuple(_k_prediction(setup, c, k, acceptance) for k in ks),
        )
        for c in concurrencies
    )
    covered = [k for k in ks if acceptance is not None and acceptance.tokens_per_step(k)]
    be_c = (
        break_even_concurrency(setup, acceptance, covered)
        if acceptance is not None and covered
        else None
    )
    return Prediction(setup, acceptance, rows, be_c)

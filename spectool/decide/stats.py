"""Per-cell latency and throughput as one user and the server see them, with bootstrap intervals.

For a measured (concurrency ``c``, draft length ``k``) cell, over its successful requests ``r``:

* **ms per token** (token-weighted TPOT) = ``sum_r (E2E_r - TTFT_r) / sum_r (out_r - 1)`` in ms:
  the decode time per output token after the first, what the cost inequality's client path uses;
* **tokens/s per user** = ``1000 / ms per token``;
* **throughput** (output tokens/s of the server) = ``c * sum_r out_r / sum_r E2E_r``: in a closed
  loop each of the ``c`` workers is always waiting on a request, so the server delivers ``c``
  requests' worth of tokens per mean request time (Little's law). ``wall_tokens_per_s`` is the
  plain ``sum_r out_r / trial wall time`` for comparison (it also counts the ramp-down of the
  last wave);
* **TTFT p50** in ms.

Intervals: percentile bootstrap over requests (i.i.d.), ``n_boot`` resamples, generator seeded
from ``(seed, c, k)``; the per-user rate's interval is the ms-per-token interval inverted.
Server-side: mean decode-step time, mean batch, confirmed tokens per step, per-position
acceptance (``alpha_i``) when the engine counts it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from spectool.decide.acceptance import PositionCounts, constant_alpha_for
from spectool.decide.cell import CellMeasurement
from spectool.decide.cost import ratio_interval, request_terms, usable_requests
from spectool.decide.latency import MS_PER_S
from spectool.decide.verdict import CellVerdict
from spectool.errors import BadInputError


@dataclass(frozen=True)
class Interval:
    """A point estimate and its bootstrap interval (same unit)."""

    value: float
    low: float
    high: float

    def to_json(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class CellStats:
    """One cell's latency, throughput and server numbers; see the module docstring."""

    concurrency: int
    k: int
    requests: int
    ms_per_token: Interval
    tokens_per_s_per_user: Interval
    throughput_tokens_per_s: Interval
    wall_tokens_per_s: float | None
    ttft_p50_ms: float | None
    step_ms: float | None
    mean_batch: float | None
    tokens_per_step: float | None
    alphas: tuple[float, ...] | None

    def to_json(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "k": self.k,
            "requests": self.requests,
            "ms_per_token": self.ms_per_token.to_json(),
            "tokens_per_s_per_user": self.tokens_per_s_per_user.to_json(),
            "throughput_tokens_per_s": self.throughput_tokens_per_s.to_json(),
            "wall_tokens_per_s": self.wall_tokens_per_s,
            "ttft_p50_ms": self.ttft_p50_ms,
            "step_ms": self.step_ms,
            "mean_batch": self.mean_batch,
            "tokens_per_step": self.tokens_per_step,
            "alphas": list(self.alphas) if self.alphas is not None else None,
        }


def cell_stats(
    cell: CellMeasurement, *, n_boot: int = 1000, confidence: float = 0.95, seed: int = 0
) -> CellStats:
    """Summarize ``cell`` (needs at least two successful requests with two or more tokens)."""
    used = usable_requests(cell.records)
    if len(used) < 2:
        raise BadInputError(
            f"cell (concurrency={cell.concurrency}, k={cell.k})",
            f"{len(used)} usable requests; need 2 with at least two output tokens",
        )
    rng = np.random.default_rng([seed, cell.concurrency, cell.k])
    decode_ms, later_tokens = request_terms(used)
    tpot = Interval(
        *ratio_interval(decode_ms, later_tokens, n_boot=n_boot, confidence=confidence, rng=rng)
    )
    per_user = Interval(MS_PER_S / tpot.value, MS_PER_S / tpot.high, MS_PER_S / tpot.low)
    out = np.array([r.output_tokens for r in used], dtype=float)
    e2e = np.array([r.e2e_s for r in used], dtype=float)
    rate, low, high = ratio_interval(out, e2e, n_boot=n_boot, confidence=confidence, rng=rng)
    throughput = Interval(*(cell.concurrency * x for x in (rate, low, high)))
    ttfts = [t * MS_PER_S for r in used if (t := r.ttft_s) is not None]
    wall = float(out.sum()) / cell.duration_s if cell.duration_s and cell.duration_s > 0 else None
    alphas = None
    if cell.positions is not None and cell.positions.steps:
        alphas = cell.positions.alphas()
    return CellStats(
        concurrency=cell.concurrency,
        k=cell.k,
        requests=len(used),
        ms_per_token=tpot,
        tokens_per_s_per_user=per_user,
        throughput_tokens_per_s=throughput,
        wall_tokens_per_s=wall,
        ttft_p50_ms=float(np.percentile(ttfts, 50)) if ttfts else None,
        step_ms=cell.mean_step_ms(),
        mean_batch=cell.mean_batch_size(),
        tokens_per_step=cell.tokens_per_step(),
        alphas=alphas,
    )


STEP_VS_CLIENT = 0.10  # client and engine figures that differ by more than this get a note
_SOURCE_WORDS = {
    "requests": "time per output token",
    "e2e": "request latency",
    "ttft": "time to first token",
    "throughput": "request time per output token",
}


def stall_notes(
    choices: Mapping[int, int],
    verdicts: Sequence[CellVerdict],
    stats: Mapping[tuple[int, int], CellStats],
    step_ratios: Mapping[tuple[int, int], float] | None = None,
) -> list[str]:
    """Notes for chosen cells where the engine's decode steps and the users' time per output
    token disagree by more than :data:`STEP_VS_CLIENT` (10%), with both numbers and the cause.

    The cost inequality compares decode *steps* (the engine's own counters); a user's time per
    output token (TPOT, the client's clock) also holds whatever stops decoding between steps:
    prefills of arriving requests, queueing, streaming. Speculation does not shorten that time
    (it even makes arrivals more frequent, since requests finish sooner), so with short outputs
    and long prompts at high concurrency users gain less than the steps show. On the demo pair
    both sources agree within 10% where nothing arrives mid-decode (concurrency 1, or one
    synchronized wave); see the README's "Client, server and engine".

    Where a users' metric decided (the verdict compares the client's records, not iterations),
    ``step_ratios`` (per cell, the decode steps' ratio) explains it instead: the note gives the
    users' ratio that decided and the steps' ratio beside it.
    """
    by_key = {(v.concurrency, v.k): v for v in verdicts}
    notes = []
    for c, k in sorted(choices.items()):
        verdict, spec, base = by_key.get((c, k)), stats.get((c, k)), stats.get((c, 0))
        if k == 0 or verdict is None or spec is None or base is None:
            continue
        if verdict.source != "iterations":
            steps = (step_ratios or {}).get((c, k))
            if steps is not None and abs(verdict.ratio / steps - 1.0) > STEP_VS_CLIENT:
                why = (
                    "the difference is time outside decode steps (prefills of arriving "
                    "requests, queueing), which speculation does not shorten"
                    if verdict.ratio > steps
                    else "users gain more than the steps: requests that finish sooner also "
                    "spend less time waiting behind other requests' prefills and in the queue"
                )
                words = _SOURCE_WORDS.get(verdict.source, "wall time per request within the SLO")
                notes.append(
                    f"concurrency {c}, k={k}: users' {words} (what "
                    f"decided) is {verdict.ratio:.2f} of the baseline's, decode steps alone cost "
                    f"{steps:.2f} per token: {why}"
                )
            continue
        tpot_ratio = spec.ms_per_token.value / base.ms_per_token.value
        if abs(tpot_ratio / verdict.ratio - 1.0) > STEP_VS_CLIENT:
            notes.append(
                f"concurrency {c}, k={k}: decode steps cost {verdict.ratio:.2f} of the baseline "
                f"per token, but users' time per output token is {tpot_ratio:.2f} of it "
                f"({spec.ms_per_token.value:.1f} against {base.ms_per_token.value:.1f} ms): the "
                "rest is time outside decode steps (prefills of arriving requests, queueing), "
                "which speculation does not shorten"
            )
    return notes


def acceptance_curves(
    cells: Mapping[tuple[int, int], CellMeasurement],
) -> tuple[dict[int, tuple[float, ...]], bool]:
    """Per concurrency, ``alpha_i`` pooled over its speculative cells (what the acceptance plot
    draws and the report's pooled rows list); True when per-position counts were measured, else
    a constant rate fitted to each concurrency's longest cell's tokens per step."""
    pooled: dict[int, PositionCounts] = {}
    for (c, k), cell in sorted(cells.items()):
        if k > 0 and cell.positions is not None and cell.positions.steps:
            pooled[c] = pooled[c].merged(cell.positions) if c in pooled else cell.positions
    if pooled:
        return {c: counts.alphas() for c, counts in pooled.items()}, True
    fitted: dict[int, tuple[float, ...]] = {}
    for (c, k), cell in sorted(cells.items()):
        tokens = cell.tokens_per_step() if k > 0 else None
        if tokens is not None and (c not in fitted or k > len(fitted[c])):
            alpha = constant_alpha_for(min(max(tokens, 1.0), k + 1.0), k)
            fitted[c] = (alpha,) * k
    return fitted, False

"""The cost inequality for one (concurrency, k) cell, with a bootstrap confidence interval.

Speculation at draft length ``k`` pays at a concurrency when

    lhs = (t_draft + t_verify + t_coord) / confirmed_tokens  <  rhs = t_decode_per_token(k = 0)

both sides in milliseconds per output token as one user sees it, the right side measured without
speculation at the same concurrency (same target, engine and settings). Two ways to measure them:

* **iterations** (server iteration stats, preferred): per step ``n`` with batch ``B_n``, step time
  ``T_n = draft + verify + coord`` and ``C_n`` tokens confirmed over the batch,
  ``lhs = sum_n B_n T_n / sum_n C_n``. Each request in the step waited ``T_n`` for its share of
  ``C_n``, so this is the token-weighted mean time per confirmed token. Without speculation
  ``C_n = B_n`` and ``rhs = sum B_n T_n / sum B_n``, the batch-weighted mean step time.
* **requests** (client timings only): ``sum_r (E2E_r - TTFT_r) / sum_r (output_tokens_r - 1)``
  over successful requests with at least two output tokens: the token-weighted TPOT (see
  :mod:`spectool.decide.latency`), which already contains every cost of the step.

``ratio = lhs / rhs``; below 1 speculation pays. Beside it, with ``E_meas`` the measured confirmed
tokens per request-step (:meth:`CellMeasurement.tokens_per_step`):

* step cost ratio ``c = t_step_spec / t_step_base = ratio * E_meas`` (exact on the iterations
  path, where ``lhs = t_step_spec / E_meas`` and ``rhs = t_step_base``);
* predicted speedup ``= E_pred[tokens | k] / c`` from per-position acceptance
  (:func:`~spectool.decide.acceptance.expected_tokens_per_step`); measured speedup ``= 1 / ratio``.
  They differ only by ``E_pred / E_meas``: how well acceptance predicts the run.

Confidence interval: percentile bootstrap of ``ratio``. The spec and baseline runs are resampled
independently: requests i.i.d.; iterations in moving blocks of ``round(n ** (1/3))`` consecutive
steps, because neighbouring steps share requests and are correlated. Verdict: ``pays`` if the
whole interval lies below 1, ``does_not_pay`` if above, else ``inconclusive``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spectool.decide.acceptance import expected_tokens_per_step
from spectool.decide.cell import CellMeasurement, IterationSample
from spectool.decide.latency import MS_PER_S, RequestRecord
from spectool.decide.slo import goodput_terms, parse_slo
from spectool.decide.verdict import CellVerdict, PairedEstimate, Source, verdict_for
from spectool.errors import BadInputError

_MAX_INDEX_ELEMENTS = 4_000_000  # cap on one bootstrap chunk's index matrix


def iteration_terms(samples: Sequence[IterationSample]) -> tuple[np.ndarray, np.ndarray]:
    """Per-iteration numerator ``B_n * T_n`` (ms) and denominator ``C_n`` (tokens)."""
    num = np.array([s.batch_size * s.step_ms for s in samples], dtype=float)
    den = np.array([s.confirmed_tokens for s in samples], dtype=float)
    return num, den


def request_terms(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """Per-request numerator ``E2E - TTFT`` (ms) and denominator ``output_tokens - 1``.

    Only successful requests with a first token and at least two output tokens count.
    """
    used = usable_requests(records)
    num = np.array([r.decode_s * MS_PER_S for r in used], dtype=float)  # type: ignore[operator]
    den = np.array([r.output_tokens - 1 for r in used], dtype=float)
    return num, den


def source_terms(cell: CellMeasurement, source: Source) -> tuple[np.ndarray, np.ndarray]:
    """``cell``'s per-unit numerator (ms) and denominator for ``source`` (see
    :data:`~spectool.decide.verdict.Source`): iterations and tokens, requests' decode time and
    decode tokens, their latency or first-token time and 1 each, their latency and output
    tokens."""
    if source == "iterations":
        return iteration_terms(cell.iterations)
    if source == "requests":
        return request_terms(cell.records)
    if source.startswith("goodput:"):
        return goodput_terms(cell.records, parse_slo(source.split(":", 1)[1]))
    used = usable_requests(cell.records)
    if source == "e2e":
        num = [r.e2e_s * MS_PER_S for r in used]
        den = [1.0] * len(used)
    elif source == "ttft":
        num = [r.ttft_s * MS_PER_S for r in used]  # type: ignore[operator]
        den = [1.0] * len(used)
    else:
        num = [r.e2e_s * MS_PER_S for r in used]
        den = [float(r.output_tokens) for r in used]
    return np.array(num, dtype=float), np.array(den, dtype=float)


def usable_requests(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The requests the client path counts: successful, timed to the first token, and with at
    least two output tokens (so there is a decode time per token after the first)."""
    return [r for r in records if r.ok and r.output_tokens >= 2 and r.decode_s is not None]


def default_block_len(n: int) -> int:
    """Moving-block length for ``n`` correlated iterations: ``round(n ** (1/3))``, at least 1."""
    return max(1, round(n ** (1.0 / 3.0)))


def resampled_sums(
    num: np.ndarray, den: np.ndarray, n_boot: int, rng: np.random.Generator, block_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """Sums of ``num`` and ``den`` over ``n_boot`` moving-block resamples (i.i.d. at length 1).

    Each resample concatenates ``ceil(n / block_len)`` blocks of consecutive units with uniformly
    drawn starts. The last block is not cut: the statistic is a ratio of sums, so the few extra
    units change its scale, not its value.
    """
    n = num.size
    length = min(max(1, block_len), n)
    n_blocks = -(-n // length)
    cum_num = np.concatenate([[0.0], np.cumsum(num)])
    cum_den = np.concatenate([[0.0], np.cumsum(den)])
    block_num = cum_num[length:] - cum_num[:-length]  # sum of the block starting at each unit
    block_den = cum_den[length:] - cum_den[:-length]
    n_starts = block_num.size
    sums_num = np.empty(n_boot)
    sums_den = np.empty(n_boot)
    chunk = max(1, _MAX_INDEX_ELEMENTS // n_blocks)
    for lo in range(0, n_boot, chunk):
        hi = min(n_boot, lo + chunk)
        starts = rng.integers(0, n_starts, size=(hi - lo, n_blocks))
        sums_num[lo:hi] = block_num[starts].sum(axis=1)
        sums_den[lo:hi] = block_den[starts].sum(axis=1)
    return sums_num, sums_den


def bootstrap_ratio_ci(
    spec_num: np.ndarray,
    spec_den: np.ndarray,
    base_num: np.ndarray,
    base_den: np.ndarray,
    *,
    n_boot: int = 1000,
    confidence: float = 0.95,
    rng: np.random.Generator,
    spec_block_len: int = 1,
    base_block_len: int = 1,
) -> tuple[float, float, float]:
    """``(ratio, ci_low, ci_high)`` of ``(Σ spec_num / Σ spec_den) / (Σ base_num / Σ base_den)``.

    Percentile bootstrap; the two samples are resampled independently.
    """
    if n_boot < 1 or not 0.0 < confidence < 1.0:
        raise BadInputError(
            "bootstrap", f"need n_boot >= 1 and 0 < confidence < 1, got {n_boot}, {confidence}"
        )
    for name, a, b in (("spec", spec_num, spec_den), ("baseline", base_num, base_den)):
        if a.size != b.size or a.size < 2:
            raise BadInputError("bootstrap", f"{name} sample needs at least 2 units, got {a.size}")
        if (b <= 0).any():
            raise BadInputError("bootstrap", f"{name} sample has a non-positive token count")
    ratio = float((spec_num.sum() / spec_den.sum()) / (base_num.sum() / base_den.sum()))
    s_num, s_den = resampled_sums(spec_num, spec_den, n_boot, rng, spec_block_len)
    b_num, b_den = resampled_sums(base_num, base_den, n_boot, rng, base_block_len)
    lo, hi = percentile_interval((s_num / s_den) / (b_num / b_den), confidence)
    return ratio, lo, hi


def percentile_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """The central ``confidence`` interval of bootstrap ``values`` (percentile method)."""
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return float(low), float(high)


def ratio_interval(
    num: np.ndarray,
    den: np.ndarray,
    *,
    n_boot: int,
    confidence: float,
    rng: np.random.Generator,
    block_len: int = 1,
) -> tuple[float, float, float]:
    """``(value, low, high)`` of one sample's ``Σ num / Σ den`` (percentile bootstrap)."""
    sums_num, sums_den = resampled_sums(num, den, n_boot, rng, block_len)
    low, high = percentile_interval(sums_num / sums_den, confidence)
    return float(num.sum() / den.sum()), low, high


def evaluate_cell(
    spec: CellMeasurement,
    base: CellMeasurement,
    *,
    alphas: Sequence[float] | None = None,
    n_boot: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    source: Source | None = None,
) -> CellVerdict:
    """Evaluate the cost inequality for ``spec`` against the baseline ``base`` at its concurrency.

    ``alphas`` (per-position acceptance) gives the predicted tokens per step. ``source`` forces a
    measurement path; by default iterations when both cells have them, else requests. The
    bootstrap generator is seeded from ``(seed, concurrency, k)``, so a cell's interval does not
    depend on the order cells are evaluated in.
    """
    where = f"cell (concurrency={spec.concurrency}, k={spec.k})"
    if base.k != 0 or spec.k < 1:
        raise BadInputError(
            where, f"need a speculative cell (k >= 1) and a baseline (k = 0), got k={base.k}"
        )
    if base.concurrency != spec.concurrency:
        raise BadInputError(where, f"baseline was measured at concurrency {base.concurrency}")
    if source is None:
        source = "iterations" if spec.iterations and base.iterations else "requests"
    spec_num, spec_den = source_terms(spec, source)
    base_num, base_den = source_terms(base, source)
    if source == "iterations":
        spec_block, base_block = default_block_len(spec_num.size), default_block_len(base_num.size)
    else:
        spec_block = base_block = 1
    if spec_num.size < 2 or base_num.size < 2:
        raise BadInputError(
            where,
            f"not enough {source} to compare ({spec_num.size} with speculation, "
            f"{base_num.size} without; need 2 each)",
        )
    rng = np.random.default_rng([seed, spec.concurrency, spec.k])
    ratio, lo, hi = bootstrap_ratio_ci(
        spec_num,
        spec_den,
        base_num,
        base_den,
        n_boot=n_boot,
        confidence=confidence,
        rng=rng,
        spec_block_len=spec_block,
        base_block_len=base_block,
    )
    return cell_verdict(
        spec,
        (spec_num, spec_den, base_num, base_den),
        ratio=ratio,
        interval=(lo, hi),
        source=source,
        confidence=confidence,
        n_boot=n_boot,
        alphas=alphas,
    )


def cell_verdict(
    spec: CellMeasurement,
    terms: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    *,
    ratio: float,
    interval: tuple[float, float],
    source: Source,
    confidence: float,
    n_boot: int,
    alphas: Sequence[float] | None,
    paired: PairedEstimate | None = None,
) -> CellVerdict:
    """The :class:`CellVerdict` of ``spec`` with ``ratio`` and its ``interval`` (however they
    were estimated), the sides pooled from ``terms`` (spec numerator and denominator, then the
    baseline's), and tokens per step measured and predicted from ``alphas``."""
    spec_num, spec_den, base_num, base_den = terms
    lo, hi = interval
    measured_tokens = spec.tokens_per_step()
    predicted_tokens = (
        expected_tokens_per_step(alphas, spec.k)
        if alphas is not None and len(alphas) >= spec.k
        else None
    )
    step_cost = None if measured_tokens is None else ratio * measured_tokens
    return CellVerdict(
        concurrency=spec.concurrency,
        k=spec.k,
        lhs_ms_per_token=float(spec_num.sum() / spec_den.sum()),
        rhs_ms_per_token=float(base_num.sum() / base_den.sum()),
        ratio=ratio,
        ci_low=lo,
        ci_high=hi,
        verdict=verdict_for(lo, hi),
        source=source,
        confidence=confidence,
        n_boot=n_boot,
        n_spec=int(spec_num.size),
        n_base=int(base_num.size),
        tokens_per_step_measured=measured_tokens,
        tokens_per_step_predicted=predicted_tokens,
        step_cost_ratio=step_cost,
        predicted_speedup=(
            None if step_cost is None or predicted_tokens is None else predicted_tokens / step_cost
        ),
        measured_speedup=1.0 / ratio,
        paired=paired,
    )

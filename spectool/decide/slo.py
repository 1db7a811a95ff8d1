"""Service-level objectives (``--slo``) and whether a run of requests met them.

``--slo ttft:200ms,tpot:30ms@p99,e2e:2s``: each term is ``metric:LIMIT[@pQ]``, the metric one
of :data:`METRICS` (defined in :mod:`spectool.decide.latency`: TTFT, TPOT = decode time per
output token after the first, E2E = request latency), the limit in ``ms`` or ``s`` (a bare
number is milliseconds, as vLLM's ``--goodput`` states them), the percentile ``Q`` the limit
binds (default :data:`DEFAULT_PERCENTILE`: service owners commit to a tail, not a mean). A run
meets the SLO when, for every term, the ``Q``-th percentile of the metric over its successful
requests is at or below the limit (``numpy.percentile``, linear interpolation, as
:class:`~spectool.decide.latency.Distribution`), every request succeeded, and the server kept up
with the arrivals (:func:`kept_up`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spectool.decide.latency import MS_PER_S, RequestRecord, is_good
from spectool.decide.verdict import GOODPUT, goodput_objective
from spectool.errors import BadInputError

METRICS = ("ttft", "tpot", "e2e")
DEFAULT_PERCENTILE = 99.0
KEEP_UP = 0.8  # completions may spread over at most 1/0.8 of the arrivals' span
_TERM = re.compile(r"^(ttft|tpot|e2e):([0-9]*\.?[0-9]+)(ms|s)?(?:@p([0-9]*\.?[0-9]+))?$")


@dataclass(frozen=True)
class SloTerm:
    metric: str
    limit_ms: float
    percentile: float = DEFAULT_PERCENTILE

    def __str__(self) -> str:
        return f"{self.metric}:{self.limit_ms:g}ms@p{self.percentile:g}"


def parse_slo(text: str | None) -> tuple[SloTerm, ...]:
    """``--slo`` as terms (see the module docstring); None or empty: no SLO."""
    if text is None or not text.strip():
        return ()
    terms: list[SloTerm] = []
    for part in text.replace(" ", "").split(","):
        m = _TERM.match(part)
        if m is None:
            raise BadInputError(
                "--slo", f"expected terms like ttft:200ms,tpot:30ms@p99,e2e:2s, got {part!r}"
            )
        metric, value, unit, pct = m.groups()
        limit = float(value) * (MS_PER_S if unit == "s" else 1.0)
        percentile = float(pct) if pct is not None else DEFAULT_PERCENTILE
        if not limit > 0 or not 0 < percentile <= 100:
            raise BadInputError("--slo", f"{part!r}: need a limit > 0 and 0 < p <= 100")
        if any(t.metric == metric for t in terms):
            raise BadInputError("--slo", f"{metric} is given twice")
        terms.append(SloTerm(metric, limit, percentile))
    return tuple(terms)


def resolve_objective(objective: str, terms: Sequence[SloTerm]) -> str:
    """``--objective`` as tune carries it: ``goodput`` becomes ``goodput:<slo>`` (the SLO
    travels with the objective into every estimate), which needs ``--slo``."""
    if objective != GOODPUT:
        return objective
    if not terms:
        raise BadInputError("--objective", "goodput counts requests within --slo: give --slo")
    return goodput_objective(",".join(f"{t.metric}:{t.limit_ms:g}ms" for t in terms))


def good_requests(records: Sequence[RequestRecord], terms: Sequence[SloTerm]) -> np.ndarray:
    """Per record, 1.0 when it succeeded and met every term's limit on its own, else 0.0.

    vLLM's goodput test (``vllm/benchmarks/serve.py`` ``calculate_metrics`` with
    ``goodput_config_dict``: a request is good when each of its TTFT, TPOT and E2E is at or
    below its ``--goodput`` limit, as :func:`~spectool.decide.latency.is_good`): per request, so a term's percentile (which binds a run, :func:`meets`) plays no part.
    """
    kwargs = {f"slo_{t.metric}_ms": t.limit_ms for t in terms}
    return np.array([float(is_good(r, **kwargs)) for r in records], dtype=float)


def goodput_terms(
    records: Sequence[RequestRecord], terms: Sequence[SloTerm]
) -> tuple[np.ndarray, np.ndarray]:
    """Per record, its share of the block's wall time (ms) and whether it was good.

    The ratio of their sums is the block's wall time per good request, the inverse of its
    goodput (good requests / wall time, as vLLM counts it), so a ratio below 1 between two
    arms pays, as for every other source. Half a good request is added per block (spread over
    its records): a block where none met the SLO has a finite, very long time per good request
    instead of none, and two such blocks compare as equal, not as undefined.
    """
    n = len(records)
    if n == 0:
        return np.zeros(0), np.zeros(0)
    span_s = max(r.end_time_s for r in records) - min(r.send_time_s for r in records)
    num = np.full(n, max(span_s, 0.0) * MS_PER_S / n)
    return num, good_requests(records, terms) + 0.5 / n


def _values_ms(records: Sequence[RequestRecord], metric: str) -> np.ndarray:
    ok = [r for r in records if r.ok]
    if metric == "ttft":
        vals = [r.ttft_s for r in ok if r.ttft_s is not None]
    elif metric == "tpot":
        vals = [r.tpot_s for r in ok if r.output_tokens >= 2 and r.tpot_s is not None]
    else:
        vals = [r.e2e_s for r in ok]
    return np.asarray(vals, dtype=float) * MS_PER_S


def observed_ms(records: Sequence[RequestRecord], term: SloTerm) -> float | None:
    """The term's percentile of its metric over ``records`` (ms); None with no sample."""
    values = _values_ms(records, term.metric)
    return float(np.percentile(values, term.percentile)) if values.size else None


def kept_up(records: Sequence[RequestRecord]) -> bool:
    """Whether the server finished the requests about as fast as they arrived: the span of their
    end times at most ``1 / KEEP_UP`` x the span of their send times. An over-saturated server
    queues without end; its completions trail further behind with every arrival and its
    latencies measure the block's length, not a steady state."""
    ok = [r for r in records if r.ok]
    if len(ok) < 2:
        return bool(ok)
    sends = max(r.send_time_s for r in ok) - min(r.send_time_s for r in ok)
    ends = max(r.end_time_s for r in ok) - min(r.end_time_s for r in ok)
    return ends * KEEP_UP <= sends or ends <= 0


def meets(
    records: Sequence[RequestRecord],
    terms: Sequence[SloTerm],
) -> tuple[bool, dict[str, float | None]]:
    """Whether a run met every term (module docstring), and each term's observed value."""
    seen = {str(t): observed_ms(records, t) for t in terms}
    ok = all(r.ok for r in records) and kept_up(records)
    good = all(v is not None and v <= t.limit_ms for t, v in zip(terms, seen.values(), strict=True))
    return ok and good, seen

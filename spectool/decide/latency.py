"""Client-side latency metrics of one benchmark run: per request, then aggregated.

Every metric is defined once, here, with its formula. Names and formulas follow vLLM's
``vllm bench serve`` (``vllm/benchmarks/serve.py: calculate_metrics``) where vLLM and AIPerf
agree; where they differ the choice is said. Times are seconds inside (``_s``); SLOs are given in
milliseconds because that is how users state them (``--goodput ttft:<ms>``).

Per request (a :class:`RequestRecord`):

* **TTFT** = ``first_token_time_s - send_time_s``. Time to the first chunk that carried a token
  (vLLM ``ttft``; AIPerf ``time_to_first_token``).
* **E2E** = ``end_time_s - send_time_s`` (vLLM ``e2el``, AIPerf ``request_latency``).
* **TPOT** = ``(E2E - TTFT) / (output_tokens - 1)``, only when ``output_tokens >= 2`` (vLLM
  ``tpot``; AIPerf calls the same quantity "ITL"). Under speculative decoding a streamed chunk
  can carry several accepted tokens, so TPOT comes from the token count, never from chunk gaps.
* **ITL** (per-token inter-token latency, spectool's definition): take the chunks that carried at
  least one token, at times ``t_0 < ... < t_m`` carrying ``n_0 ... n_m`` tokens. For every chunk
  ``i >= 1`` the gap ``g_i = t_i - t_(i-1)`` is divided across the tokens it carried: the chunk
  contributes ``n_i`` samples of ``g_i / n_i``. The distribution is therefore over tokens, and its
  per-request mean is ``(t_m - t_0) / (n_1 + ... + n_m)``: AIPerf's corrected ITL, which divides
  by the tokens after the first chunk. Chunks with zero tokens (role-only, usage-only) are
  skipped; their time folds into the next token-carrying chunk's gap.
* **Inter-chunk gap** = ``g_i`` itself, one sample per chunk (vLLM's "ITL" list, AIPerf's ICL).
  Reported for comparison with those tools; under speculation it grows while TPOT falls.
* **Output tokens/s per user** = ``1 / TPOT`` (AIPerf ``output_token_throughput_per_user``).
* **Queue wait**: server-reported time the request waited before being scheduled, when known.

Over a run (:func:`summarize`, successful requests only, as vLLM does):

* distributions: mean, std (population), min, max, p50/p90/p99 by ``numpy.percentile``
  (linear interpolation, numpy's default, as in vLLM);
* **output throughput** = ``sum(output_tokens) / duration_s``; **total token throughput** adds
  prompt tokens; **request throughput** = ``completed / duration_s``;
* **goodput** = ``good / duration_s`` where a request is good iff every given SLO holds with
  ``value <= slo`` (vLLM ``request_goodput``). As in vLLM a request with fewer than two output
  tokens has TPOT 0 for this test; a request without a first token fails a TTFT SLO.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from spectool.errors import BadInputError

MS_PER_S = 1000.0


@dataclass(frozen=True)
class RequestRecord:
    """One request as the load generator saw it. All times share one monotonic clock (seconds).

    ``chunk_times_s[i]`` is when streamed chunk ``i`` arrived and ``chunk_token_counts[i]`` how
    many output tokens it carried (0 for role-only or usage-only chunks). ``error`` is None for a
    successful request. ``queue_wait_s`` is the server's queueing time when it reports one.
    """

    request_id: str
    category: str
    send_time_s: float
    first_token_time_s: float | None
    chunk_times_s: tuple[float, ...]
    chunk_token_counts: tuple[int, ...]
    end_time_s: float
    prompt_tokens: int
    output_tokens: int
    error: str | None = None
    queue_wait_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunk_times_s", tuple(float(t) for t in self.chunk_times_s))
        object.__setattr__(
            self, "chunk_token_counts", tuple(int(n) for n in self.chunk_token_counts)
        )
        where = f"request {self.request_id!r}"
        if len(self.chunk_times_s) != len(self.chunk_token_counts):
            raise BadInputError(
                where,
                f"{len(self.chunk_times_s)} chunk times but {len(self.chunk_token_counts)} "
                "chunk token counts",
            )
        if any(n < 0 for n in self.chunk_token_counts):
            raise BadInputError(where, "a chunk token count is negative")
        if self.output_tokens < 0 or self.prompt_tokens < 0:
            raise BadInputError(where, "token counts must be >= 0")
        if self.end_time_s < self.send_time_s:
            raise BadInputError(where, "end_time_s is before send_time_s")
        times = self.chunk_times_s
        if any(b < a for a, b in pairwise(times)):
            raise BadInputError(where, "chunk times are not in arrival order")
        if times and (times[0] < self.send_time_s or times[-1] > self.end_time_s):
            raise BadInputError(where, "a chunk time lies outside [send_time_s, end_time_s]")
        first = self.first_token_time_s
        if first is not None and not self.send_time_s <= first <= self.end_time_s:
            raise BadInputError(where, "first_token_time_s lies outside [send_time_s, end_time_s]")
        if self.queue_wait_s is not None and self.queue_wait_s < 0:
            raise BadInputError(where, "queue_wait_s is negative")

    @property
    def ok(self) -> bool:
        """True when the request completed without error."""
        return self.error is None

    @property
    def ttft_s(self) -> float | None:
        """TTFT, None when no token arrived."""
        if self.first_token_time_s is None:
            return None
        return self.first_token_time_s - self.send_time_s

    @property
    def e2e_s(self) -> float:
        """End-to-end latency."""
        return self.end_time_s - self.send_time_s

    @property
    def decode_s(self) -> float | None:
        """``E2E - TTFT``: the time spent producing tokens after the first."""
        ttft = self.ttft_s
        return None if ttft is None else self.e2e_s - ttft

    @property
    def tpot_s(self) -> float | None:
        """TPOT, None with fewer than two output tokens or no first token."""
        decode = self.decode_s
        if decode is None or self.output_tokens < 2:
            return None
        return decode / (self.output_tokens - 1)

    @property
    def output_tokens_per_s_per_user(self) -> float | None:
        """``1 / TPOT``; None where TPOT is undefined or zero."""
        tpot = self.tpot_s
        return None if not tpot else 1.0 / tpot

    def _token_chunks(self) -> tuple[np.ndarray, np.ndarray]:
        times = np.asarray(self.chunk_times_s, dtype=float)
        counts = np.asarray(self.chunk_token_counts, dtype=np.int64)
        keep = counts > 0
        return times[keep], counts[keep]

    @property
    def inter_chunk_s(self) -> tuple[float, ...]:
        """Gaps between consecutive token-carrying chunks (vLLM's "ITL" list, AIPerf's ICL)."""
        times, _ = self._token_chunks()
        return tuple(np.diff(times).tolist())

    @property
    def itl_s(self) -> tuple[float, ...]:
        """Per-token ITL samples: each gap divided over, and repeated for, the tokens it carried."""
        times, counts = self._token_chunks()
        if len(times) < 2:
            return ()
        per_token = np.diff(times) / counts[1:]
        return tuple(np.repeat(per_token, counts[1:]).tolist())


@dataclass(frozen=True)
class Distribution:
    """Summary of a sample: count, mean, population std, min, max and p50/p90/p99 (same unit)."""

    count: int
    mean: float
    std: float
    min: float
    max: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution | None:
        """Summarize ``values``; None for an empty sample."""
        arr = np.asarray(list(values), dtype=float)
        if arr.size == 0:
            return None
        p50, p90, p99 = np.percentile(arr, [50.0, 90.0, 99.0])
        return cls(
            count=int(arr.size),
            mean=float(arr.mean()),
            std=float(arr.std()),
            min=float(arr.min()),
            max=float(arr.max()),
            p50=float(p50),
            p90=float(p90),
            p99=float(p99),
        )


@dataclass(frozen=True)
class LatencySummary:
    """Aggregate latency and throughput of a run (or of one category of its requests).

    Distributions are in seconds except ``output_tokens_per_s_per_user`` (tokens/s); any is None
    when no request defined it. Throughputs divide by the whole run's ``duration_s``, so a
    category's throughput is its share of the run. ``good_requests`` / ``goodput_requests_per_s``
    are None when no SLO was given.
    """

    requests: int
    completed: int
    errors: int
    duration_s: float
    ttft_s: Distribution | None
    tpot_s: Distribution | None
    itl_s: Distribution | None
    inter_chunk_s: Distribution | None
    e2e_s: Distribution | None
    queue_wait_s: Distribution | None
    output_tokens_per_s_per_user: Distribution | None
    total_prompt_tokens: int
    total_output_tokens: int
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    good_requests: int | None
    goodput_requests_per_s: float | None
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    slo_e2e_ms: float | None
    by_category: dict[str, LatencySummary] = field(default_factory=dict)


def is_good(
    record: RequestRecord,
    *,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    slo_e2e_ms: float | None = None,
) -> bool:
    """Whether a successful request meets every given SLO (vLLM's goodput test, ``<=`` holds)."""
    if not record.ok:
        return False
    if slo_ttft_ms is not None:
        ttft = record.ttft_s
        if ttft is None or ttft * MS_PER_S > slo_ttft_ms:
            return False
    if slo_tpot_ms is not None:
        tpot = record.tpot_s if record.output_tokens >= 2 else 0.0
        if tpot is None or tpot * MS_PER_S > slo_tpot_ms:
            return False
    return slo_e2e_ms is None or record.e2e_s * MS_PER_S <= slo_e2e_ms


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
    slo_e2e_ms: float | None = None,
) -> LatencySummary:
    """Aggregate ``records`` of a run lasting ``duration_s`` seconds, overall and per category."""
    categories = sorted({r.category for r in records})
    by_category = {
        cat: _summarize_one(
            [r for r in records if r.category == cat],
            duration_s,
            slo_ttft_ms,
            slo_tpot_ms,
            slo_e2e_ms,
        )
        for cat in categories
    }
    return _summarize_one(
        records, duration_s, slo_ttft_ms, slo_tpot_ms, slo_e2e_ms, by_category=by_category
    )


def _summarize_one(
    records: Sequence[RequestRecord],
    duration_s: float,
    slo_ttft_ms: float | None,
    slo_tpot_ms: float | None,
    slo_e2e_ms: float | None,
    by_category: dict[str, LatencySummary] | None = None,
) -> LatencySummary:
    if not duration_s > 0:
        raise BadInputError("summarize", f"duration_s must be > 0, got {duration_s}")
    for name, slo in (("ttft", slo_ttft_ms), ("tpot", slo_tpot_ms), ("e2e", slo_e2e_ms)):
        if slo is not None and not slo > 0:
            raise BadInputError("summarize", f"{name} SLO must be > 0 ms, got {slo}")
    done = [r for r in records if r.ok]
    itl: list[float] = []
    gaps: list[float] = []
    for r in done:
        itl.extend(r.itl_s)
        gaps.extend(r.inter_chunk_s)
    prompt = sum(r.prompt_tokens for r in done)
    output = sum(r.output_tokens for r in done)
    has_slo = any(s is not None for s in (slo_ttft_ms, slo_tpot_ms, slo_e2e_ms))
    good = (
        sum(
            is_good(r, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, slo_e2e_ms=slo_e2e_ms)
            for r in done
        )
        if has_slo
        else None
    )
    return LatencySummary(
        requests=len(records),
        completed=len(done),
        errors=len(records) - len(done),
        duration_s=float(duration_s),
        ttft_s=Distribution.of(t for r in done if (t := r.ttft_s) is not None),
        tpot_s=Distribution.of(t for r in done if (t := r.tpot_s) is not None),
        itl_s=Distribution.of(itl),
        inter_chunk_s=Distribution.of(gaps),
        e2e_s=Distribution.of(r.e2e_s for r in done),
        queue_wait_s=Distribution.of(q for r in done if (q := r.queue_wait_s) is not None),
        output_tokens_per_s_per_user=Distribution.of(
            v for r in done if (v := r.output_tokens_per_s_per_user) is not None
        ),
        total_prompt_tokens=prompt,
        total_output_tokens=output,
        requests_per_s=len(done) / duration_s,
        output_tokens_per_s=output / duration_s,
        total_tokens_per_s=(prompt + output) / duration_s,
        good_requests=good,
        goodput_requests_per_s=None if good is None else good / duration_s,
        slo_ttft_ms=slo_ttft_ms,
        slo_tpot_ms=slo_tpot_ms,
        slo_e2e_ms=slo_e2e_ms,
        by_category=by_category or {},
    )

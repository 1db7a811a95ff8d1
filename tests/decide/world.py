"""A synthetic serving world for the decision tests: known step costs, known acceptance.

Step time at batch ``b`` and draft length ``k`` follows the cost model's form with known
coefficients; every request-step accepts a chain prefix drawn with known per-position ``alpha``.
``measure(c, k)`` returns a :class:`CellMeasurement` as a real run would (iteration samples,
per-position counts and/or per-request records), seeded by ``(seed, c, k)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spectool.decide.acceptance import PositionCounts, expected_tokens_per_step
from spectool.decide.cell import CellMeasurement, IterationSample
from spectool.decide.latency import RequestRecord


@dataclass(frozen=True)
class World:
    fixed_ms: float = 15.0
    per_request_ms: float = 0.3
    spec_fixed_ms: float = 1.5
    per_draft_token_ms: float = 0.5
    per_draft_pass_ms: float = 1.0
    alphas: tuple[float, ...] = (0.8, 0.65, 0.5, 0.4, 0.3, 0.2)
    noise: float = 0.02
    steps: int = 300
    output_tokens: int = 48
    with_iterations: bool = True
    with_positions: bool = True
    with_records: bool = False
    seed: int = 0

    def step_ms(self, batch: float, k: int) -> float:
        on = 1.0 if k > 0 else 0.0
        return (
            self.fixed_ms
            + self.per_request_ms * batch
            + on
            * (
                self.spec_fixed_ms
                + self.per_draft_token_ms * batch * k
                + self.per_draft_pass_ms * k
            )
        )

    def true_ratio(self, c: int, k: int) -> float:
        return self.step_ms(c, k) / (expected_tokens_per_step(self.alphas, k) * self.step_ms(c, 0))

    def true_best(self, c: int, max_k: int) -> int:
        ratios = [self.true_ratio(c, k) for k in range(max_k + 1)]
        best = int(np.argmin(ratios))
        return best if ratios[best] < 1.0 else 0

    def _leading(self, rng: np.random.Generator, n: int, k: int) -> np.ndarray:
        """Accepted draft tokens of ``n`` request-steps at draft length ``k``."""
        if k == 0:
            return np.zeros(n, dtype=np.int64)
        ok = rng.random((n, k)) < np.asarray(self.alphas[:k])
        return np.cumprod(ok, axis=1).sum(axis=1)

    def measure(self, c: int, k: int) -> CellMeasurement:
        rng = np.random.default_rng([self.seed, c, k])
        mean_step = self.step_ms(c, k)
        iterations: list[IterationSample] = []
        leading_all: list[np.ndarray] = []
        if self.with_iterations:
            for _ in range(self.steps):
                lead = self._leading(rng, c, k)
                leading_all.append(lead)
                step = mean_step * (1.0 + self.noise * rng.standard_normal())
                iterations.append(
                    IterationSample(
                        draft_ms=0.0,
                        verify_ms=max(step, 0.0),
                        coord_ms=0.0,
                        batch_size=c,
                        confirmed_tokens=int(c + lead.sum()),
                    )
                )
        records: list[RequestRecord] = []
        if self.with_records:
            n_req = max(16, 2 * c)
            out = self.output_tokens
            for r in range(n_req):
                lead = self._leading(rng, out, k)  # at most `out` steps are ever needed
                tokens = np.minimum(np.cumsum(1 + lead), out - 1)
                n_steps = int(np.searchsorted(tokens, out - 1) + 1)
                leading_all.append(lead[:n_steps])
                per_chunk = np.diff(np.concatenate([[0], tokens[:n_steps]]))
                gaps = mean_step * (1.0 + self.noise * rng.standard_normal(n_steps)) / 1000.0
                send = float(r)
                first = send + 0.05
                times = first + np.cumsum(np.maximum(gaps, 0.0))
                records.append(
                    RequestRecord(
                        request_id=f"{c}-{k}-{r}",
                        category="code" if r % 2 else "chat",
                        send_time_s=send,
                        first_token_time_s=first,
                        chunk_times_s=(first, *times.tolist()),
                        chunk_token_counts=(1, *per_chunk.tolist()),
                        end_time_s=float(times[-1]),
                        prompt_tokens=100,
                        output_tokens=out,
                    )
                )
        positions = None
        if self.with_positions and k > 0:
            lead = np.concatenate(leading_all)
            reached = tuple(int((lead >= i).sum()) for i in range(k))
            accepted = tuple(int((lead >= i + 1).sum()) for i in range(k))
            positions = PositionCounts(accepted, reached)
        return CellMeasurement(
            concurrency=c,
            k=k,
            records=tuple(records),
            iterations=tuple(iterations),
            positions=positions,
            duration_s=60.0,
        )

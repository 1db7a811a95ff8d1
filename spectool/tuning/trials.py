"""The trials behind one (concurrency, k) cell: their configs, and their results pooled into a cell.

A cell is measured as ``repeats`` closed-loop trials (:class:`~spectool.measure.runner.
TrialConfig`) against a server running draft length ``k`` (0 = speculation off). Per trial:

* measured requests: ``max(num_prompts, 2 * concurrency)``, so every concurrency runs at
  least two full waves of requests;
* warmup: ``concurrency`` requests first (one full batch, not recorded), so lazy allocations and
  the first batch's caches are out of the way;
* every request asks for exactly ``max_tokens`` tokens (``ignore_eos``), at temperature 0.

The trial's label names the engine, method, ``k``, the repeat and the server-setup fingerprint
(:func:`spectool.tuning.setup.setup_fingerprint`): a resumed run reuses a saved trial only when
all of them, and everything else in the config, are equal.

Pooling (:func:`pooled_cell`): the repeats' successful requests, decode-step samples and
per-position acceptance counts are concatenated into one
:class:`~spectool.decide.cell.CellMeasurement`; its duration is the sum of the trials' wall times.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from spectool.decide.cell import CellMeasurement, pooled
from spectool.errors import BadInputError
from spectool.measure.client import RequestOptions
from spectool.measure.runner import TrialConfig, TrialResult

# A paired block: at least two waves of the concurrency's requests, no warmup (the server is
# warm and only switched its draft length). At concurrency 1 two requests: short blocks keep
# the two arms of a pair within a second or so of each other on a small machine. Above 1 the
# whole workload, in whole waves (block_requests): a block's requests run together, arriving
# prefills stall the others' decoding, and a block of two waves is mostly its ramp and drain,
# not the closed loop's steady state. Measured 2026-12-05 (draft_model k=2 against the
# baseline at concurrency 4, 16 interleaved rounds per workload): two-wave blocks over
# whole-workload ones 0.928 (prose) and 0.933 (code), 0.986 and 1.039 (built-in); the
# whole-workload blocks went the brute-force sweep's way on all three, and per unit of time
# both lengths measure alike (log sd per block 0.108 against 0.051 at four times the length).
BLOCK_WAVES = 2


def block_requests(workload_prompts: int, concurrency: int) -> int:
    """Requests of one paired block: :data:`BLOCK_WAVES` at concurrency 1; above it the whole
    workload rounded up to whole waves, at least :data:`BLOCK_WAVES` of them."""
    if concurrency == 1:
        return BLOCK_WAVES
    waves = max(BLOCK_WAVES, -(-workload_prompts // concurrency))
    return waves * concurrency


def pass_pairs(workload_prompts: int, concurrency: int) -> int:
    """Paired blocks (:func:`block_requests`) that send every prompt."""
    return -(-workload_prompts // block_requests(workload_prompts, concurrency))


def pass_order(workload_prompts: int, concurrency: int, passes: int, seed: int) -> list[int]:
    """``passes`` shuffled passes over the workload's prompts, one after the other.

    Pass ``p`` is ``numpy.random.default_rng([seed, concurrency, p]).permutation(n)``: every
    prompt once per pass, in an order that no block boundary ties to the file's order, so the
    first blocks of a cell are a random sample of the workload, never its first prompts. The
    order does not depend on the method or ``k``: every method's cell at a concurrency sees
    the same prompts in the same blocks.
    """
    import numpy as np

    order: list[int] = []
    for p in range(passes):
        rng = np.random.default_rng([seed, concurrency, p])
        order.extend(int(i) for i in rng.permutation(workload_prompts))
    return order


@dataclass(frozen=True)
class CellPlan:
    """How every cell of one tune run is measured (see the module docstring)."""

    engine: str
    method: str
    fingerprint: str
    workload_id: str
    num_prompts: int
    max_tokens: int
    repeats: int = 1
    request: RequestOptions = field(default_factory=RequestOptions)
    workload_prompts: int = 0  # distinct prompts a paired cell covers (0: num_prompts)
    seed: int = 0  # the shuffles of the passes over the workload

    def __post_init__(self) -> None:
        if self.workload_prompts < 0:
            raise BadInputError("tune", "the workload has a negative number of prompts")
        if self.num_prompts < 1 or self.max_tokens < 2 or self.repeats < 1:
            raise BadInputError(
                "tune",
                "need --num-prompts >= 1, --max-tokens >= 2 (one token has no decode step) and "
                "--repeats >= 1",
            )

    def requests_at(self, concurrency: int) -> int:
        """Measured requests of one trial at ``concurrency``."""
        return max(self.num_prompts, 2 * concurrency)

    def label(self, k: int, repeat: int | str) -> str:
        """The trial label: engine, method (``none`` for the baseline), k, repeat, setup."""
        method = "none" if k == 0 else self.method
        return f"{self.engine} {method} k={k} #{repeat} setup={self.fingerprint}"

    def block_config(self, concurrency: int, k: int, pair: int, arm: int) -> TrialConfig:
        """Block ``arm`` (``k`` or 0) of pair ``pair`` of the paired cell ``(concurrency, k)``.

        A block is one closed-loop trial of :meth:`block_requests` requests, no warmup
        (two at concurrency 1, the whole workload in whole waves above; both arms of a pair
        send the same prompts). The pairs walk
        through shuffled passes over the whole workload (:func:`pass_order`), so any first
        pairs are a random sample of it and :meth:`pass_pairs` pairs are all of it.

        At concurrency 1 every pass is the same shuffle cut into the same blocks (pair ``i``
        sends block ``i % pass_pairs``; the shuffle continued from its start where a block
        does not divide the workload): a block's requests run one at a time, so its ratio is
        its prompts', and pairs that send the same block are a stratum whose differences are
        the machine's (:func:`spectool.decide.pair_stats.stratified_ratio`). Above 1 each
        pass is shuffled anew and pair ``i`` sends items ``i * n .. (i + 1) * n - 1`` of the
        passes laid end to end: a block's requests run together, and which prompts share a
        block, and when each arrives, moves its ratio as much as its prompts do (in six main
        job runs at concurrency 4, pair 5 read 0.93-1.91 and pair 7 1.02-1.52, the same
        blocks each run, against 0.83-1.09 for pairs 1-4 in five); a grouping fixed once would
        freeze that into the estimate, and fresh ones make it part of the pairs' spread.
        Labels name the cell, the pair and the arm (``#p2`` for the speculative block of pair
        2, ``#p2/k4`` for the baseline block beside it), so a resumed run finds every block it
        already measured.
        """
        repeat = f"p{pair}" if arm == k else f"p{pair}/k{k}"
        n = self.block_requests(concurrency)
        w = self.prompts_in_workload
        if concurrency == 1:
            shuffle = pass_order(w, concurrency, 1, self.seed)
            start = (pair % self.pass_pairs(concurrency)) * n
            order = [shuffle[j % w] for j in range(start, start + n)]
        else:
            start, end = pair * n, (pair + 1) * n
            order = pass_order(w, concurrency, -(-end // w), self.seed)[start:end]
        return TrialConfig(
            label=self.label(arm, repeat),
            concurrency=concurrency,
            num_prompts=n,
            max_tokens=self.max_tokens,
            warmup_requests=0,
            workload_id=self.workload_id,
            request=self.request,
            prompt_indices=tuple(order),
        )

    @property
    def prompts_in_workload(self) -> int:
        """The distinct prompts a paired cell covers."""
        return self.workload_prompts or self.num_prompts

    def pass_pairs(self, concurrency: int) -> int:
        """Pairs that cover every prompt of the workload once at ``concurrency``."""
        return pass_pairs(self.prompts_in_workload, concurrency)

    def pass_options(self, concurrency: int) -> dict[str, int]:
        """:func:`~spectool.tuning.pairing.measure_paired`'s workload arguments."""
        return {
            "pass_pairs": self.pass_pairs(concurrency),
            "workload_prompts": self.prompts_in_workload,
        }

    def block_requests(self, concurrency: int) -> int:
        """Measured requests of one block (:func:`block_requests`)."""
        return block_requests(self.prompts_in_workload, concurrency)

    def after_config(self, concurrency: int) -> TrialConfig:
        """The baseline at ``concurrency`` measured again after every speculative cell (label
        ``#after``): the closing bracket of the bracketed design."""
        first = self.configs(concurrency, 0)[0]
        return dataclasses.replace(first, label=self.label(0, "after"))

    def configs(self, concurrency: int, k: int) -> list[TrialConfig]:
        """The ``repeats`` trials of cell ``(concurrency, k)``, in order."""
        return [
            TrialConfig(
                label=self.label(k, r),
                concurrency=concurrency,
                num_prompts=self.requests_at(concurrency),
                max_tokens=self.max_tokens,
                warmup_requests=concurrency,
                workload_id=self.workload_id,
                request=self.request,
            )
            for r in range(self.repeats)
        ]


def pooled_cell(
    results: Sequence[TrialResult], k: int, level: int | None = None
) -> CellMeasurement:
    """The cell measured by ``results`` (the repeats of one concurrency at draft length ``k``;
    open-loop trials need the ``level`` they stand for, :func:`~spectool.measure.server_stats.
    to_cell`)."""
    from spectool.measure.server_stats import to_cell

    if not results:
        raise BadInputError("tune", f"no trials to pool for k={k}")
    cells = [to_cell(r, k, level=level) for r in results]
    if any(c.concurrency != cells[0].concurrency for c in cells):
        raise BadInputError("tune", "trials of one cell ran at different concurrencies")
    return pooled(cells)

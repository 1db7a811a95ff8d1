"""Concurrent pairs: a speculative and a baseline block measured at the same moment on two GPU sets.

Where a new draft length is a server restart (trtllm-serve, minutes), one server cannot
alternate its arms, and a single GPU set falls back to the *bracketed* design (the baseline
measured before and after the speculative cells, :mod:`spectool.decide.paired`). With two GPU
sets or more (``tune --gpus``, :mod:`spectool.tuning.gpu_sets`) the baseline server stays up on
set 0 and each speculative server runs on another set, and pair ``i`` of a cell is its
speculative block and its baseline block *started together*: both clients are released in the
same event-loop tick, send the same prompts (:meth:`~spectool.tuning.trials.CellPlan.
block_config`) and measure under the same minute of the machine. Design ``concurrent``.

Is a simultaneous pair a fair one? What a pair must cancel is whatever changes the speed of
the machine over time (clocks, throttling, other tenants of the node or the fabric, the power
cap): measured at once, both arms see it alike, which no design that measures one arm after the
other can promise. What it adds is the two servers' effect on each other through what the sets
share: host CPU (schedulers, detokenisation, the one client process that drives both), host
memory bandwidth, PCIe switches, and the node's power budget. That effect is symmetric only
when the sets are identical: same GPU model and the same place in the node's topology, and
each server with its own CPUs (``srun --exact --cpus-per-task``); tune refuses sets of unlike
GPUs where ``nvidia-smi`` can tell. It is also the condition a deployment runs in (replicas
side by side on a node). One asymmetry is left: the arms end a block at different times, and
the slower arm's tail then runs with its neighbour idle. That favours the slower arm, whichever
it is, so it pulls the ratio towards 1: it can turn a narrow win or loss inconclusive, never a
loss into a win. The client process is shared too, which matters for client-side objectives
(``tpot``, ``e2e``) only if it saturates its core; ``steps`` reads each engine's own iteration
times. Where those conditions cannot hold (one GPU, unlike GPUs, a host too small for two
servers and the client) ``--gpus 1`` keeps the bracketed design.

Wall time: :func:`ledger` counts, from the servers of this run, how long tune waited for servers
to load and how long one server per configuration, restarted in the order the cells asked for
them (plus the bracketed design's second baseline), would have taken, each start valued at the
load time measured here for that draft length.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

from spectool.measure.runner import Progress, TrialConfig, TrialResult, run_trials
from spectool.tuning.driver import ServerInfo

Job = tuple[ServerInfo, Sequence[TrialConfig]]


def measure_at_once(
    jobs: Sequence[Job],
    prompts: Sequence[Any],
    *,
    results_path: Path,
    progress: Progress | None,
    count_tokens: Callable[[str], int] | None,
    metrics_interval_s: float,
    finished: Mapping[str, TrialResult],
) -> list[list[TrialResult]]:
    """Each job's trials on its own server, every job at the same time (one event loop)."""
    from spectool.measure.client import StreamingClient

    async def one(info: ServerInfo, configs: Sequence[TrialConfig]) -> list[TrialResult]:
        async with StreamingClient(info.base_url, info.model_name, count_tokens=count_tokens) as c:
            return await run_trials(
                c,
                prompts,
                configs,
                results_path=results_path,
                progress=progress,
                metrics_interval_s=metrics_interval_s,
                metrics_path=info.metrics_path,
                finished=finished,
            )

    async def main() -> list[list[TrialResult]]:
        return list(await asyncio.gather(*(one(info, configs) for info, configs in jobs)))

    return asyncio.run(main())


def pair_blocks(
    measure_pair: Callable[[TrialConfig, TrialConfig], tuple[TrialResult, TrialResult]],
    block_config: Callable[[int, int], TrialConfig],
    saved: Mapping[str, TrialResult],
    k: int,
) -> Callable[[int, int], TrialResult]:
    """:func:`~spectool.tuning.pairing.measure_paired`'s ``block(pair, arm)`` for a concurrent
    cell: asked for either arm of a pair, it measures both at once (or finds both in
    ``trials.jsonl``), and hands out the other arm when asked next."""
    held: dict[tuple[int, int], TrialResult] = {}

    def block(pair: int, arm: int) -> TrialResult:
        if (pair, arm) in held:
            return held.pop((pair, arm))
        spec_config, base_config = block_config(pair, k), block_config(pair, 0)
        spec, base = saved.get(spec_config.key()), saved.get(base_config.key())
        if spec is None or base is None:  # a pair is measured whole, never one arm alone
            spec, base = measure_pair(spec_config, base_config)
        held[(pair, 0 if arm == k else k)] = base if arm == k else spec
        return spec if arm == k else base

    return block


def sequential_starts(demand: Sequence[int], bracket: bool) -> list[int]:
    """The servers one GPU set would start for cells asking for ``demand`` in order: a start
    whenever the draft length changes, and the baseline once more at the end (``bracket``)."""
    order = [*demand, 0] if bracket else list(demand)
    return [k for i, k in enumerate(order) if i == 0 or order[i - 1] != k]


def ledger(
    servers: Sequence[Any], demand: Sequence[int], wait_s: float, *, concurrent: bool
) -> dict[str, object]:
    """Server starts and the wall time saved against one server per configuration (module
    docstring); ``servers``: the driver's started servers (``k``, ``ready_s``, ``to_json``)."""
    loads: dict[int, list[float]] = {}
    for s in servers:
        if s.ready_s is not None:
            loads.setdefault(s.k, []).append(s.ready_s)
    spec_cells = any(k > 0 for k in demand)
    counterfactual = sequential_starts(demand, bracket=concurrent and spec_cells)
    known = [k for k in counterfactual if k in loads]
    sequential_s = sum(fmean(loads[k]) for k in known)
    return {
        "server_starts": sum(1 for s in servers if s.ready_s is not None),
        "servers": [s.to_json() for s in servers],
        "load_s_total": round(sum(sum(v) for v in loads.values()), 3),
        "waited_for_servers_s": round(wait_s, 3),
        "sequential_starts": len(counterfactual),
        "sequential_start_s": round(sequential_s, 3),
        "saved_s": round(max(0.0, sequential_s - wait_s), 3) if concurrent else 0.0,
    }


def servers_lines(servers: dict[str, Any] | None) -> list[str]:
    """TensorRT-LLM: which design ran on which GPU sets, and the wall time it saved."""
    if servers is None:
        return []
    sets = servers["sets"]
    count = sets if isinstance(sets, int) else len(sets)
    where = f"{servers['gpus']} GPUs in {count} set(s) of {servers['gpus_per_server']}"
    line = (
        f"- Servers: **{servers['design']}** design, {where} ({servers['launcher']} launcher); "
        f"{servers['server_starts']} starts, {servers['load_s_total']:.1f} s of loading, "
        f"{servers['waited_for_servers_s']:.1f} s waited for."
    )
    if servers["design"] == "concurrent":
        line += (
            f" One server at a time would have started {servers['sequential_starts']} servers "
            f"one after another ({servers['sequential_start_s']:.1f} s at the load times "
            f"measured here): **{servers['saved_s']:.1f} s saved**."
        )
    return [line]

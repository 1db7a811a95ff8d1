"""The few calls the CLI needs: build a :class:`Setup`, predict, say it in words or JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spectool.errors import BadInputError
from spectool.predict.acceptance import Acceptance
from spectool.predict.cost import ENGINE_DEFAULTS, EngineFactors, Hardware
from spectool.predict.geometry import (
    Geometry,
    geometry_from_checkpoint,
    mtp_geometry_from_checkpoint,
)
from spectool.predict.interval import (
    DOES_NOT_PAY,
    HIGH_FACTOR,
    LEVEL,
    LOW_FACTOR,
    UNCERTAIN,
    interval,
)
from spectool.predict.model import Prediction, Setup

if TYPE_CHECKING:
    from spectool.ckpt.inspect import Checkpoint
    from spectool.parallel import ParallelLayout
    from spectool.profiles import GpuSpec


def setup_for(
    target: Geometry | Checkpoint,
    method: str,
    gpu: GpuSpec | Hardware,
    *,
    drafter: Geometry | Checkpoint | None = None,
    engine: str | EngineFactors = "trtllm",
    tp: int = 1,
    context: int = 1024,
    mtp_layer: Geometry | None = None,
    layout: ParallelLayout | None = None,
) -> Setup:
    """A :class:`Setup` from checkpoints (headers only) or geometries, a GPU profile and an
    engine name (``trtllm``, ``vllm``, ``sglang``, ``torch-cpu``) or fitted factors.

    ``mtp``: the draft step is one forward of ``mtp_layer``; from a target checkpoint it is
    read from its headers (:func:`mtp_geometry_from_checkpoint`), else the target's geometry
    cut to one layer stands in. ``layout``: a parallel layout (its ``tp`` replaces ``tp``);
    None = ``tp`` GPUs of one node."""
    if isinstance(engine, str):
        if engine not in ENGINE_DEFAULTS:
            raise BadInputError(
                "prediction", f"engine {engine!r} not in {', '.join(ENGINE_DEFAULTS)}"
            )
        factors = ENGINE_DEFAULTS[engine]
    else:
        factors = engine
    hardware = gpu if isinstance(gpu, Hardware) else Hardware.from_gpu(gpu)

    def geom(g: Geometry | Checkpoint | None) -> Geometry | None:
        return g if g is None or isinstance(g, Geometry) else geometry_from_checkpoint(g)

    target_geom = geom(target)
    assert target_geom is not None
    if mtp_layer is None and method == "mtp" and not isinstance(target, Geometry):
        mtp_layer = mtp_geometry_from_checkpoint(target, target=target_geom)
    return Setup(
        target=target_geom,
        method=method,
        hardware=hardware,
        factors=factors,
        drafter=geom(drafter),
        tp=layout.tp if layout is not None else tp,
        context=context,
        mtp_layer=mtp_layer,
        layout=layout,
    )


def describe(prediction: Prediction) -> list[str]:
    """The prediction in sentences, one per concurrency, then the break-even concurrency; with
    a parallel layout, the predicted steps per concurrency (:func:`step_lines`)."""
    lines = []
    for row in prediction.rows:
        easiest = row.min_break_even
        best = row.best
        if best is not None and best.speedup is not None and best.tokens_per_step is not None:
            band = interval(best.speedup)
            words = {UNCERTAIN: "is uncertain", DOES_NOT_PAY: "does not pay"}
            verdict = words.get(band.verdict, band.verdict)
            lines.append(
                f"c={row.concurrency}: speculation {verdict}: best k={best.k}, predicted "
                f"{band} at {best.tokens_per_step:.2f} tokens per step "
                f"(break-even {best.break_even_length:.2f}; {LEVEL:.0%} interval)"
            )
        elif easiest.break_even_length > easiest.k + 1:
            lines.append(f"c={row.concurrency}: speculation cannot pay at any k tried")
        else:
            lines.append(
                f"c={row.concurrency}: speculation pays if at least "
                f"{easiest.break_even_length:.2f} tokens per step are accepted "
                f"(k={easiest.k})"
            )
    if prediction.acceptance is not None:
        be = prediction.break_even_concurrency
        lines.append(  # point estimates: each concurrency's interval is on its own line
            "predicted faster than no speculation at every concurrency tried up to 4096 "
            "(point estimates)"
            if be is None
            else f"no draft length is predicted to pay from concurrency {be} on (point estimates)"
        )
    if prediction.setup.layout is not None:
        lines += step_lines(prediction)
    return lines


def step_lines(prediction: Prediction) -> list[str]:
    """Per concurrency, the predicted plain and speculative step (the best k, else the k that
    needs the least acceptance): what a parallel layout's collectives and pipeline add up to."""
    lines = []
    for row in prediction.rows:
        p = row.best or row.min_break_even
        lines.append(
            f"c={row.concurrency} step (predicted): plain {row.base_step_s * 1e3:.2f} ms, "
            f"speculative {p.spec_step_s * 1e3:.2f} ms at k={p.k}"
        )
    return lines


def as_dict(prediction: Prediction) -> dict[str, Any]:
    """JSON-ready form (``--json``): inputs' sources, per-concurrency rows, break-even."""
    setup = prediction.setup
    acc: Acceptance | None = prediction.acceptance
    return {
        "predicted": True,
        "interval": {"level": LEVEL, "low_factor": LOW_FACTOR, "high_factor": HIGH_FACTOR},
        "method": setup.method,
        "hardware": setup.hardware.name,
        "factors": setup.factors.source,
        "tp": setup.tp,
        "layout": None if setup.layout is None else layout_json(setup.layout),
        "context": setup.context,
        "acceptance": None
        if acc is None
        else {"source": acc.source, "alphas": list(acc.alphas), "max_k": acc.max_k},
        "break_even_concurrency": prediction.break_even_concurrency,
        "concurrency": [
            {
                "concurrency": row.concurrency,
                "base_step_ms": row.base_step_s * 1e3,
                "best_k": row.best.k if row.best else None,
                "verdict": _verdict(row.best.speedup if row.best else None),
                "ks": [
                    {
                        "k": p.k,
                        "spec_step_ms": p.spec_step_s * 1e3,
                        "tokens_per_step": p.tokens_per_step,
                        "break_even_tokens_per_step": p.break_even_length,
                        "speedup": p.speedup,
                        "speedup_interval": _band(p.speedup),
                    }
                    for p in row.ks
                ],
            }
            for row in prediction.rows
        ],
    }


def layout_json(layout: ParallelLayout) -> dict[str, Any]:
    """The layout as ``as_dict`` reports it, with the links its collectives use."""
    from spectool.predict import parallel_cost as pc

    return {
        "tp": layout.tp,
        "pp": layout.pp,
        "ep": layout.ep,
        "attention_dp": layout.attention_dp,
        "nodes": layout.nodes,
        "gpus_per_node": layout.gpus_per_node,
        "tp_link": "inter-node" if pc.tp_spans_nodes(layout) else "NVLink",
        "pp_link": [
            "inter-node" if pc.boundary_spans_nodes(layout, s) else "NVLink"
            for s in range(layout.pp - 1)
        ],
    }


def _band(speedup: float | None) -> list[float] | None:
    """``[low, high]`` of the 80 % interval, None without a speed-up."""
    if speedup is None:
        return None
    band = interval(speedup)
    return [band.low, band.high]


def _verdict(speedup: float | None) -> str | None:
    """``pays`` / ``does_not_pay`` / ``uncertain`` by the interval; None without acceptance."""
    return None if speedup is None else interval(speedup).verdict

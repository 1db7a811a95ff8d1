"""Predict speculative speed-up before renting a GPU: a step-cost model, torch-free.

The model (details in :mod:`spectool.predict.cost` and :mod:`spectool.predict.model`): one
forward of a model at batch ``b`` with ``t`` tokens per sequence costs a roofline of bytes moved
(weights per GPU, KV read at the context, distinct MoE experts touched) against FLOPs, at the
device's bandwidth and FLOP/s times achieved fractions, plus per-forward, per-layer and
per-sequence overheads and, with TP, two all-reduces per layer; a parallel layout (PP, attention
DP, nodes) adds its collectives and the pipeline (:mod:`spectool.predict.parallel_cost`). A
speculative step is the method's drafting + a verify forward of ``k + 1`` tokens + coordination;
per-user speed-up at concurrency ``c`` is ``t_base(c) / (t_spec(c, k) / AL(k))``.

API for the CLI (each integration is a few lines)::

    from spectool.predict import Acceptance, describe, as_dict, predict, setup_for

    # check --gpu: "will it pay" from checkpoint headers and a GPU profile
    setup = setup_for(target_ckpt, "eagle3", load_gpu("h100-sxm"), drafter=drafter_ckpt,
                      engine="trtllm", tp=1, context=1024)
    pred = predict(setup, None, concurrencies=(1, 8, 64))   # no acceptance: break-even only
    for line in describe(pred): print(line)                  # "c=8: speculation pays if at
                                                             #  least 2.31 tokens per step..."
    # tune --predict-only / serve's "predicted, not measured" gate: with acceptance
    acc = acceptance_from_tune(Path("run/tune.json"), concurrency=8)  # best: measured
    acc = Acceptance.from_counts(position_counts)            # decide.acceptance.PositionCounts
    acc = Acceptance.from_length(2.8, k=3, source="--acceptance-length")
    acc = Acceptance.from_rate(0.7, source="published: <url>")
    pred = predict(setup, acc, concurrencies=(1, 8, 64), ks=range(1, 9))
    pred.at(8).best.k, pred.at(8).best.speedup, pred.break_even_concurrency
    band = interval(pred.at(8).best.speedup)                 # 80 % interval, out of sample:
    band.low, band.high, band.verdict                        # "pays" / "uncertain" / ...
    json_obj = as_dict(pred)                                 # {"predicted": true, ...}

    # geometry without checkpoints (a profile's geometry block, for offline use)
    geom = geometry_from_mapping(profile_geometry_block, name, where="profiles/x.yaml")

    # calibration: engine defaults (ENGINE_DEFAULTS: fitted by component to published results,
    # spectool.predict.loso), refit from tune cells on this machine,
    # or the CPU probe for the embedded engine (imports torch, lazily)
    fit = fit_step_points(geom, hardware, ENGINE_DEFAULTS["trtllm"],
                          step_points_from_tune(Path("run/tune.json")),  # (b, t, ms) points
                          context=1024)                       # fit.factors, fit.describe()
    from spectool.predict.probe import probe_cpu              # ~2-5 s
    probe = probe_cpu(geom, intermediate_size=..., num_kv_heads=..., vocab_size=...)
    setup_for(geom, "draft_model", probe.hardware, drafter=..., engine=probe.factors)

Errors are :class:`~spectool.errors.BadInputError` (one line, exit code 2). Nothing here imports
torch or numpy; ``probe`` imports torch when called.
"""

from spectool.predict.acceptance import Acceptance
from spectool.predict.api import as_dict, describe, setup_for
from spectool.predict.calibrate import FitResult, fit_factors, fit_step_points
from spectool.predict.cost import (
    ENGINE_DEFAULTS,
    ENGINES,
    EngineFactors,
    Hardware,
    StepCost,
    forward_cost,
)
from spectool.predict.geometry import (
    Geometry,
    GeometrySpec,
    geometry_from_checkpoint,
    geometry_from_mapping,
    mtp_geometry_from_checkpoint,
)
from spectool.predict.interval import Interval, interval
from spectool.predict.model import (
    ConcurrencyPrediction,
    KPrediction,
    Prediction,
    Setup,
    break_even_concurrency,
    break_even_length,
    predict,
    speedup,
)
from spectool.predict.tune_input import acceptance_from_tune, step_points_from_tune

__all__ = [
    "ENGINES",
    "ENGINE_DEFAULTS",
    "Acceptance",
    "ConcurrencyPrediction",
    "EngineFactors",
    "FitResult",
    "Geometry",
    "GeometrySpec",
    "Hardware",
    "Interval",
    "KPrediction",
    "Prediction",
    "Setup",
    "acceptance_from_tune",
    "step_points_from_tune",
    "StepCost",
    "as_dict",
    "break_even_concurrency",
    "break_even_length",
    "describe",
    "fit_factors",
    "fit_step_points",
    "forward_cost",
    "geometry_from_checkpoint",
    "geometry_from_mapping",
    "interval",
    "mtp_geometry_from_checkpoint",
    "predict",
    "setup_for",
    "speedup",
]

"""The roofline prior of a TensorRT-LLM tune: step times from first principles
(:mod:`spectool.predict`) for the pair on the GPU ``check`` resolved, so the search measures no
``k = 1`` cost cell (:func:`spectool.decide.tune.tune`, ``prior_step``). Every server start of
trtllm-serve costs minutes; the embedded engine switches k in place and needs no prior."""

from __future__ import annotations

from collections.abc import Callable

from spectool.errors import SpectoolError
from spectool.tuning.request import ResolvedTune

PriorStep = Callable[[float, int], float]


def trtllm_prior(resolved: ResolvedTune, *, context: int) -> tuple[PriorStep | None, str]:
    """``(prior_step, what it rests on)``, or ``(None, why not)`` when the GPU or the models'
    geometry is unknown (the search then measures its ``k = 1`` cell as without a prior)."""
    from spectool.predict import setup_for
    from spectool.profiles import load_gpu

    report = resolved.report
    if report.gpu is None:
        return None, "no prior: the GPU is unknown (pass --gpu)"
    try:
        setup = setup_for(
            report.target,
            report.method,
            load_gpu(str(report.gpu["name"])),
            drafter=report.drafter,
            engine="trtllm",
            tp=resolved.request.tp,
            context=context,
        )
    except SpectoolError as exc:
        return None, f"no prior: {exc}"

    def step(batch: float, k: int) -> float:
        b = max(1, round(batch))
        return setup.base_step(b) if k == 0 else setup.spec_step(b, k, tokens=1.0, p_all=0.0)

    return step, f"roofline prior: {report.method} on {report.gpu['name']}, trtllm defaults"

"""The parts of ``spectool check`` that the header path (:mod:`spectool.check`) and the
offline path (:mod:`spectool.check_offline`) share: the TensorRT-LLM release's rules
(:func:`trtllm_rules`), the "will it pay" prediction (:func:`will_it_pay`) and the GPU
(:func:`resolve_gpu`).
"""

from __future__ import annotations

from typing import Any

from spectool.check_request import DEFAULT_TRTLLM_RELEASE, CheckRequest
from spectool.ckpt.inspect import Checkpoint
from spectool.findings import Finding, error


def will_it_pay(
    req: CheckRequest,
    method: str,
    max_draft_len: int,
    target: Checkpoint | None,
    drafter: Checkpoint | None,
    recipe: Any,
    profile: str | None,
    gpu_spec: Any,
) -> dict[str, Any]:
    """The "will it pay" section: predicted speed-up per concurrency (with acceptance) or the
    break-even acceptance (without), on TensorRT-LLM's engine defaults for ``gpu_spec``."""
    from spectool import predicted
    from spectool.predict import Hardware, describe, predict, setup_for
    from spectool.predict.model import METHODS as PREDICTED_METHODS
    from spectool.predict.parallel_cost import PP_REFUSED_METHODS

    concurrency = req.concurrency or predicted.DEFAULT_CONCURRENCY
    if req.engine == "torch":
        return {
            "predicted": True,
            "skipped": "the embedded engine's calibration is a CPU probe: "
            "spectool tune --predict-only --engine torch",
        }
    if method not in PREDICTED_METHODS:
        return {"predicted": True, "skipped": f"no step-cost model for method {method}"}
    layout = None if req.plain_tp else req.layout()  # None: tp GPUs of one node, as before
    if layout is not None and layout.pp > 1 and method in PP_REFUSED_METHODS:
        return {
            "predicted": True,
            "skipped": f"TensorRT-LLM's PP executor loop runs no separate drafter ({method}): "
            "PyExecutor raises NotImplementedError (py_executor.py @ 0004396)",
        }
    geom = predicted.pair_geometry(target, drafter, method, recipe, profile)
    flags = predicted.AcceptanceFlags(req.acceptance_length, req.acceptance_rate)
    acceptance = predicted.resolve_acceptance(flags, recipe, max_draft_len)
    setup = setup_for(
        geom.target,
        method,
        Hardware.from_gpu(gpu_spec),
        drafter=geom.drafter,
        mtp_layer=geom.mtp_layer,
        engine="trtllm",
        tp=req.tp,
        context=predicted.DEFAULT_CONTEXT,
        layout=layout,
    )
    # with an acceptance figure, the best k among those the deployment may use (beyond the
    # figure's own draft length a single rate only extrapolates); without, break-even up to 8
    ks = predicted.ks_for(max_draft_len) if acceptance is None else range(1, max_draft_len + 1)
    pred = predict(setup, acceptance, concurrency, tuple(ks))
    out = predicted.pays_json(pred, geom.source, "trtllm")
    out["lines"] = describe(pred)
    return out


def resolve_gpu(arg: str | None) -> Any:
    from spectool.gpu import resolve_gpu

    return resolve_gpu(arg)


def trtllm_rules(
    req: CheckRequest,
    method: str,
    architecture: str | None,
    drafter_kind: str | None,
    gpu_spec: Any,
) -> tuple[dict[str, Any], list[Finding]]:
    """The release's rules for the method, backend, GPU and layout (``architecture`` and
    ``drafter_kind`` None: not checked, offline from a profile)."""
    from spectool.trtllm import releases
    from spectool.trtllm.support import support_findings

    installed = releases.detect_installed_version()
    version = req.trtllm_version or installed
    release = releases.release_for_version(version) if version else DEFAULT_TRTLLM_RELEASE
    findings = support_findings(
        method,
        target_architecture=architecture,
        drafter_kind=drafter_kind,
        backend=req.trtllm_backend,
        release=release,
        sm=gpu_spec.sm if gpu_spec is not None else None,
    )
    from spectool.parallel import release_layout_problem

    if req.trtllm_backend in releases.release_info(release).backends:
        problem = release_layout_problem(req.layout(), release, req.trtllm_backend)
        if problem is not None:
            findings.append(
                error(
                    "LAYOUT_UNSUPPORTED_BY_RELEASE",
                    problem,
                    "Use a TensorRT-LLM release whose LLM API has these options.",
                )
            )
    from spectool.predict.parallel_cost import PP_REFUSED_METHODS

    if req.layout().pp > 1 and method in PP_REFUSED_METHODS:
        # PyExecutor.__init__ raises NotImplementedError("Drafting is not supported for selected
        # executor loop") when a separate drafter meets _executor_loop_pp, in every release spectool
        # knows (tensorrt_llm/_torch/pyexecutor/py_executor.py, 0.21 to main @ 0004396720054f)
        findings.append(
            error(
                "DRAFTER_WITH_PIPELINE_PARALLEL",
                f"{method} drafts with a separate drafter, which TensorRT-LLM's pipeline-parallel "
                f"executor loop refuses (PP {req.layout().pp}): trtllm-serve would fail at start",
                "Use --pp 1 (more TP instead), or a one-model method: EAGLE-3 or MTP.",
            )
        )
    info_json = {
        "version": version,
        "installed": installed,
        "release": release,
        "backend": req.trtllm_backend,
    }
    return info_json, findings

"""The runtime gate of a build: a tune decision's per-concurrency choices as the engine's own
switch.

From a decision, the choices per concurrency become the engine's runtime gate, in the form the
release supports: ``max_concurrency`` when the choices are one ``k`` then off, else
``draft_len_schedule``; a release with only ``max_concurrency`` gets the cut-off at the last
concurrency that speculates; a release with neither gets no gate (``serve``'s cost gate picks
the baseline when load is high). Each approximation is a note in the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spectool import methods
from spectool.deploy.manifest import LimitsRecord, RuntimeGateRecord
from spectool.errors import BadInputError

if TYPE_CHECKING:
    from spectool.deploy.build_request import BuildInputs


@dataclass(frozen=True)
class Gate:
    """The runtime gate chosen for the speculative config: engine keyword arguments + record."""

    kwargs: dict[str, Any]
    record: RuntimeGateRecord | None
    notes: tuple[str, ...]


def plan_runtime_gate(inputs: BuildInputs, limits: LimitsRecord) -> Gate:
    decision = inputs.decision
    if decision is None or not decision.speculates_anywhere:
        return Gate({}, None, ())
    off_above = decision.off_above
    assert off_above is not None
    if off_above >= limits.max_batch_size:
        return Gate({}, None, ())  # the server never batches beyond where speculation pays
    gate = decision.gate()
    if inputs.request.engine == "torch":
        if gate is not None:
            return Gate(
                {"max_concurrency": gate.max_concurrency}, _record("max_concurrency", off_above), ()
            )
        schedule = decision.draft_len_schedule("up_to")
        return Gate({"draft_len_schedule": schedule}, _record("draft_len_schedule", off_above), ())
    from spectool.trtllm.releases import release_info

    assert inputs.report.trtllm is not None
    release = inputs.report.trtllm["release"]
    rel = f"TensorRT-LLM {release}"
    if inputs.request.trtllm_backend != "pytorch":
        return Gate(
            {},
            None,
            (
                f"{rel}'s TensorRT backend cannot switch speculation off by batch size; "
                "spectool serve's cost gate picks the baseline under load",
            ),
        )
    info = release_info(release)
    base, notes = path_kwargs(inputs, release, off_above)
    if base is None:
        return Gate({}, None, notes)
    path = "two_model" if base.get("two_model") else "one_model"
    if gate is not None and info.has_max_concurrency:
        return Gate(
            {**base, "max_concurrency": gate.max_concurrency},
            _record("max_concurrency", off_above, path),
            notes,
        )
    if info.has_draft_len_schedule:
        schedule = decision.draft_len_schedule("from")
        return Gate(
            {**base, "draft_len_schedule": schedule},
            _record("draft_len_schedule", off_above, path),
            notes,
        )
    if info.has_max_concurrency:
        return Gate(
            {**base, "max_concurrency": off_above},
            _record("max_concurrency", off_above, path),
            (
                *notes,
                f"{rel} has no draft_len_schedule: the decision's per-concurrency draft lengths "
                f"became max_draft_len {decision.max_draft_len} up to concurrency {off_above}, then off",
            ),
        )
    return Gate(
        {},
        None,
        (
            f"{rel} cannot switch speculation off by batch size (no draft_len_schedule or "
            f"max_concurrency); speculative.yaml always speculates and spectool serve's cost gate "
            f"picks baseline.yaml above concurrency {off_above}",
        ),
    )


def _record(kind: str, off_above: int, path: str | None = None) -> RuntimeGateRecord:
    return RuntimeGateRecord(kind=kind, off_above=off_above, drafter_path=path)  # type: ignore[arg-type]


INERT_GATE_CHOICES = ("serve", "two-model")


def path_kwargs(
    inputs: BuildInputs, release: str, off_above: int
) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """Renderer arguments for a drafter path that honours the gate, or None and the reason.

    Consults the gate table (:mod:`spectool.trtllm.gates`). Where the method's default path
    ignores the gate, ``--inert-gate`` chooses, and the note says which and why.
    """
    from spectool.trtllm.gates import gate_support, two_model_key
    from spectool.trtllm.releases import release_info

    report, choice = inputs.report, inputs.request.inert_gate
    if choice not in INERT_GATE_CHOICES:
        raise BadInputError(
            "--inert-gate", f"expected one of {', '.join(INERT_GATE_CHOICES)}, got {choice!r}"
        )
    native = methods.get(report.method).uses_native_layers
    mtp_layers = None
    if native:
        mtp_layers = (
            report.target.mtp_layers if report.target is not None else report.extra["mtp_layers"]
        )
    support = gate_support(release, report.method, mtp_layers=mtp_layers)
    kwargs: dict[str, Any] = {"mtp_layers": mtp_layers} if mtp_layers else {}
    info = release_info(release)
    if support.effective or not (info.has_max_concurrency or info.has_draft_len_schedule):
        if not support.effective:
            return None, (
                f"TensorRT-LLM {release} cannot switch speculation off by batch size (no "
                f"draft_len_schedule or max_concurrency); speculative.yaml always speculates and "
                f"spectool serve's cost gate picks baseline.yaml above concurrency {off_above}",
            )
        return kwargs, ()
    key = two_model_key(release, report.method)
    if choice == "two-model" and key is not None:
        return {**kwargs, "two_model": True}, (
            f"{support.describe()}; chose the two-model path ({key}: false) so the runtime "
            f"gate takes effect: two-model has a different step cost from the one-model path, "
            "so measure it (spectool tune) before relying on the decision",
        )
    alternative = (
        f"; --inert-gate two-model would write {key}: false instead (a different step cost, to "
        "be measured)"
        if key is not None
        else ""
    )
    return None, (
        f"{support.describe()}; chose no runtime gate: speculative.yaml always speculates and "
        f"spectool serve's cost gate picks baseline.yaml above concurrency {off_above}"
        f"{alternative}",
    )

"""Option aliases shared by several commands (one definition, one help text)."""

from __future__ import annotations

from typing import Annotated

import typer

TargetArg = Annotated[
    str | None,
    typer.Argument(
        help="Target model: a local folder, a Hugging Face repo id (org/name[@rev]), or a profile name. Default: the embedded demo pair."
    ),
]
DrafterArg = Annotated[
    str | None,
    typer.Argument(
        help="Drafter: a local folder, a repo id, or 'self' (the target's MTP layers). Default: the profile's."
    ),
]
ProfileOpt = Annotated[
    str | None, typer.Option("--profile", help="A named deployment recipe (profiles/*.yaml).")
]
MethodOpt = Annotated[
    str,
    typer.Option(
        "--method",
        help="auto, eagle3, eagle, draft_model, mtp, ngram or medusa (auto: from the "
        "drafter's weights).",
    ),
]
MaxDraftLenOpt = Annotated[
    int | None, typer.Option("--max-draft-len", help="Tokens drafted per step.")
]
TrtllmVersionOpt = Annotated[
    str | None,
    typer.Option(
        "--trtllm-version",
        help="TensorRT-LLM release to target (default: the installed one, else the newest known).",
    ),
]
TrtllmBackendOpt = Annotated[
    str, typer.Option("--trtllm-backend", help="pytorch or tensorrt (legacy engine backend).")
]
GpuOpt = Annotated[
    str | None, typer.Option("--gpu", help="GPU name from profiles/gpus, or auto (detect).")
]
TpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel size.")]
MaxBatchOpt = Annotated[
    int | None, typer.Option("--max-batch-size", help="Largest batch the server runs.")
]
MaxSeqOpt = Annotated[
    int | None,
    typer.Option("--max-seq-len", help="Longest sequence (prompt + output) to budget for."),
]
TrustRemoteCodeOpt = Annotated[
    bool,
    typer.Option(
        "--trust-remote-code",
        help="Allow engines to run the model's own code (never done by check itself).",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
# The prediction (spectool.predicted): check's "will it pay", tune --predict-only.
ConcurrencyListOpt = Annotated[
    str | None,
    typer.Option(
        "--concurrency", help="Concurrencies to predict, comma-separated (default 1,8,64)."
    ),
]
AcceptanceLengthOpt = Annotated[
    float | None,
    typer.Option(
        "--acceptance-length",
        help="Mean tokens per step (bonus included) at the profile's max draft length, "
        "for the prediction.",
    ),
]
AcceptanceRateOpt = Annotated[
    float | None,
    typer.Option(
        "--acceptance-rate", help="Per-draft-token acceptance rate in [0, 1], for the prediction."
    ),
]

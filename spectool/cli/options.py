"""Option aliases shared by several commands (one definition, one help text)."""

from __future__ import annotations

from typing import Annotated

import typer

from spectool.cli.help import ADVANCED, ENGINE, MAIN, OUTPUT, PREDICTION

TargetArg = Annotated[
    str | None,
    typer.Argument(
        help="Target model: a local folder, a Hugging Face repo id (org/name[@rev]), or a "
        "profile name.",
        show_default="the embedded demo pair",
    ),
]
DrafterArg = Annotated[
    str | None,
    typer.Argument(
        help="Drafter: a local folder, a repo id, or 'self' (the target's MTP layers).",
        show_default="the profile's",
    ),
]
ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile",
        help="A named deployment recipe (profiles/*.yaml).",
        show_default="demo, when no TARGET is given",
        rich_help_panel=MAIN,
    ),
]
MethodOpt = Annotated[
    str,
    typer.Option(
        "--method",
        help="auto, eagle3, eagle, draft_model, mtp, ngram or medusa (auto: from the "
        "drafter's weights).",
        rich_help_panel=MAIN,
    ),
]
MaxDraftLenOpt = Annotated[
    int | None,
    typer.Option(
        "--max-draft-len",
        help="Tokens drafted per step, 1 to 64.",
        show_default="the profile's, else 4; mtp: the target's MTP layers",
        rich_help_panel=ENGINE,
    ),
]
TrtllmVersionOpt = Annotated[
    str | None,
    typer.Option(
        "--trtllm-version",
        help="TensorRT-LLM release to target.",
        rich_help_panel=ENGINE,
    ),
]
TrtllmBackendOpt = Annotated[
    str,
    typer.Option(
        "--trtllm-backend",
        help="pytorch or tensorrt (legacy engine backend).",
        rich_help_panel=ENGINE,
    ),
]
GpuOpt = Annotated[
    str | None,
    typer.Option(
        "--gpu", help="GPU name from profiles/gpus, or auto (detect).", rich_help_panel=MAIN
    ),
]
TpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel size.", rich_help_panel=ENGINE)]
# The rest of the parallel layout (spectool.parallel); TP x PP ranks = nodes x GPUs per node.
PpOpt = Annotated[int, typer.Option("--pp", help="Pipeline-parallel size.", rich_help_panel=ENGINE)]
EpOpt = Annotated[
    int,
    typer.Option("--ep", help="Expert-parallel size (MoE; divides --tp).", rich_help_panel=ENGINE),
]
AttentionDpOpt = Annotated[
    bool,
    typer.Option(
        "--attention-dp",
        help="Attention data parallelism (MoE): attention replicated per rank.",
        rich_help_panel=ENGINE,
    ),
]
NodesOpt = Annotated[
    int, typer.Option("--nodes", help="Nodes the ranks run on.", rich_help_panel=ENGINE)
]
GpusPerNodeOpt = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-node",
        help="GPUs used per node.",
        show_default="TP x PP / --nodes",
        rich_help_panel=ENGINE,
    ),
]
MaxBatchOpt = Annotated[
    int | None,
    typer.Option("--max-batch-size", help="Largest batch the server runs.", rich_help_panel=ENGINE),
]
MaxSeqOpt = Annotated[
    int | None,
    typer.Option(
        "--max-seq-len",
        help="Longest sequence (prompt + output) to budget for.",
        rich_help_panel=ENGINE,
    ),
]
TrustRemoteCodeOpt = Annotated[
    bool,
    typer.Option(
        "--trust-remote-code",
        help="Allow engines to run the model's own code (never done by check itself).",
        rich_help_panel=ADVANCED,
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON object instead of tables.", rich_help_panel=OUTPUT),
]
# The prediction (spectool.predicted): check's "will it pay", tune --predict-only.
ConcurrencyListOpt = Annotated[
    str | None,
    typer.Option(
        "--concurrency",
        help="Concurrencies to predict, comma-separated.",
        rich_help_panel=PREDICTION,
    ),
]
AcceptanceLengthOpt = Annotated[
    float | None,
    typer.Option(
        "--acceptance-length",
        help="Mean tokens per step (bonus included) at the profile's max draft length, "
        "for the prediction.",
        show_default="the profile's figure, else none: break-even acceptance",
        rich_help_panel=PREDICTION,
    ),
]
AcceptanceRateOpt = Annotated[
    float | None,
    typer.Option(
        "--acceptance-rate",
        help="Per-draft-token acceptance rate in [0, 1], for the prediction.",
        show_default="the profile's figure, else none: break-even acceptance",
        rich_help_panel=PREDICTION,
    ),
]


def shared_help_defaults() -> dict[str, str]:
    """Shown defaults of the shared options that come from constants of heavier modules."""
    from spectool.check import DEFAULT_TRTLLM_RELEASE
    from spectool.predicted import DEFAULT_CONCURRENCY

    return {
        "trtllm_version": f"the installed one, else {DEFAULT_TRTLLM_RELEASE}",
        "concurrency": ",".join(map(str, DEFAULT_CONCURRENCY)),
    }

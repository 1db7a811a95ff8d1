"""A parallel layout (TP, PP, expert parallelism, attention DP, nodes) checked against a model.

Partial work on issue 25: the layout and its validation only; the CLI flags, per-rank memory,
step cost and launch files are not wired to it yet. The rules mirror TensorRT-LLM's
``tensorrt_llm/mapping.py`` ``Mapping.__init__`` (NVIDIA/TensorRT-LLM at commit 05ebebb2c1d3):

- ``world_size`` must equal ``tp_size * pp_size * cp_size`` (spectool has no CP: ``cp = 1``);
- ``moe_tp_size * moe_ep_size * moe_cluster_size`` must equal ``tp_size`` (no cluster here), so
  the expert-parallel size divides the tensor-parallel size;
- ``pp_layers``: ``pp_size`` may not exceed ``num_hidden_layers``;
- ``ep_experts`` gives each EP rank ``num_experts // moe_ep_size`` experts, so experts that do not
  divide evenly are silently dropped there; spectool refuses that instead;
- ``is_multi_node``: ``world_size > gpus_per_node``.

Heads divisible by TP is spectool's own rule (attention heads are split evenly across the TP
group unless attention DP replicates attention). Which layouts each release supports together
with each speculative method is not encoded yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from spectool.errors import BadInputError


@dataclass(frozen=True)
class ParallelLayout:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    attention_dp: bool = False
    nodes: int = 1
    gpus_per_node: int = 8

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    def llm_api_fields(self) -> dict[str, object]:
        """The TensorRT-LLM LLM-API (``extra_llm_api_options``) fields for this layout."""
        return {
            "tensor_parallel_size": self.tp,
            "pipeline_parallel_size": self.pp,
            "moe_expert_parallel_size": self.ep,
            "enable_attention_dp": self.attention_dp,
        }

    def serve_flags(self) -> list[str]:
        """The ``trtllm-serve`` flags for this layout.

        From the ``serve`` command's click options in TensorRT-LLM's
        ``tensorrt_llm/commands/serve.py`` (the stored version with ``--cluster_size``):
        ``--tp_size``, ``--pp_size``, ``--ep_size``, ``--gpus_per_node``. Attention DP has no flag
        there; it travels in the ``--extra_llm_api_options`` YAML (:meth:`llm_api_fields`).
        """
        return [
            "--tp_size",
            str(self.tp),
            "--pp_size",
            str(self.pp),
            "--ep_size",
            str(self.ep),
            "--gpus_per_node",
            str(self.gpus_per_node),
        ]


def validate_layout(
    layout: ParallelLayout,
    *,
    heads: int,
    layers: int,
    experts: int | None = None,
    where: str = "--tp/--pp/--ep",
) -> None:
    """:class:`BadInputError` (exit 2) naming the first rule ``layout`` breaks for the model.

    ``experts`` is ``None`` for a dense model, which then may not ask for expert parallelism.
    """
    for flag, value in (
        ("--tp", layout.tp),
        ("--pp", layout.pp),
        ("--ep", layout.ep),
        ("--nodes", layout.nodes),
        ("--gpus-per-node", layout.gpus_per_node),
    ):
        if value < 1:
            raise BadInputError(flag, f"must be 1 or more, got {value}")
    gpus = layout.nodes * layout.gpus_per_node
    if layout.world_size != gpus:
        raise BadInputError(
            where,
            f"TP {layout.tp} x PP {layout.pp} = {layout.world_size} ranks, but --nodes "
            f"{layout.nodes} x --gpus-per-node {layout.gpus_per_node} = {gpus} GPUs",
        )
    if layout.tp % layout.ep:
        raise BadInputError("--ep", f"EP {layout.ep} must divide TP {layout.tp}")
    if layout.pp > layers:
        raise BadInputError("--pp", f"PP {layout.pp} exceeds the model's {layers} layers")
    if not layout.attention_dp and heads % layout.tp:
        raise BadInputError(
            "--tp", f"the model's {heads} attention heads do not split over TP {layout.tp}"
        )
    if experts is None:
        if layout.ep > 1:
            raise BadInputError(
                "--ep", f"EP {layout.ep} needs a mixture-of-experts model; this one is dense"
            )
        if layout.attention_dp:
            raise BadInputError(
                "--attention-dp", "needs a mixture-of-experts model; this one is dense"
            )
    elif experts % layout.ep:
        raise BadInputError(
            "--ep", f"the model's {experts} experts do not split over EP {layout.ep}"
        )

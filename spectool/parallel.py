"""A parallel layout (TP, PP, expert parallelism, attention DP, nodes) checked against a model.

Issue 25: ``check`` and ``build`` take ``--tp/--pp/--ep/--attention-dp/--nodes/--gpus-per-node``
(:func:`layout_from_flags`), validate them against the target (:func:`validate_for_checkpoint`),
estimate memory per rank (:mod:`spectool.memory_ranks`) and write the layout into TensorRT-LLM's
YAML and launch files (:mod:`spectool.deploy.launch_files`); the step-cost model prices its
collectives and pipeline (:mod:`spectool.predict.parallel_cost`). The rules mirror TensorRT-LLM's
``tensorrt_llm/mapping.py`` ``Mapping.__init__`` (NVIDIA/TensorRT-LLM at commit 05ebebb2c1d3):

- ``world_size`` must equal ``tp_size * pp_size * cp_size`` (spectool has no CP: ``cp = 1``);
- ``moe_tp_size * moe_ep_size * moe_cluster_size`` must equal ``tp_size`` (no cluster here), so
  the expert-parallel size divides the tensor-parallel size;
- ``pp_layers``: ``pp_size`` may not exceed ``num_hidden_layers``;
- ``ep_experts`` gives each EP rank ``num_experts // moe_ep_size`` experts, so experts that do not
  divide evenly are silently dropped there; spectool refuses that instead;
- ``is_multi_node``: ``world_size > gpus_per_node``.

Heads divisible by TP is spectool's own rule (attention heads are split evenly across the TP
group unless attention DP replicates attention).

Speculation with these layouts: no TensorRT-LLM rule refusing a speculative method with PP,
EP or attention DP was found in the stored source (searched: ``modeling_speculative.py`` @
b35ac1b64368, ``mapping.py``, ``llm_args.py``; e.g. no "MTP with attention DP" or "EAGLE-3 with
PP" refusal), so spectool encodes none. What the source does say is where the drafter lives,
used by :mod:`spectool.memory_ranks`: ``SpecDecOneEngineForCausalLM.__init__`` builds the
one-model draft module (EAGLE-3 head, MTP layers) on every rank, with no pipeline-stage
condition; ``Eagle3Attention`` and ``Eagle3DecoderLayer`` use ``tp_size = 1`` /
``overridden_tp_size=1`` under ``mapping.enable_attention_dp`` (replicated), TP-split otherwise.

Each release's LLM-API option table (spectool's copy, ``spectool/trtllm/schema/<release>.json``)
must have the four layout fields (:func:`release_layout_problem`); all generations spectool knows
(0.21 to main) have them.
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


def layout_from_flags(
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    attention_dp: bool = False,
    nodes: int = 1,
    gpus_per_node: int | None = None,
) -> ParallelLayout:
    """The layout the flags ask for; ``gpus_per_node`` defaults to TP x PP / nodes.

    :class:`BadInputError` (exit 2) when the ranks do not spread evenly over ``nodes`` with no
    ``--gpus-per-node`` given (the other rules are :func:`validate_layout`'s).
    """
    if gpus_per_node is None:
        world = tp * pp
        if nodes >= 1 and world % nodes:
            raise BadInputError(
                "--nodes",
                f"TP {tp} x PP {pp} = {world} ranks do not spread evenly over {nodes} nodes; "
                "pass --gpus-per-node",
            )
        gpus_per_node = max(1, world // max(nodes, 1))
    return ParallelLayout(
        tp=tp, pp=pp, ep=ep, attention_dp=attention_dp, nodes=nodes, gpus_per_node=gpus_per_node
    )


def moe_experts(config: dict) -> int | None:
    """Routed experts of a (text) config, None for a dense model.

    The keys TensorRT-LLM's model configs read: ``n_routed_experts`` (DeepSeek),
    ``num_local_experts`` (Mixtral, GPT-OSS), ``num_experts`` (Qwen-MoE).
    """
    for key in ("n_routed_experts", "num_local_experts", "num_experts"):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def validate_for_checkpoint(layout: ParallelLayout, ckpt: object) -> None:
    """:func:`validate_layout` against a checkpoint's heads, layers and routed experts."""
    heads = getattr(ckpt, "num_attention_heads", None) or 1
    layers = getattr(ckpt, "num_layers", None) or 1
    experts = moe_experts(getattr(ckpt, "text_config", {}) or {})
    validate_layout(layout, heads=heads, layers=layers, experts=experts)


def release_layout_problem(layout: ParallelLayout, release: str, backend: str) -> str | None:
    """Why ``release`` cannot express ``layout`` in its YAML (a field its option table lacks);
    None when it can. Only fields the layout changes from one GPU are required."""
    from spectool.trtllm.releases import load_schema

    top = load_schema(release).top_class(backend)
    defaults = ParallelLayout()
    missing = [
        key
        for key, value in layout.llm_api_fields().items()
        if key not in top.keys and value != defaults.llm_api_fields()[key]
    ]
    if not missing:
        return None
    return (
        f"TensorRT-LLM {release} ({backend}) has no {', '.join(missing)} option; this layout "
        "cannot be written for it"
    )


def pp_stage_layers(num_layers: int, pp: int) -> list[range]:
    """Layers of each pipeline stage as TensorRT-LLM splits them: ``Mapping.pp_layers`` uses
    ``torch.tensor_split(torch.arange(num_layers), pp_size)``, so when ``num_layers % pp = n``
    the first ``n`` stages get one layer more (``tensorrt_llm/mapping.py``, the stored versions
    with ``pp_partition``; older ones gave every stage ``num_layers // pp_size``)."""
    base, extra = divmod(num_layers, pp)
    out: list[range] = []
    start = 0
    for stage in range(pp):
        size = base + (1 if stage < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out

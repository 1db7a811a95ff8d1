"""Every speculation method spectool knows, in one torch-free table.

Each :class:`Method` says what the method needs (a standalone drafter checkpoint, an EAGLE head,
Medusa heads, the target's hidden states, native MTP layers in the target, or nothing), which
drafter checkpoint kind it expects (the ``kind`` :mod:`spectool.ckpt.inspect` reads from the
weights), which engines run it (``"trtllm"``: TensorRT-LLM, per release in
:mod:`spectool.trtllm.releases`; ``"torch"``: spectool's embedded engine), how its drafter
counts in the memory estimate, and what ``spectool check`` verifies for it.

Everything that lists methods reads from here: the checkpoint rules (:mod:`spectool.compat`),
the recipes (:mod:`spectool.profiles`), TensorRT-LLM's release tables (the universe of names;
which release runs which method stays TensorRT-LLM knowledge in :mod:`spectool.trtllm`),
``check``, ``build``, ``serve``, ``tune`` and the memory estimate (:mod:`spectool.memory`).

Adding a method to the embedded engine: a proposer in :mod:`spectool.engine`, ``"torch"`` in
its ``engines`` here, tests (``tests/test_methods.py`` compares this table with the engine's).

Imports nothing but the standard library: ``check`` and ``build`` read it without torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

# Drafter checkpoint kinds, as spectool.ckpt.inspect names them (tests/test_methods.py checks).
CAUSAL_LM = "causal_lm"
EAGLE1 = "eagle1"
EAGLE3 = "eagle3"
MEDUSA = "medusa"

ENGINES: tuple[str, ...] = ("trtllm", "torch")

# What a method needs to draft.
Need = Literal[
    "standalone_drafter",  # a separate causal LM of the target's tokenizer
    "eagle_head",  # an EAGLE-1/2 or EAGLE-3 head checkpoint
    "medusa_heads",  # Medusa heads checkpoint
    "target_hidden_states",  # the target's hidden states, fed to the head
    "native_mtp_layers",  # the target's own multi-token-prediction layers
]
# How the drafter counts in the memory estimate (per GPU): nothing; KV of the target's own MTP
# layers (their weights are in the target's); a whole model's weights and KV; a head's weights
# and its few layers' KV; heads' weights only (Medusa keeps no KV cache).
DrafterMemory = Literal["none", "native_layers_kv", "model", "head", "head_no_kv"]


@dataclass(frozen=True)
class Method:
    """One speculation method (or the baseline ``none``); see the module docstring."""

    name: str
    label: str
    needs: frozenset[Need]
    drafter_kind: str | None  # the checkpoint kind expected as drafter; None: no drafter folder
    engines: frozenset[str]
    drafter_memory: DrafterMemory
    verifies: tuple[str, ...]  # what ``spectool check`` verifies for it (README, --help)

    @property
    def takes_drafter(self) -> bool:
        """Whether a drafter checkpoint is passed besides the target."""
        return self.drafter_kind is not None

    @property
    def uses_native_layers(self) -> bool:
        """Whether the target drafts with its own MTP layers (the drafter is "self")."""
        return "native_mtp_layers" in self.needs

    @property
    def speculates(self) -> bool:
        return self.name != NONE


NONE = "none"
# The drafter argument that names the target's own MTP layers (check, build, serve, tune).
SELF_DRAFTER = "self"

_COMMON_HEAD_CHECKS = (
    "the drafter's weights hold this head kind",
    "hidden size of the head equals the target's",
    "vocabulary sizes agree",
    "base_model_name_or_path names the target",
)

_TABLE: tuple[Method, ...] = (
    Method(
        name="eagle3",
        label="EAGLE-3",
        needs=frozenset({"eagle_head", "target_hidden_states"}),
        drafter_kind=EAGLE3,
        engines=frozenset({"trtllm", "torch"}),
        drafter_memory="head",
        verifies=(
            *_COMMON_HEAD_CHECKS,
            "fc input = captured layers x target hidden",
            "d2t map and draft lm_head for a reduced draft vocabulary",
            "the captured target layers exist",
        ),
    ),
    Method(
        name="eagle",
        label="EAGLE-1/2",
        needs=frozenset({"eagle_head", "target_hidden_states"}),
        drafter_kind=EAGLE1,
        engines=frozenset({"trtllm"}),
        drafter_memory="head",
        verifies=(*_COMMON_HEAD_CHECKS, "fc input = 2 x target hidden"),
    ),
    Method(
        name="draft_model",
        label="draft model",
        needs=frozenset({"standalone_drafter"}),
        drafter_kind=CAUSAL_LM,
        engines=frozenset({"trtllm", "torch"}),
        drafter_memory="model",
        verifies=(
            "the drafter is a standalone causal LM",
            "the tokenizers share a token space (ids, specials, padding)",
            "the drafter is much cheaper than the target",
            "context length and dtype",
        ),
    ),
    Method(
        name="mtp",
        label="MTP",
        needs=frozenset({"native_mtp_layers"}),
        drafter_kind=None,
        engines=frozenset({"trtllm", "torch"}),
        drafter_memory="native_layers_kv",
        verifies=(
            "the target declares and holds MTP layers",
            "max_draft_len against the number of MTP layers",
        ),
    ),
    Method(
        name="ngram",
        label="n-gram",
        needs=frozenset(),
        drafter_kind=None,
        engines=frozenset({"trtllm", "torch"}),
        drafter_memory="none",
        verifies=("no drafter is passed (it would be unused)",),
    ),
    Method(
        name="medusa",
        label="Medusa",
        needs=frozenset({"medusa_heads", "target_hidden_states"}),
        drafter_kind=MEDUSA,
        engines=frozenset({"trtllm"}),
        drafter_memory="head_no_kv",
        verifies=(
            "the drafter's weights hold Medusa heads",
            "head width equals the target's hidden size",
            "head rows equal the target's vocabulary",
        ),
    ),
)

BASELINE = Method(
    name=NONE,
    label="no speculation",
    needs=frozenset(),
    drafter_kind=None,
    engines=frozenset(ENGINES),
    drafter_memory="none",
    verifies=(),
)

# The speculation methods, in the order spectool lists them (``none`` is not one).
METHODS: tuple[str, ...] = tuple(m.name for m in _TABLE)
_BY_NAME: Mapping[str, Method] = MappingProxyType({m.name: m for m in (*_TABLE, BASELINE)})
# Methods whose drafts come from the target itself or from text: they take no drafter.
METHODS_WITHOUT_DRAFTER: frozenset[str] = frozenset(m.name for m in _TABLE if not m.takes_drafter)
# Methods that run a drafter's own forward (a draft model or an EAGLE head), so predicting their
# cost needs the drafter's sizes; Medusa's heads are costed from the target's LM head, MTP from
# the target's layers (spectool.predict).
DRAFTER_GEOMETRY_METHODS: frozenset[str] = frozenset(
    m.name for m in _TABLE if m.needs & {"standalone_drafter", "eagle_head"}
)
# Drafter checkpoint kind -> the method its weights call for (``--method auto``).
METHOD_FOR_KIND: Mapping[str, str] = MappingProxyType(
    {m.drafter_kind: m.name for m in _TABLE if m.drafter_kind is not None}
)


# What a drafter costs to serve, cheapest first: ties between methods that measure alike go to
# the cheaper (spectool.decide.methods). No weights; the target's own layers' KV; heads without
# KV; a head with its layers' KV; a whole model with its KV cache.
_SERVING_COST: tuple[DrafterMemory, ...] = (
    "none",
    "native_layers_kv",
    "head_no_kv",
    "head",
    "model",
)


def serving_cost_rank(name: str) -> int:
    """``name``'s place in :data:`_SERVING_COST` (0 = cheapest to serve)."""
    return _SERVING_COST.index(_BY_NAME[name].drafter_memory)


def get(name: str) -> Method:
    """The method called ``name`` (``none`` included); :class:`KeyError` when unknown."""
    return _BY_NAME[name]


def is_method(name: str) -> bool:
    """Whether ``name`` is a speculation method (``none`` and ``auto`` are not)."""
    return name in METHODS


def expected_kind(name: str) -> str | None:
    """The drafter checkpoint kind ``name`` expects (None: no drafter checkpoint)."""
    return _BY_NAME[name].drafter_kind


def engine_methods(engine: str, *, baseline: bool = False) -> tuple[str, ...]:
    """The methods ``engine`` runs, in table order; with ``baseline``, ``none`` first."""
    if engine not in ENGINES:
        raise KeyError(engine)
    names = tuple(m.name for m in _TABLE if engine in m.engines)
    return (NONE, *names) if baseline else names


def unknown_method_problem(name: str, *, allow_auto: bool = True) -> str:
    """The one-line problem for an unknown method name (for the caller's error)."""
    from spectool.suggest import suggestion

    known = ("auto", *METHODS) if allow_auto else METHODS
    return f"unknown method {name!r}{suggestion(name, known)}; choose from {', '.join(known)}"

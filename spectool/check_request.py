"""What ``spectool check`` is asked and what it answers: :class:`CheckRequest` (and the
:class:`PairOptions` that ``build`` and ``tune`` share) and :class:`CheckReport`, with check's
defaults. :mod:`spectool.check` runs it; it re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from spectool import methods
from spectool.ckpt.inspect import Checkpoint
from spectool.findings import Finding, Severity
from spectool.memory import MemoryEstimate
from spectool.parallel import ParallelLayout, layout_from_flags

ENGINES = ("trtllm", "torch", "none")
DEFAULT_PROFILE = "demo"
SELF_DRAFTER = methods.SELF_DRAFTER
# What spectool's embedded engine runs (spectool.methods: engines containing "torch").
TORCH_ENGINE_METHODS = methods.engine_methods("torch")
TORCH_ENGINE_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
DEFAULT_MAX_SEQ_LEN = 8192
# Judged against when TensorRT-LLM is not installed and no --trtllm-version is given: the newest
# release on PyPI (1.2.1) at the time of writing.
DEFAULT_TRTLLM_RELEASE = "1.2"


@dataclass(frozen=True)
class PairOptions:
    """What ``check``, ``build`` and ``tune`` are all asked: the pair, the method and the
    deployment it is judged for. :class:`CheckRequest` adds the engine; ``build``'s and
    ``tune``'s requests extend this and turn it into one CheckRequest with
    :meth:`check_request`."""

    target: str | None = None
    drafter: str | None = None
    profile: str | None = None
    method: str = "auto"
    max_draft_len: int | None = None
    trtllm_version: str | None = None
    trtllm_backend: str = "pytorch"
    gpu: str | None = "auto"
    tp: int = 1
    max_batch_size: int | None = None
    max_seq_len: int | None = None
    trust_remote_code: bool = False
    # The rest of the parallel layout (spectool.parallel); tp above is its tensor-parallel size.
    pp: int = 1
    ep: int = 1
    attention_dp: bool = False
    nodes: int = 1
    gpus_per_node: int | None = None

    def layout(self) -> ParallelLayout:
        """The parallel layout asked for (:func:`spectool.parallel.layout_from_flags`)."""
        return layout_from_flags(
            tp=self.tp,
            pp=self.pp,
            ep=self.ep,
            attention_dp=self.attention_dp,
            nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
        )

    @property
    def plain_tp(self) -> bool:
        """Only --tp (one node, no PP/EP/attention DP): the single-table memory estimate."""
        return (
            self.pp == 1
            and self.ep == 1
            and not self.attention_dp
            and self.nodes == 1
            and self.gpus_per_node in (None, self.tp)
        )

    def pair_options(self, **changes: Any) -> dict[str, Any]:
        """These options as keyword arguments (``changes`` replace some)."""
        return {**{f.name: getattr(self, f.name) for f in fields(PairOptions)}, **changes}

    def check_request(self, engine: str, **changes: Any) -> CheckRequest:
        """The :class:`CheckRequest` for ``engine`` (``changes`` replace some options)."""
        return CheckRequest(engine=engine, **self.pair_options(**changes))


@dataclass(frozen=True)
class CheckRequest(PairOptions):
    engine: str = "trtllm"
    # The "will it pay" section (spectool.predicted): asked for when a GPU is known.
    concurrency: tuple[int, ...] | None = None
    acceptance_length: float | None = None
    acceptance_rate: float | None = None


@dataclass(frozen=True)
class CheckReport:
    method: str
    engine: str
    max_draft_len: int
    target: Checkpoint | None  # None: headers unavailable (offline), see ``unread``
    drafter: Checkpoint | None
    findings: list[Finding]
    memory: MemoryEstimate | None
    trtllm: dict[str, Any] | None = None
    gpu: dict[str, Any] | None = None
    profile: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    pays: dict[str, Any] | None = None  # the prediction (spectool.predicted.pays_json)
    unread: str | None = None  # why the headers could not be read; checks that did not run

    @property
    def verdict(self) -> str:
        if self.errors:
            return "incompatible"
        return "unverified" if self.unread else "compatible"

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "method": self.method,
            "engine": self.engine,
            "max_draft_len": self.max_draft_len,
            "profile": self.profile,
            "target": self.target.summary() if self.target else None,
            "drafter": self.drafter.summary() if self.drafter else None,
            "findings": [f.to_json() for f in self.findings],
            "memory": self.memory.to_json() if self.memory else None,
            "trtllm": self.trtllm,
            "gpu": self.gpu,
            "unverified": self.unread,
            "will_it_pay": self.pays,
        }

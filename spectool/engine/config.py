"""Engine configuration: :class:`EngineConfig` and the draft-length schedule."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spectool.embedded_rules import validate_engine_config
from spectool.engine.load import DTYPES
from spectool.engine.proposers import PROPOSERS
from spectool.errors import BadInputError, ConfigError

# "none" (plain decoding), then every registered proposer.
METHODS: tuple[str, ...] = ("none", *PROPOSERS)


class EngineBusyError(BadInputError):
    """The engine cannot do this while requests are queued or running (e.g. switch its draft
    length): retry once they have finished."""


@dataclass(frozen=True)
class EngineConfig:
    """How the engine decodes; validated on construction (:class:`ConfigError`).

    ``method``: ``"none"`` (plain decoding) or a registered proposer
    (:data:`spectool.engine.proposers.PROPOSERS`: ``"draft_model"``, a standalone drafter
    checkpoint; ``"ngram"``, prompt lookup, up to ``ngram_max_matching`` tokens matched; ...).
    ``max_draft_len``: k at small batch sizes. ``draft_len_schedule``: batch size -> k, keys are
    upper bounds (TensorRT-LLM semantics); the smallest key must map to ``max_draft_len``.
    ``max_concurrency``: speculation off above this batch size (same as
    ``{max_concurrency: max_draft_len}``; exclusive with the schedule). ``max_batch_size``:
    requests decoded together (more wait in a queue). ``max_seq_len``: prompt + output tokens
    per request (capped at the models' ``max_position_embeddings``). ``device``: ``"cpu"``,
    ``"cuda"``, ``"cuda:N"`` or ``"auto"``. ``dtype``: ``float32``, ``float64``, ``bfloat16``
    or ``float16``. ``pack_fp16_weights``: on CPU in float32, weights that float16 holds exactly
    (float16 checkpoints) also get a float16 copy for fbgemm's kernel, which multiplies in float32
    (see :class:`~spectool.engine.model.Projection`), and the decoder layers run in one C call
    where it fits (:mod:`spectool.engine.native_step`); False keeps every product on torch.mm.
    """

    method: str = "none"
    max_draft_len: int = 4
    draft_len_schedule: dict[int, int] | None = None
    max_concurrency: int | None = None
    ngram_max_matching: int = 3
    max_batch_size: int = 32
    max_seq_len: int = 1024
    device: str = "cpu"
    dtype: str = "float32"
    pack_fp16_weights: bool = True

    def __post_init__(self) -> None:
        where = "engine config"
        # the rules a build file can break, shared with build/serve (torch-free); the methods
        # are the live registry (a proposer registered later is accepted)
        validate_engine_config(
            {
                "method": self.method,
                "max_draft_len": self.max_draft_len,
                "draft_len_schedule": self.draft_len_schedule,
                "max_concurrency": self.max_concurrency,
                "max_batch_size": self.max_batch_size,
                "max_seq_len": self.max_seq_len,
            },
            where,
            runnable=("none", *PROPOSERS),
        )
        if self.ngram_max_matching < 1:
            raise ConfigError(
                where, f"ngram_max_matching must be >= 1, got {self.ngram_max_matching}"
            )
        if self.dtype not in DTYPES:
            raise ConfigError(
                where, f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}"
            )


def scheduled_draft_len(
    batch_size: int,
    max_draft_len: int,
    draft_len_schedule: dict[int, int] | None = None,
    max_concurrency: int | None = None,
) -> int:
    """Draft length k for a batch of ``batch_size`` running requests.

    TensorRT-LLM semantics: schedule keys are upper bounds, so k = ``schedule[key]`` for the
    smallest key >= batch_size, and 0 above the largest key. ``max_concurrency`` = m is the
    schedule ``{m: max_draft_len}``. Neither set: always ``max_draft_len``.
    Example: ``{4: 4, 8: 2, 32: 1}`` gives 4 for 1-4 requests, 2 for 5-8, 1 for 9-32, 0 above.
    """
    if max_draft_len <= 0 or batch_size < 1:
        return 0
    schedule = draft_len_schedule
    if schedule is None and max_concurrency is not None:
        schedule = {max_concurrency: max_draft_len}
    if schedule is None:
        return max_draft_len
    for key in sorted(schedule):
        if batch_size <= key:
            return schedule[key]
    return 0


def resolve_device(name: str) -> torch.device:
    """The torch device an engine config names (``"auto"``: CUDA when present)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ConfigError("engine config", f"unknown device {name!r}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("engine config", f"device {name!r} requested but CUDA is not available")
    return device

"""What ``tune`` needs from an engine: a server running draft length ``k`` (0 = no speculation).

One implementation per engine: :class:`~spectool.tuning.torch_driver.TorchDriver` (spectool's
embedded engine, in a worker process) and :class:`~spectool.tuning.trtllm_driver.TrtllmDriver`
(``trtllm-serve`` per configuration, configured by ``spectool build``'s code). At most one
server runs at a time: asking for another ``k`` stops the current one first, so the server
being measured has the machine to itself; the exception is ``tune --gpus`` with two GPU sets
or more, where the TensorRT-LLM driver keeps the baseline up on one set beside the speculative
server on another (:mod:`spectool.tuning.gpu_sets`, :mod:`spectool.tuning.side_by_side`). The embedded engine's driver keeps one server and
switches its draft length in place (``interleaves``), which is what lets ``tune`` alternate
speculative and baseline blocks; trtllm-serve needs a restart per draft length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ServerInfo:
    """A running server: its base URL, the model id requests name, and how long it took to
    become ready (0 when it was already running)."""

    base_url: str
    model_name: str
    k: int
    ready_s: float
    # where iteration stats are read: spectool's server pages through them by iteration number
    # (nothing drained, so another reader of /metrics cannot take them); trtllm-serve: /metrics
    metrics_path: str = "/metrics"


class ServerDriver(Protocol):
    """Starts and stops the servers of one tune run."""

    engine: str
    starts: int  # servers started so far
    # True when serve(k) switches the running server's draft length in place (no restart):
    # cells are then measured in interleaved pairs; otherwise the baseline brackets them.
    interleaves: bool

    def serve(self, k: int) -> ServerInfo:
        """A server running draft length ``k`` (the current one when it already does)."""
        ...

    def close(self) -> None:
        """Stop every server and process this driver started."""
        ...

    def __enter__(self) -> ServerDriver: ...

    def __exit__(self, *exc: object) -> None: ...

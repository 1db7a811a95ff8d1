"""What ``tune`` needs from an engine: a server running draft length ``k`` (0 = no speculation).

One implementation per engine: :class:`~spectool.tuning.torch_driver.TorchDriver` (spectool's
embedded engine, in a worker process) and :class:`~spectool.tuning.trtllm_driver.TrtllmDriver`
(``trtllm-serve`` per configuration, configured by ``spectool build``'s code). At most one
server runs at a time: asking for another ``k`` stops the current one first, so the server
being measured has the machine to itself.
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


class ServerDriver(Protocol):
    """Starts and stops the servers of one tune run."""

    engine: str
    starts: int  # servers started so far

    def serve(self, k: int) -> ServerInfo:
        """A server running draft length ``k`` (the current one when it already does)."""
        ...

    def close(self) -> None:
        """Stop every server and process this driver started."""
        ...

    def __enter__(self) -> ServerDriver: ...

    def __exit__(self, *exc: object) -> None: ...

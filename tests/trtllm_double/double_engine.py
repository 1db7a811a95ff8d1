"""The trtllm-serve double's engine: in-flight batching with a deterministic cost and acceptance.

What ``spectool tune`` needs of a server to decide, and nothing more: streamed completions whose
tokens come out one engine iteration at a time, and one ``/metrics`` entry per iteration in
TensorRT-LLM's shape (``iterLatencyMS``, ``numActiveRequests``, ``inflightBatchingStats``,
``specDecodingStats``).

* **Step cost**: ``FIXED_MS + PER_REQUEST_MS * batch + PER_DRAFT_TOKEN_MS * batch * k``
  milliseconds, slept for real: the weights read once per step whatever the batch, plus the
  tokens verified (the form spectool's step-cost model fits). With :data:`ALPHA` 0.8 one draft
  token pays at batch 1 (cost per token ~0.73 of the baseline's) and loses at batch 4 (~1.19).
* **Acceptance**: draft position ``j`` of a request's step at output position ``p`` is accepted
  unless ``(p + j) % 5 == 4``: a rate of :data:`ALPHA` = 0.8 per position, the same for every
  prompt, on every server and in every run, whatever the timing (so the pairs of a cell agree
  and it settles at its first look).

Every number is a function of the prompts, ``k`` and the batch; only the batch depends on timing
(which requests share a step), which the closed loop keeps at the concurrency.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

FIXED_MS = 6.0
PER_REQUEST_MS = 0.25
PER_DRAFT_TOKEN_MS = 2.0
ALPHA = 0.8  # the acceptance rate accepted() gives
MAX_STATS = 10_000  # TensorRT-LLM keeps a bounded queue too


def step_ms(batch: int, k: int) -> float:
    """The step time of an iteration of ``batch`` requests at draft length ``k``."""
    return FIXED_MS + PER_REQUEST_MS * batch + PER_DRAFT_TOKEN_MS * batch * k


def accepted(position: int, k: int) -> int:
    """Draft tokens accepted at output ``position`` (leading successes, see the docstring)."""
    n = 0
    while n < k and (position + n) % 5 != 4:
        n += 1
    return n


@dataclass
class Request:
    prompt: str
    max_tokens: int
    produced: int = 0
    out: queue.Queue = field(default_factory=queue.Queue)  # tokens per step; None: finished


class Engine:
    """One scheduler thread running iterations over the active requests."""

    def __init__(self, draft_len) -> None:  # draft_len(batch) -> k (the release's gate)
        self.draft_len = draft_len
        self.active: list[Request] = []
        self.stats: list[dict] = []
        self.lock = threading.Condition()
        threading.Thread(target=self._loop, daemon=True).start()

    def submit(self, prompt: str, max_tokens: int) -> Request:
        request = Request(prompt, max(1, max_tokens))
        with self.lock:
            self.active.append(request)
            self.lock.notify()
        return request

    def drain(self) -> list[dict]:
        with self.lock:
            drained, self.stats = self.stats, []
        return drained

    def _loop(self) -> None:
        while True:
            with self.lock:
                while not self.active:
                    self.lock.wait()
                batch = list(self.active)
            k = self.draft_len(len(batch))
            ms = step_ms(len(batch), k)
            time.sleep(ms / 1000.0)
            accepted_total = 0
            for r in batch:
                a = accepted(r.produced, k)
                n = min(1 + a, r.max_tokens - r.produced)
                accepted_total += n - 1
                r.produced += n
                r.out.put(n)
                if r.produced >= r.max_tokens:
                    r.out.put(None)
            stat: dict = {
                "iterLatencyMS": ms,
                "numActiveRequests": len(batch),
                "inflightBatchingStats": {
                    "numScheduledRequests": len(batch),
                    "numContextRequests": 0,
                    "numGenRequests": len(batch),
                },
            }
            if k > 0:
                stat["specDecodingStats"] = {
                    "numDraftTokens": k * len(batch),
                    "numAcceptedTokens": accepted_total,
                    "numRequestsWithDraftTokens": len(batch),
                    "acceptanceLength": (accepted_total + len(batch)) / len(batch),
                    "iterLatencyMS": 0.0,
                }
            with self.lock:
                self.active = [r for r in self.active if r.produced < r.max_tokens]
                self.stats = [*self.stats[-(MAX_STATS - 1) :], stat]

"""Per-request sampling settings and the logits -> probabilities transform shared by p and q.

Exact speculative sampling needs the drafter's distribution q and the target's p to be processed
by the very same function (temperature, then top-k, then top-p, then suppressing stop tokens
before ``min_tokens``); both :mod:`spectool.engine.speculative` and the engine call
:func:`process_logits` for that reason. Temperature 0 means greedy: the distribution is the
one-hot of the arg-max, which is how greedy rows are verified without random draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from spectool.errors import BadInputError


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples; ``temperature == 0`` is greedy (top-p/top-k then ignored).

    ``top_k == 0`` keeps the whole vocabulary; ``seed`` makes the request's draws reproducible;
    ``max_tokens`` caps generated tokens; stop and end-of-sequence ids are suppressed until
    ``min_tokens`` tokens exist; ``ignore_eos`` keeps generating past end-of-sequence ids;
    ``stop_token_ids`` end the request like end-of-sequence ids (the stop token is emitted).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        where = "sampling params"
        if not self.temperature >= 0.0:
            raise BadInputError(where, f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise BadInputError(where, f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise BadInputError(where, f"top_k must be >= 0, got {self.top_k}")
        if self.max_tokens < 1:
            raise BadInputError(where, f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise BadInputError(
                where, f"min_tokens must be in 0..max_tokens, got {self.min_tokens}"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class RowSampling:
    """One batch row's sampling state for one step.

    ``suppress_before`` outputs from the row's next one carry ``suppress_ids`` at probability 0
    (stop/eos ids while fewer than ``min_tokens`` tokens exist).
    """

    params: SamplingParams
    generator: torch.Generator | None
    suppress_ids: tuple[int, ...] = ()
    suppress_before: int = 0

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    def shifted(self, steps: int) -> RowSampling:
        """The same row ``steps`` outputs later (for chain drafting)."""
        return RowSampling(
            self.params, self.generator, self.suppress_ids, self.suppress_before - steps
        )


def _suppress_mask(
    rows: Sequence[RowSampling], steps: int, vocab: int, device: torch.device
) -> Tensor | None:
    """Bool ``[B, T, V]``: True where a token is banned at that step, or None when nothing is."""
    if not any(r.suppress_ids and r.suppress_before > 0 for r in rows):
        return None
    mask = torch.zeros(len(rows), steps, vocab, dtype=torch.bool)
    for b, row in enumerate(rows):
        ids = [i for i in row.suppress_ids if 0 <= i < vocab]
        upto = min(row.suppress_before, steps)
        if ids and upto > 0:
            mask[b, :upto, ids] = True
    return mask.to(device)


def process_logits(logits: Tensor, rows: Sequence[RowSampling]) -> Tensor:
    """Probabilities ``[B, T, V]`` from logits ``[B, T, V]``, row ``b`` processed by ``rows[b]``.

    Sampled rows: softmax of ``logits / temperature`` restricted to the ``top_k`` largest and
    then to the smallest prefix (by descending probability) whose mass reaches ``top_p``, after
    suppressed tokens are removed. Greedy rows: one-hot of the arg-max after suppression.
    Computed in float32 (float64 when the logits are float64).
    """
    bsz, steps, vocab = logits.shape
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = logits.to(dtype)
    ban = _suppress_mask(rows, steps, vocab, logits.device)
    if ban is not None:
        x = x.masked_fill(ban, float("-inf"))
    greedy = torch.tensor([r.greedy for r in rows], device=logits.device)
    temps = torch.tensor([r.params.temperature if not r.greedy else 1.0 for r in rows], dtype=dtype)
    top_k = torch.tensor([r.params.top_k if r.params.top_k > 0 else vocab for r in rows])
    top_p = torch.tensor([r.params.top_p for r in rows], dtype=dtype)
    x = x / temps.to(x.device)[:, None, None]
    if bool((top_k < vocab).any()) or bool((top_p < 1.0).any()):
        sorted_x, order = x.sort(dim=-1, descending=True)  # [B, T, V]
        rank = torch.arange(vocab, device=x.device)
        keep = rank[None, None, :] < top_k.to(x.device)[:, None, None]
        sorted_x = sorted_x.masked_fill(~keep, float("-inf"))
        sorted_p = torch.softmax(sorted_x, dim=-1)
        mass_before = sorted_p.cumsum(dim=-1) - sorted_p
        keep = keep & (mass_before < top_p.to(x.device)[:, None, None])
        keep[..., 0] = True  # the most likely token always survives
        sorted_x = sorted_x.masked_fill(~keep, float("-inf"))
        x = torch.empty_like(x).scatter_(-1, order, sorted_x)
    probs = torch.softmax(x, dim=-1)
    if bool(greedy.any()):
        one_hot = torch.zeros_like(probs).scatter_(-1, x.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None, None], one_hot, probs)
    return probs


def argmax_tokens(logits: Tensor, rows: Sequence[RowSampling]) -> Tensor:
    """Greedy token ids ``[B, T]`` from logits ``[B, T, V]``, suppressed tokens excluded.

    Equal to the arg-max of :func:`process_logits` for greedy rows, without the softmax.
    """
    bsz, steps, vocab = logits.shape
    ban = _suppress_mask(rows, steps, vocab, logits.device)
    if ban is not None:
        logits = logits.masked_fill(ban, float("-inf"))
    return logits.argmax(dim=-1)


def sample(probs: Tensor, generator: torch.Generator | None) -> int:
    """One token id drawn from ``probs`` ``[V]`` with the request's generator."""
    return int(torch.multinomial(probs, 1, generator=generator))


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """A request's own generator on ``device``: seeded when asked, else from OS entropy."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def sample_rows(logits: Tensor, rows: Sequence[RowSampling]) -> list[int]:
    """One token per row from logits ``[B, 1, V]``: arg-max for greedy rows, else a sample."""
    if all(r.greedy for r in rows):
        return argmax_tokens(logits, rows)[:, 0].tolist()
    probs = process_logits(logits, rows)[:, 0]  # [B, V]
    return [
        int(probs[b].argmax()) if row.greedy else sample(probs[b], row.generator)
        for b, row in enumerate(rows)
    ]

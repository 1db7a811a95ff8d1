"""Preallocated key/value cache with one slot per running request and per-slot lengths.

Like gpt-fast's ``KVCache`` (buffers allocated once, written in place) but batched the way a
continuous-batching server needs: each request owns a slot (a batch row) from admission to
completion, writes land at that row's own positions, and rejecting drafted tokens only lowers the
slot's recorded length; nothing is copied or cleared. Stale entries past the length are harmless
because attention reads a key only up to the query's own position, and every position is written
again before any later query can see it.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """K and V buffers ``[n_layers, max_batch_size, n_kv_heads, max_seq_len, head_dim]``.

    ``lengths[slot]`` counts the valid tokens of a slot (positions ``0 .. length - 1``); it is
    bookkeeping kept on the host, moved by the caller with :meth:`set_length` after a forward and
    lowered by :meth:`rollback` when drafted tokens are rejected.
    """

    def __init__(
        self,
        n_layers: int,
        max_batch_size: int,
        n_kv_heads: int,
        max_seq_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (n_layers, max_batch_size, n_kv_heads, max_seq_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.lengths: list[int] = [0] * max_batch_size
        self._free: list[int] = list(range(max_batch_size - 1, -1, -1))  # pop() gives slot 0 first
        self._used: set[int] = set()

    # -- slots -------------------------------------------------------------------------------

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    @property
    def used_slots(self) -> frozenset[int]:
        return frozenset(self._used)

    def allocate(self) -> int:
        """Take a free slot for a joining request; its length starts at 0."""
        if not self._free:
            raise RuntimeError("KV cache has no free slot")
        slot = self._free.pop()
        self._used.add(slot)
        self.lengths[slot] = 0
        return slot

    def free(self, slot: int) -> None:
        """Give a leaving request's slot back; its buffers are reused as they are."""
        if slot not in self._used:
            raise RuntimeError(f"slot {slot} is not allocated")
        self._used.remove(slot)
        self.lengths[slot] = 0
        self._free.append(slot)

    def num_used_tokens(self) -> int:
        """Valid tokens held over all slots."""
        return sum(self.lengths[s] for s in self._used)

    # -- lengths -----------------------------------------------------------------------------

    def set_length(self, slot: int, length: int) -> None:
        """Record that positions ``0 .. length - 1`` of ``slot`` hold valid entries."""
        if not 0 <= length <= self.max_seq_len:
            raise ValueError(f"length {length} outside 0..{self.max_seq_len}")
        self.lengths[slot] = length

    def rollback(self, slot: int, length: int) -> None:
        """Forget entries at positions ``>= length`` (rejected drafts): a length change, no copy."""
        if length > self.lengths[slot]:
            raise ValueError(f"rollback to {length} above current length {self.lengths[slot]}")
        self.lengths[slot] = max(length, 0)

    # -- data --------------------------------------------------------------------------------

    def write(
        self,
        layer: int,
        slots: Tensor,  # [B] int64
        positions: Tensor,  # [B, T] int64, -1 = padding (skipped)
        k: Tensor,  # [B, Hkv, T, D]
        v: Tensor,  # [B, Hkv, T, D]
    ) -> None:
        """Store each row's new keys/values at its own positions in its own slot."""
        valid = positions >= 0  # [B, T]
        rows = slots[:, None].expand_as(positions)[valid]  # [N]
        cols = positions[valid]  # [N]
        self.k[layer, rows, :, cols] = k.transpose(1, 2)[valid]  # [N, Hkv, D]
        self.v[layer, rows, :, cols] = v.transpose(1, 2)[valid]

    def read(self, layer: int, slots: Tensor, length: int) -> tuple[Tensor, Tensor]:
        """Keys and values ``[B, Hkv, length, D]`` of the given slots, positions ``0 .. length-1``."""
        return self.k[layer, slots, :, :length], self.v[layer, slots, :, :length]

"""KV-cache slots and rollback: rejected entries never reach later steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch  # noqa: TID253 (engine tests use torch throughout)

from spectool.engine import kv_cache
from spectool.engine.kv_cache import KVCache
from spectool.engine.load import load_model
from spectool.engine.model import pack_rows


def test_slots_are_allocated_and_freed() -> None:
    cache = KVCache(n_layers=1, max_batch_size=2, n_kv_heads=1, max_seq_len=8, head_dim=2)
    assert [cache.allocate(), cache.allocate()] == [0, 1]
    assert cache.num_free_slots == 0
    with pytest.raises(RuntimeError, match="no free slot"):
        cache.allocate()
    cache.set_length(0, 5)
    cache.free(0)
    assert cache.lengths[0] == 0
    assert cache.num_free_slots == 1
    with pytest.raises(RuntimeError, match="not allocated"):
        cache.free(0)
    assert cache.allocate() == 0
    assert cache.used_slots == frozenset({0, 1})


def test_rollback_only_moves_the_length() -> None:
    cache = KVCache(n_layers=1, max_batch_size=1, n_kv_heads=1, max_seq_len=8, head_dim=2)
    slot = cache.allocate()
    k = torch.arange(8.0).view(1, 1, 4, 2)  # [B, Hkv, T, D]
    cache.write(0, torch.tensor([slot]), torch.arange(4)[None], k, -k)
    cache.set_length(slot, 4)
    before = cache.k.data_ptr()
    cache.rollback(slot, 2)
    assert cache.lengths[slot] == 2
    assert cache.k.data_ptr() == before
    assert torch.equal(cache.k[0, slot, 0, :4], k[0, 0])  # nothing copied or cleared
    with pytest.raises(ValueError, match="above current length"):
        cache.rollback(slot, 3)


def test_padding_positions_are_not_written() -> None:
    cache = KVCache(n_layers=1, max_batch_size=2, n_kv_heads=1, max_seq_len=4, head_dim=1)
    k = torch.ones(2, 1, 2, 1)
    cache.write(0, torch.tensor([1, 0]), torch.tensor([[0, 1], [2, -1]]), k, k)
    assert cache.k[0, 1, 0, :, 0].tolist() == [1, 1, 0, 0]
    assert cache.k[0, 0, 0, :, 0].tolist() == [0, 0, 1, 0]


def test_rejected_drafts_do_not_leak(target_dir: Path) -> None:
    """Write a prefix plus three drafts, roll back, continue: same as never having drafted."""
    model = load_model(target_dir, max_seq_len=32)
    prefix = torch.tensor([[5, 9, 14, 2, 33, 40]])
    drafts = torch.tensor([[61, 62, 63]])
    real = torch.tensor([[7, 8]])
    slot = torch.tensor([1])
    with torch.no_grad():
        dirty = model.new_cache(max_batch_size=2, max_seq_len=32)
        model(prefix, torch.arange(6)[None], dirty, slot)
        model(drafts, torch.arange(6, 9)[None], dirty, slot)
        dirty.set_length(1, 9)
        dirty.rollback(1, 6)
        got = model(real, torch.arange(6, 8)[None], dirty, slot)

        clean = model.new_cache(max_batch_size=2, max_seq_len=32)
        model(prefix, torch.arange(6)[None], clean, slot)
        want = model(real, torch.arange(6, 8)[None], clean, slot)
    assert torch.allclose(got, want, atol=1e-6, rtol=0)
    assert torch.allclose(dirty.k[:, 1, :, :8], clean.k[:, 1, :, :8], atol=1e-6, rtol=0)
    assert torch.allclose(dirty.v[:, 1, :, :8], clean.v[:, 1, :, :8], atol=1e-6, rtol=0)
    # The third rejected draft still sits at position 8, never read: the rollback copied nothing.
    assert dirty.k[:, 1, :, 8].abs().sum() > 0
    assert clean.k[:, 1, :, 8].abs().sum() == 0


def _ragged_batch_logits(model: torch.nn.Module, slots: list[int], spread_factor: int) -> Any:
    """Fill six slots with prompts of different lengths, then run one decode step and one
    verify pass (3 tokens, padded rows) over ``slots`` in that order."""
    cache = model.new_cache(max_batch_size=8, max_seq_len=40)
    lengths = {slot: 5 + 3 * slot for slot in range(6)}
    with torch.no_grad():
        for slot, n in lengths.items():
            model(
                torch.arange(1, n + 1)[None] % 50,
                torch.arange(n)[None],
                cache,
                torch.tensor([slot]),
            )
        kv_cache.SPREAD_FACTOR = spread_factor
        try:
            starts = [lengths[s] for s in slots]
            decode = model(
                torch.tensor([[7 + s] for s in slots]),
                torch.tensor([[n] for n in starts]),
                cache,
                torch.tensor(slots),
            )
            rows = [[11, 12, 13][: 1 + i % 3] for i in range(len(slots))]
            tokens, positions = pack_rows(rows, [n + 1 for n in starts])
            verify = model(tokens, positions, cache, torch.tensor(slots))
            plan = cache.plan(torch.tensor(slots), positions, max(starts) + 4)
        finally:
            kv_cache.SPREAD_FACTOR = 2
    return decode, verify, plan


def test_scattered_slots_attend_over_their_range_exactly(target_dir: Path) -> None:
    """Slots that are not consecutive (requests left the batch, or rows out of slot order) are
    read as views of their range instead of copies; the logits are bitwise those of the gathered
    copies, for decode steps (positions differ per row, so a mask) and padded verify passes."""
    model = load_model(target_dir, max_seq_len=40)
    for slots in ([4, 0, 2, 5], [1, 3], [5, 4, 3, 2, 1, 0]):
        fast = _ragged_batch_logits(model, slots, spread_factor=2)
        slow = _ragged_batch_logits(model, slots, spread_factor=0)
        assert fast[2].spread is not None and slow[2].spread is None
        assert fast[2].keys is not None and fast[2].keys.shape[1] == max(slots) - min(slots) + 1
        assert torch.equal(fast[0], slow[0]), slots
        assert torch.equal(fast[1], slow[1]), slots
    # Slots spread over more than twice the batch's rows are still gathered.
    assert _ragged_batch_logits(model, [0, 5], spread_factor=2)[2].spread is None

"""The proposer seam: the engine runs any registered proposer, knowing no method by name."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from torch import Tensor

from spectool.engine import proposers
from spectool.engine.engine import METHODS, Engine, EngineConfig, SamplingParams
from spectool.engine.proposers.base import ProposerContext, ProposerSpec
from spectool.engine.sampling import RowSampling
from spectool.errors import ConfigError


class Oracle:
    """Drafts the continuation it was told (``text``), and logs every call the engine makes."""

    hidden_layers = (0,)
    text: list[int] = []

    def __init__(self, ctx: ProposerContext) -> None:
        self.max_seq_len = ctx.max_seq_len
        self.calls: list[tuple] = []

    def allocate(self, slot: int) -> None:
        self.calls.append(("allocate", slot))

    def release(self, slot: int) -> None:
        self.calls.append(("release", slot))

    def prefill(
        self, slots: Sequence[int], prompts: Sequence[Sequence[int]], hidden: Tensor | None
    ) -> None:
        assert hidden is not None
        self.calls.append(("prefill", tuple(slots), tuple(hidden.shape)))

    def propose(
        self,
        slots: Sequence[int],
        contexts: Sequence[Sequence[int]],
        budgets: Sequence[int],
        rows: Sequence[RowSampling],
    ) -> tuple[list[list[int]], Tensor | None]:
        self.calls.append(("propose", tuple(slots), tuple(budgets)))
        return [
            self.text[len(ctx) : len(ctx) + k] for ctx, k in zip(contexts, budgets, strict=True)
        ], None

    def commit(self, slot: int, num_valid: int, hidden: Tensor | None) -> None:
        assert hidden is not None
        self.calls.append(("commit", slot, num_valid, tuple(hidden.shape)))


def test_a_registered_proposer_runs_without_engine_changes(
    target_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(
        proposers.PROPOSERS, "oracle", ProposerSpec("oracle", Oracle, needs_checkpoint=False)
    )
    prompt = [5, 6, 7, 8]
    params = SamplingParams(max_tokens=9, ignore_eos=True)
    want = Engine(target_dir, config=EngineConfig(method="none")).generate([prompt], params)
    Oracle.text = [*prompt, *want[0][:5], 0, 0, 0, 0]  # right, then wrong from the 6th token
    engine = Engine(target_dir, config=EngineConfig(method="oracle", max_draft_len=3))
    assert engine.generate([prompt], params) == want
    calls = engine._proposer.calls  # type: ignore[union-attr]
    assert calls[0] == ("allocate", 0) and calls[-1] == ("release", 0)
    assert calls[1] == ("prefill", (0,), (1, 4, 32))  # layer 0's output at every prompt position
    commits = [c for c in calls if c[0] == "commit"]
    # The features handed over cover exactly the kept positions: the verified last token and
    # the accepted drafts (num_valid - tokens before the step + 1 rows).
    before = len(prompt) + 1  # prompt + the prefill's token
    for _, _, num_valid, shape in commits:
        assert shape == (num_valid - before + 1, 32)
        before = num_valid + 1
    assert any(shape[0] > 1 for *_, shape in commits)  # some drafts were accepted
    assert any(shape[0] == 1 for *_, shape in commits)  # and some rejected
    with pytest.raises(ConfigError, match="method must be one of"):
        EngineConfig(method="nonesuch")
    assert "oracle" not in METHODS  # the import-time name; validation reads the live registry

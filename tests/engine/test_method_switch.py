"""One engine holding several methods' drafters, switched in place while idle (what lets tune
measure the methods' cells together on one server): lossless at every method and k, each
method's drafter idle while another drafts, refused while busy or for a method not loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectool.engine.engine import Engine, EngineConfig
from spectool.errors import BadInputError, ConfigError

from .test_engine import GREEDY, MIX, _solo_outputs


def test_switching_methods_in_place_is_lossless_and_idles_the_others(
    target_dir: Path, close_drafter_dir: Path
) -> None:
    engine = Engine(
        target_dir,
        close_drafter_dir,
        EngineConfig(method="draft_model", max_draft_len=3),
        alternatives={"ngram": None},
    )
    plain = _solo_outputs(Engine(target_dir, config=EngineConfig(method="none")))
    assert engine.methods == ("draft_model", "ngram") and engine.method == "draft_model"
    drafted: dict[str, int] = {}
    for method, k in (("ngram", 2), ("draft_model", 3), ("ngram", 0), ("draft_model", 1)):
        engine.set_method(method)
        engine.set_draft_len(k)
        assert engine.method == method
        engine.drain_stats()
        assert _solo_outputs(engine) == plain
        stats = [s for s in engine.drain_stats() if s.num_decoded_requests]
        assert {s.draft_len for s in stats} == {k}
        drafted[f"{method}{k}"] = sum(s.num_draft_tokens for s in stats)
        # the draft model's cache holds nothing once its requests are done, and nothing at all
        # while another method drafts
        assert not engine._proposers["draft_model"].cache.used_slots  # type: ignore[attr-defined]
    assert drafted["ngram0"] == 0 and drafted["draft_model3"] > 0 and drafted["draft_model1"] > 0


def test_a_method_switch_is_refused_while_busy_or_when_not_loaded(
    target_dir: Path, drafter_dir: Path
) -> None:
    engine = Engine(
        target_dir,
        drafter_dir,
        EngineConfig(method="draft_model", max_draft_len=2),
        alternatives={"ngram": None},
    )
    with pytest.raises(BadInputError, match="'eagle3' is not loaded"):
        engine.set_method("eagle3")
    engine.add_request(MIX[0][0], GREEDY)
    with pytest.raises(BadInputError, match="requests run"):
        engine.set_method("ngram")
    while engine.has_work():
        engine.step()
    engine.set_method("ngram")
    with pytest.raises(BadInputError, match="'none' cannot be an alternative"):
        Engine(target_dir, config=EngineConfig(method="none"), alternatives={"ngram": None})
    with pytest.raises(ConfigError, match="needs a drafter checkpoint"):
        Engine(
            target_dir,
            config=EngineConfig(method="ngram", max_draft_len=2),
            alternatives={"draft_model": None},
        )

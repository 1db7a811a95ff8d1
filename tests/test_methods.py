"""The method table (spectool.methods) against everything that used to list methods itself."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spectool import compat, methods
from spectool.ckpt import inspect
from spectool.errors import ProfileError
from spectool.trtllm import releases


def test_drafter_kinds_are_the_ones_inspect_reads() -> None:
    assert (methods.CAUSAL_LM, methods.EAGLE1, methods.EAGLE3, methods.MEDUSA) == (
        inspect.CAUSAL_LM,
        inspect.EAGLE1,
        inspect.EAGLE3,
        inspect.MEDUSA,
    )
    assert set(methods.METHOD_FOR_KIND) <= set(inspect.KIND_LABELS)


def test_torch_methods_are_the_embedded_engines() -> None:
    """Holds now and once the engine adds a proposer (its entry gains "torch" here)."""
    from spectool.engine import engine

    assert set(methods.engine_methods("torch", baseline=True)) == set(engine.METHODS)


def test_table_shape() -> None:
    assert methods.METHODS == ("eagle3", "eagle", "draft_model", "mtp", "ngram", "medusa")
    assert methods.METHODS_WITHOUT_DRAFTER == {"mtp", "ngram"}
    assert methods.DRAFTER_GEOMETRY_METHODS == {"draft_model", "eagle", "eagle3"}
    assert dict(methods.METHOD_FOR_KIND) == {
        "eagle3": "eagle3",
        "eagle1": "eagle",
        "causal_lm": "draft_model",
        "medusa": "medusa",
    }
    assert methods.engine_methods("trtllm") == methods.METHODS
    assert methods.engine_methods("torch") == ("eagle3", "draft_model", "mtp", "ngram")
    for name in methods.METHODS:
        m = methods.get(name)
        assert m.engines and m.label and m.verifies and m.speculates
        # a drafter-less method drafts from the target or the text, never from a head
        assert m.takes_drafter == bool(m.needs - {"native_mtp_layers", "target_hidden_states"})
    assert not methods.get("none").speculates and not methods.is_method("none")
    with pytest.raises(KeyError):
        methods.engine_methods("vllm")


def test_every_method_with_a_drafter_has_pair_rules() -> None:
    with_drafter = {m for m in methods.METHODS if methods.get(m).takes_drafter}
    assert set(compat.PAIR_RULES) == with_drafter


def test_trtllm_releases_draw_from_the_table() -> None:
    assert releases.METHODS is methods.METHODS
    for release in releases.RELEASES:
        info = releases.release_info(release)
        named = {m for m, _ in info.methods} | {m for m, _ in info.refusals}
        assert named <= set(methods.METHODS), release
        # every method is either written or refused on each backend the release has
        for backend in info.backends:
            for name in methods.METHODS:
                assert (name, backend) in info.methods or info.unsupported_reason(name, backend)


def test_recipes_validate_their_method_against_the_table(tmp_path) -> None:
    from spectool.profiles import load_recipe_table

    (tmp_path / "x.yaml").write_text(
        "name: x\ntarget: o/t\ndrafter: o/d\nmethod: lookahead\nmax_draft_len: 2\n"
        "notes: n\nsource: https://example.com\n"
    )
    with pytest.raises(ProfileError, match="unknown method 'lookahead'"):
        load_recipe_table(tmp_path)


def test_drafter_memory_follows_the_table(make_ckpt) -> None:
    from spectool.memory import drafter_footprint

    target = inspect.inspect_folder(make_ckpt("meta-llama/Llama-3.1-8B-Instruct"), "t")
    drafter = inspect.inspect_folder(make_ckpt("meta-llama/Llama-3.2-1B-Instruct"), "d")
    assert drafter_footprint(target, drafter, "ngram", 1) == (0, 0)
    assert drafter_footprint(target, None, "none", 1) == (0, 0)
    weights, kv = drafter_footprint(target, drafter, "draft_model", 1)
    assert weights == drafter.weight_bytes and kv > 0
    assert drafter_footprint(target, drafter, "medusa", 1)[1] == 0  # Medusa keeps no KV cache


def test_methods_module_imports_nothing_heavy() -> None:
    code = (
        "import sys, spectool.methods\n"
        "heavy = {'torch', 'pydantic', 'numpy', 'transformers', 'yaml'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_recipe_alternatives_validate_their_method_too(tmp_path) -> None:
    from spectool.profiles import load_recipe_table

    (tmp_path / "y.yaml").write_text(
        "name: y\ntarget: o/t\ndrafter: o/d\nmethod: draft_model\nmax_draft_len: 2\n"
        "notes: n\nsource: https://example.com\nalternatives:\n  - method: lookahead\n"
    )
    with pytest.raises(ProfileError, match="alternatives.0.method.*unknown method 'lookahead'"):
        load_recipe_table(tmp_path)


def test_serving_cost_orders_the_drafters_cheapest_first() -> None:
    from spectool.methods import serving_cost_rank

    assert serving_cost_rank("ngram") < serving_cost_rank("mtp") < serving_cost_rank("eagle3")
    assert (
        serving_cost_rank("eagle3") == serving_cost_rank("eagle") < serving_cost_rank("draft_model")
    )

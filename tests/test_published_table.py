"""The table of published speculative-decoding measurements (tests/data/published/).

These are facts about the data: the schema every row must follow (so a step-cost model can be
evaluated against it), that every key resolves, and the coverage the issue asked for (sizes,
a concurrency series, negative rows, chain and tree, several engines/methods/GPUs).
"""

from __future__ import annotations

import csv
import re
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from spectool.profiles import load_gpu_table

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "published"
GPU_FOLDER = REPO / "profiles" / "gpus"

COLUMNS = [
    "row_id", "source_id", "source_url", "source_locator", "model", "drafter", "method",
    "drafting", "draft_len", "engine", "gpu", "num_gpus", "tp", "precision", "concurrency",
    "load_kind", "dataset", "temperature", "input_len", "output_len", "acceptance_length",
    "baseline_value", "spec_value", "value_unit", "speedup", "notes",
]  # fmt: skip
METHODS = {"eagle3", "eagle", "eagle2", "draft_model", "mtp", "ngram", "medusa"}
NO_DRAFTER = {"mtp", "ngram"}
DRAFTINGS = {"chain", "tree"}
ENGINES = {"trtllm", "vllm", "sglang", "hf", "other"}
PRECISIONS = {"bf16", "fp16", "fp8", "fp4"}
LOAD_KINDS = {"batch", "closed-set", "concurrency", "qps"}
REQUIRED_TEXT = ["row_id", "source_id", "source_url", "source_locator", "model", "method",
                 "drafting", "engine", "gpu", "precision", "load_kind", "dataset", "value_unit",
                 "notes"]  # fmt: skip
MODEL_FIELDS = {
    "hf_repo": str, "kind": str, "params_b": float, "active_params_b": float,
    "num_hidden_layers": int, "hidden_size": int, "intermediate_size": int,
    "num_attention_heads": int, "num_key_value_heads": int, "head_dim": int, "vocab_size": int,
    "tie_word_embeddings": bool, "source": str, "geometry_status": str,
}  # fmt: skip
MOE_FIELDS = ("num_experts", "experts_per_token", "moe_intermediate_size", "shared_experts",
              "first_k_dense_layers")  # fmt: skip
MLA_FIELDS = ("kv_lora_rank", "qk_rope_head_dim")
URL = re.compile(r"^https?://\S+$")


def _rows() -> list[dict[str, str]]:
    with (DATA / "results.csv").open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _models() -> dict[str, dict[str, object]]:
    data = yaml.safe_load((DATA / "models.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _num(value: str, kind: type = float) -> float | int | None:
    """'' -> None, else the number (int columns must hold whole numbers)."""
    if value == "":
        return None
    return int(value) if kind is int else float(value)


ROWS = _rows()
MODELS = _models()


def test_header_is_exactly_the_issue_columns_in_order() -> None:
    with (DATA / "results.csv").open(newline="", encoding="utf-8") as f:
        header = next(csv.reader(f))
    assert header == COLUMNS


@pytest.mark.parametrize("row", ROWS, ids=[r["row_id"] for r in ROWS])
def test_row_schema(row: dict[str, str]) -> None:
    assert None not in row, "a row has more fields than the header"
    for col in REQUIRED_TEXT:
        assert row[col].strip(), f"{col} is empty"
    assert URL.match(row["source_url"]), row["source_url"]
    assert row["method"] in METHODS
    assert row["drafting"] in DRAFTINGS
    assert row["engine"] in ENGINES
    assert row["precision"] in PRECISIONS
    assert row["load_kind"] in LOAD_KINDS
    if row["method"] in NO_DRAFTER:
        assert row["drafter"] == "", "mtp/ngram rows name no drafter"
    else:
        assert row["drafter"], "model-based methods name their drafter"
    # Integers where present; num_gpus/tp always present and consistent.
    num_gpus, tp = _num(row["num_gpus"], int), _num(row["tp"], int)
    assert num_gpus is not None and tp is not None and 1 <= tp <= num_gpus
    for col in ("draft_len", "concurrency", "input_len", "output_len"):
        value = _num(row[col], int)
        assert value is None or value >= 1, f"{col}={value}"
    # Speed-up is always there; the measured pair, when given, agrees with it (1 %).
    speedup = _num(row["speedup"])
    assert speedup is not None and 0.1 < speedup < 10
    base, spec = _num(row["baseline_value"]), _num(row["spec_value"])
    assert (base is None) == (spec is None), "baseline and spec values come in pairs"
    if base is not None and spec is not None:
        assert base > 0 and spec > 0
        ratio = (
            base / spec
            if "latency" in row["value_unit"] or "ms/" in row["value_unit"]
            else spec / base
        )
        assert ratio == pytest.approx(speedup, rel=0.01), "speedup disagrees with the values"
    # Acceptance length includes the bonus token, so it is >= 1 and <= draft_len + 1 for chains.
    al = _num(row["acceptance_length"])
    if al is not None:
        assert al >= 1.0
        draft_len = _num(row["draft_len"], int)
        if row["drafting"] == "chain" and draft_len is not None:
            assert al <= draft_len + 1 + 1e-9
    temperature = _num(row["temperature"])
    assert temperature is None or 0 <= temperature <= 2
    # Every derived or converted number says so.
    if base is not None:
        assert "derived" in row["notes"] or "as published" in row["notes"]


def test_row_ids_unique_and_sources_documented() -> None:
    ids = [r["row_id"] for r in ROWS]
    assert len(ids) == len(set(ids))
    sources_md = (DATA / "SOURCES.md").read_text(encoding="utf-8")
    for source_id in {r["source_id"] for r in ROWS}:
        assert f"## {source_id}" in sources_md, f"{source_id} has no SOURCES.md entry"
    urls = defaultdict(set)
    for r in ROWS:
        urls[r["source_id"]].add(r["source_url"])
    assert all(len(u) == 1 for u in urls.values()), "one URL per source_id"


def test_every_model_and_drafter_key_exists_with_geometry() -> None:
    used = {r["model"] for r in ROWS} | {r["drafter"] for r in ROWS if r["drafter"]}
    assert used <= set(MODELS), sorted(used - set(MODELS))
    for key, entry in MODELS.items():
        assert isinstance(entry, dict), key
        for field, kind in MODEL_FIELDS.items():
            assert field in entry, f"{key}: {field} missing"
            value = entry[field]
            if kind is float:
                assert isinstance(value, int | float) and not isinstance(value, bool) and value > 0
            elif kind is int:
                assert isinstance(value, int) and not isinstance(value, bool) and value > 0, key
            else:
                assert isinstance(value, kind), f"{key}: {field}"
        assert entry["active_params_b"] <= entry["params_b"]
        assert entry["geometry_status"] in {"read", "assumed"}
        if entry["geometry_status"] == "assumed":
            assert entry["kind"] != "dense" and entry["kind"] != "moe", f"{key}: targets are read"
        if entry["kind"] == "moe":
            for field in MOE_FIELDS:
                assert isinstance(entry.get(field), int), f"{key}: {field}"
            assert entry["experts_per_token"] <= entry["num_experts"]
        if entry.get("attention") == "mla":
            for field in MLA_FIELDS:
                assert isinstance(entry.get(field), int), f"{key}: {field}"
        if entry["kind"] == "eagle3_head":
            assert 0 < entry["draft_vocab_size"] <= entry["vocab_size"]
    # Targets and drafters share a vocabulary (the table only holds lossless same-vocab pairs).
    for r in ROWS:
        if r["drafter"]:
            assert MODELS[r["drafter"]]["vocab_size"] == MODELS[r["model"]]["vocab_size"]
    mtp_models = {r["model"] for r in ROWS if r["method"] == "mtp"}
    assert all(MODELS[m].get("num_nextn_predict_layers", 0) >= 1 for m in mtp_models)


def _dense_params(m: dict) -> float:
    h, hd = m["hidden_size"], m["head_dim"]
    attn = h * m["num_attention_heads"] * hd * 2 + 2 * h * m["num_key_value_heads"] * hd
    embed = m["vocab_size"] * h * (1 if m["tie_word_embeddings"] else 2)
    mlp = m.get("mlp_matrices", 3)  # gated (SwiGLU) unless the entry says otherwise
    return embed + m["num_hidden_layers"] * (attn + mlp * h * m["intermediate_size"])


def _moe_params(m: dict, experts: int) -> float:
    h, hd = m["hidden_size"], m["head_dim"]
    attn = h * m["num_attention_heads"] * hd * 2 + 2 * h * m["num_key_value_heads"] * hd
    per_expert = 3 * h * m["moe_intermediate_size"]
    layer = attn + (experts + m["shared_experts"]) * per_expert + h * m["num_experts"]
    return 2 * m["vocab_size"] * h + m["num_hidden_layers"] * layer


def _mla_params(m: dict, experts: int) -> float:
    h, heads = m["hidden_size"], m["num_attention_heads"]
    nope, rope, v = m["qk_nope_head_dim"], m["qk_rope_head_dim"], m["v_head_dim"]
    q_rank, kv_rank = m["q_lora_rank"], m["kv_lora_rank"]
    attn = (h * q_rank + q_rank * heads * (nope + rope) + h * (kv_rank + rope)
            + kv_rank * heads * (nope + v) + heads * v * h)  # fmt: skip
    dense, moe = m["first_k_dense_layers"], m["num_hidden_layers"] - m["first_k_dense_layers"]
    per_expert = 3 * h * m["moe_intermediate_size"]
    moe_layer = (experts + m["shared_experts"]) * per_expert + h * m["num_experts"]
    return (2 * m["vocab_size"] * h + m["num_hidden_layers"] * attn
            + dense * 3 * h * m["intermediate_size"] + moe * moe_layer)  # fmt: skip


GQA_KEYS = [k for k, v in MODELS.items() if v["kind"] in ("dense", "moe") and "attention" not in v]
MLA_KEYS = [k for k, v in MODELS.items() if v.get("attention") == "mla"]


@pytest.mark.parametrize("key", MLA_KEYS)
def test_mla_params_agree_with_geometry(key: str) -> None:
    m = MODELS[key]
    assert _mla_params(m, m["num_experts"]) / 1e9 == pytest.approx(m["params_b"], rel=0.02)
    assert _mla_params(m, m["experts_per_token"]) / 1e9 == pytest.approx(
        m["active_params_b"], rel=0.03
    )
    assert m["head_dim"] == m["qk_nope_head_dim"] + m["qk_rope_head_dim"]


@pytest.mark.parametrize("key", GQA_KEYS)
def test_params_agree_with_geometry(key: str) -> None:
    """Catches a typo in a geometry field: the stated size must follow from it."""
    m = MODELS[key]
    if m["kind"] == "dense":
        assert _dense_params(m) / 1e9 == pytest.approx(m["params_b"], rel=0.02)
    else:
        assert _moe_params(m, m["num_experts"]) / 1e9 == pytest.approx(m["params_b"], rel=0.02)
        assert _moe_params(m, m["experts_per_token"]) / 1e9 == pytest.approx(
            m["active_params_b"], rel=0.03
        )


def test_every_gpu_has_a_profile_that_loads() -> None:
    table = load_gpu_table(GPU_FOLDER)
    assert {r["gpu"] for r in ROWS} <= set(table)


def test_coverage_required_by_the_issue() -> None:
    assert len(ROWS) >= 30
    assert len({r["source_id"] for r in ROWS}) >= 5
    series = defaultdict(set)
    for r in ROWS:
        if r["concurrency"]:
            setup = (r["source_id"], r["model"], r["drafter"], r["method"], r["drafting"],
                     r["draft_len"], r["engine"], r["gpu"], r["tp"], r["load_kind"])  # fmt: skip
            series[setup].add(int(r["concurrency"]))
    assert max(len(c) for c in series.values()) >= 3, "a series over >= 3 concurrencies"
    assert any(float(r["speedup"]) < 1 for r in ROWS), "negative cases"
    assert {r["drafting"] for r in ROWS} == DRAFTINGS
    assert {"eagle3", "draft_model", "mtp", "ngram"} <= {r["method"] for r in ROWS}
    assert {"trtllm", "vllm", "sglang"} <= {r["engine"] for r in ROWS}
    assert len({r["gpu"] for r in ROWS}) >= 3

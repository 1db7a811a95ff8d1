"""The runtime-gate table: which gates each release honours per method and drafter path."""

from __future__ import annotations

import pytest

from spectool.errors import ConfigError
from spectool.trtllm.gates import gate_support, gate_table, two_model_key
from spectool.trtllm.releases import release_for_version

# (release, method label) -> (max_concurrency honoured, draft_len_schedule honoured)
EXPECTED = {
    ("1.0", "eagle3 one-model"): (False, False),
    ("1.0", "eagle3 two-model"): (False, False),
    ("1.0", "mtp"): (False, False),
    ("1.0", "draft_model"): (False, False),
    ("1.0", "ngram"): (False, False),
    ("1.1", "eagle3 one-model"): (False, False),
    ("1.1", "eagle3 two-model"): (True, False),
    ("1.1", "mtp"): (False, False),
    ("1.1", "draft_model"): (True, False),
    ("1.1", "ngram"): (True, False),
    ("1.2", "eagle3 one-model"): (False, False),
    ("1.2", "eagle3 two-model"): (True, True),
    ("1.2", "mtp"): (False, False),
    ("1.2", "draft_model"): (True, True),
    ("1.2", "ngram"): (True, True),
    ("main", "eagle3 one-model"): (True, True),
    ("main", "mtp"): (True, True),
    ("main", "draft_model"): (True, True),
    ("main", "ngram"): (True, True),
}


def test_table_matches_the_source_reading():
    got = {(r, m): (g.max_concurrency, g.draft_len_schedule) for r, m, g in gate_table()}
    assert got == EXPECTED


def test_inert_rows_say_why_and_cite_the_executor_check():
    row = gate_support("1.2", "eagle3")
    assert not row.effective and row.path == "one_model"
    assert "self.drafter is not None" in row.why and "#10860" in row.why
    assert "no runtime gate" in row.describe()


def test_main_vanilla_mtp_with_several_modules_ignores_the_gate():
    assert gate_support("main", "mtp", mtp_layers=1).effective
    assert not gate_support("main", "mtp", mtp_layers=3).effective


def test_two_model_exists_for_eagle3_up_to_1_2_only():
    assert two_model_key("1.2", "eagle3") == "eagle3_one_model"
    assert two_model_key("main", "eagle3") is None
    assert two_model_key("1.2", "mtp") is None
    with pytest.raises(ConfigError, match="no two-model path"):
        gate_support("main", "eagle3", two_model=True)


def test_tensorrt_backend_has_no_gate():
    assert not gate_support("1.2", "eagle", backend="tensorrt").effective


@pytest.mark.parametrize(
    ("version", "release"),
    [
        ("1.3.0rc0", "1.2"),
        ("1.3.0rc7", "1.2"),
        ("1.3.0rc14", "main"),
        ("1.3.0rc24", "main"),
        ("1.3.0", "main"),
        ("1.3.1", "main"),
        ("main", "main"),
    ],
)
def test_1_3_release_candidates_map_by_date(version, release):
    assert release_for_version(version) == release


@pytest.mark.parametrize("rc", [8, 10, 13])
def test_1_3_candidates_between_the_two_merges_are_refused(rc):
    with pytest.raises(ConfigError, match=r"#10860 \(2026-03-13.*#12905"):
        release_for_version(f"1.3.0rc{rc}")

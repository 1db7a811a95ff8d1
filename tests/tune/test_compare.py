"""tune over several methods: which requests a comparison makes, and the folders it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectool.errors import OutputExistsError
from spectool.tuning.compare import method_requests, resolve_all
from spectool.tuning.request import TuneRequest


def test_the_demo_profile_compares_its_three_methods(tmp_path: Path) -> None:
    requests = method_requests(TuneRequest(out=tmp_path / "run"))
    assert [r.method for r in requests] == ["auto", "eagle3", "ngram"]
    assert [r.out for r in requests] == [
        tmp_path / "run" / "draft_model",
        tmp_path / "run" / "eagle3",
        tmp_path / "run" / "ngram",
    ]
    assert requests[0].profile == "demo"
    assert requests[1].drafter == "spectool:demo-eagle3" and requests[2].drafter is None
    assert all(r.target == "spectool:demo-target" for r in requests[1:])


@pytest.mark.parametrize(
    "changes",
    [
        {"method": "draft_model"},
        {"target": "spectool:demo-target"},
        {"drafter": "spectool:demo-drafter"},
    ],
)
def test_a_named_pair_or_method_is_tuned_alone(tmp_path: Path, changes: dict) -> None:
    req = TuneRequest(out=tmp_path / "run", **changes)
    assert method_requests(req) == [req]


def test_earlier_results_are_refused_without_resume_or_force(tmp_path: Path) -> None:
    requests = method_requests(TuneRequest(out=tmp_path / "run", engine="torch"))
    (tmp_path / "run" / "eagle3").mkdir(parents=True)
    (tmp_path / "run" / "eagle3" / "trials.jsonl").write_text("{}\n")
    with pytest.raises(OutputExistsError, match="eagle3"):
        resolve_all(requests)


def test_an_off_cell_shows_its_prediction_only_when_nothing_was_measured_there() -> None:
    from spectool.decide.methods import MethodCell, MethodChoice
    from spectool.tuning.compare import comparison_cell

    cells = {
        "ngram": {
            1: MethodCell("ngram", 1, 4, 0.6, 0.5, 0.7, "pays"),
            2: MethodCell("ngram", 2, 0, 1.0, 1.0, 1.0, "off", predicted=0.66, measured=False),
            16: MethodCell("ngram", 16, 0, 1.0, 1.0, 1.0, "off", predicted=0.64, measured=True),
            32: MethodCell("ngram", 32, 0, 1.0, 1.0, 1.0, "off", predicted=1.2, measured=False),
        }
    }
    choice = MethodChoice(("ngram",), (1, 2, 16, 32), cells, {}, (), "ngram", ("ngram",), "")
    shown = [comparison_cell(choice, "ngram", c) for c in (1, 2, 16, 32)]
    assert shown == ["k=4 0.60", "pred 0.66", "off", "off"]

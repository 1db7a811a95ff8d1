"""tune over several methods: which requests a comparison makes, and the folders it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectool.errors import OutputExistsError
from spectool.tuning.compare import method_requests, resolve_all
from spectool.tuning.request import TuneRequest


def test_the_demo_profile_compares_its_four_methods(tmp_path: Path) -> None:
    requests = method_requests(TuneRequest(out=tmp_path / "run"))
    assert [r.method for r in requests] == ["auto", "eagle3", "mtp", "ngram"]
    assert [r.out for r in requests] == [
        tmp_path / "run" / "draft_model",
        tmp_path / "run" / "eagle3",
        tmp_path / "run" / "mtp",
        tmp_path / "run" / "ngram",
    ]
    assert requests[0].profile == "demo"
    assert requests[1].drafter == "spectool:demo-eagle3"
    assert requests[2].drafter is None and requests[3].drafter is None
    assert all(r.target == "spectool:demo-target-mtp" for r in requests[1:])


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


def _fake_outcome(top: Path, method: str, schedule: dict[int, int], pngs: tuple[str, ...]):
    """What comparison_markdown reads of a method's run, its folder holding ``pngs``."""
    from types import SimpleNamespace

    out = top / method
    out.mkdir(parents=True)
    for name in pngs:
        (out / name).write_bytes(b"\x89PNG")
    (out / "report.md").write_text("# detail\n")
    target = SimpleNamespace(ref="spectool:demo-target")
    result = SimpleNamespace(
        engine="torch", schedule=schedule, measured_now=[1, 2], reused=[], notes=()
    )
    resolved = SimpleNamespace(method=method, report=SimpleNamespace(target=target))
    return SimpleNamespace(resolved=resolved, result=result, out=out, wall_s=12.0)


def test_the_top_report_has_the_decision_the_comparison_and_the_figures(tmp_path: Path) -> None:
    import re

    from spectool.decide.methods import MethodCell, MethodChoice, MethodScore
    from spectool.tuning.compare import comparison_markdown
    from spectool.tuning.setup import PLOT_NAMES

    outcomes = [
        _fake_outcome(tmp_path, "draft_model", {1: 2}, PLOT_NAMES),
        _fake_outcome(tmp_path, "eagle3", {1: 4, 8: 2}, PLOT_NAMES),
        _fake_outcome(tmp_path, "ngram", {}, ()),  # no figures drawn for this one
    ]
    methods = ("draft_model", "eagle3", "ngram")
    cells = {m: {c: MethodCell(m, c, 0, 1.0, 1.0, 1.0, "off") for c in (1, 8)} for m in methods}
    cells["eagle3"][1] = MethodCell("eagle3", 1, 4, 0.5, 0.45, 0.55, "pays")
    scores = tuple(MethodScore(m, 0.7 if m == "eagle3" else 1.0, 0.0, ()) for m in methods)
    choice = MethodChoice(
        methods, (1, 8), cells, {1: "eagle3", 8: "none"}, scores, "eagle3", ("eagle3",), "best"
    )
    text = comparison_markdown(outcomes, choice)
    # the decision comes before the comparison, with the deployed schedule
    assert text.index("**Deployed: eagle3**") < text.index("| concurrency |")
    assert "{1: 4, 8: 2}" in text.split("| concurrency |")[0]
    # the figures: every PNG drawn, linked relative to the top folder, the deployed method's first
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert images == [f"{m}/{name}" for m in ("eagle3", "draft_model") for name in PLOT_NAMES]
    assert all((tmp_path / image).is_file() for image in images)
    # and the per-method detail is linked
    links = re.findall(r"(?<!!)\[[^\]]*\]\(([^)]+\.md)\)", text)
    assert {"draft_model/report.md", "eagle3/report.md", "ngram/report.md"} <= set(links)
    assert all((tmp_path / link).is_file() for link in links)

"""Where a comparison's measuring time went: blocks read back from the methods' trials files,
a baseline block saved under several arms' labels counted once."""

from __future__ import annotations

import json
from pathlib import Path

from spectool.decide.latency import RequestRecord
from spectool.measure.trial import TrialConfig, TrialResult
from spectool.tuning.setup import TRIALS_NAME
from spectool.tuning.time_spent import BASELINE, time_markdown, time_spent


def _block(label: str, c: int, n: int, wall: float, started: str) -> str:
    records = tuple(
        RequestRecord(f"r{i}", "chat", 0.0, 0.1, (0.1, 0.2), (1, 1), 0.2, 10, 2) for i in range(n)
    )
    trial = TrialResult(
        config=TrialConfig(label=label, concurrency=c, num_prompts=n),
        records=records,
        token_count_sources=("usage",) * n,
        iteration_stats=(),
        raw_iteration_stats=(),
        wall_time_s=wall,
        started_at=started,
    )
    return json.dumps(trial.to_json()) + "\n"


def _write(folder: Path, lines: list[str]) -> Path:
    folder.mkdir(parents=True)
    (folder / TRIALS_NAME).write_text("".join(lines))
    return folder


def test_a_shared_baseline_block_counts_once_and_each_arm_has_its_own_seconds(
    tmp_path: Path,
) -> None:
    # one joint round at concurrency 4: the baseline block saved under both arms' labels
    base = "2026-12-05T19:00:00+00:00"
    dm = _write(
        tmp_path / "draft_model",
        [
            _block("torch none k=0 #0 setup=a", 1, 16, 2.0, "2026-12-05T18:59:00+00:00"),
            _block("torch none k=0 #p0/k2 setup=a", 4, 32, 3.0, base),
            _block("torch draft_model k=2 #p0 setup=a", 4, 32, 2.5, "2026-12-05T19:00:03+00:00"),
        ],
    )
    ng = _write(
        tmp_path / "ngram",
        [
            _block("torch none k=0 #p0/k3 setup=b", 4, 32, 3.0, base),
            _block("torch ngram k=3 #p0 setup=b", 4, 32, 4.0, "2026-12-05T19:00:06+00:00"),
            "not json: skipped\n",
        ],
    )
    spent = time_spent({"draft_model": dm, "ngram": ng, "eagle3": tmp_path / "missing"})
    assert spent.seconds == {
        (1, BASELINE): 2.0,
        (4, BASELINE): 3.0,
        (4, "draft_model"): 2.5,
        (4, "ngram"): 4.0,
    }
    assert spent.blocks[(4, BASELINE)] == 1
    assert spent.requests == {1: 16, 4: 32}
    assert spent.total_s == 11.5 and spent.at(4) == 9.5 and spent.of(BASELINE) == 5.0
    table = time_markdown(spent, ["draft_model", "ngram"])
    assert "| 4 | 32 | 3 (1) | 2 (1) | 4 (1) | 10 | 83% |" in table
    assert table[-1] == "| all | | 5 | 2 | 4 | 12 | 100% |"
    assert time_markdown(time_spent({}), ["draft_model"]) == []


def test_the_comparison_report_shows_each_methods_blocks_not_its_search_time(
    tmp_path: Path,
) -> None:
    from spectool.decide.methods import MethodCell, MethodChoice, MethodScore
    from spectool.tuning.compare import comparison_markdown
    from tests.tune.test_compare import _fake_outcome

    outcomes = [_fake_outcome(tmp_path, m, {}, ()) for m in ("draft_model", "ngram")]
    (outcomes[0].out / TRIALS_NAME).write_text(
        _block("torch none k=0 #p0/k2 setup=a", 4, 32, 3.0, "t0")
        + _block("torch draft_model k=2 #p0 setup=a", 4, 32, 40.0, "t1")
    )
    methods = ("draft_model", "ngram")
    cells = {m: {4: MethodCell(m, 4, 0, 1.0, 1.0, 1.0, "off")} for m in methods}
    scores = tuple(MethodScore(m, 1.0, 0.0, ()) for m in methods)
    choice = MethodChoice(methods, (4,), cells, {4: "none"}, scores, "ngram", methods, "tie")
    spent = time_spent({o.resolved.method: o.out for o in outcomes})
    text = comparison_markdown(outcomes, choice, spent=spent)
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    # the methods table: draft_model's 40 s of blocks, not its outcome's 12 s; ngram measured none
    assert rows["| draft_model"].split(" | ")[6] == "40"
    assert rows["| ngram"].split(" | ")[6] == "–"
    assert "## Time" in text and "43 s of measured blocks" in text

"""tune --objective goodput end to end on the embedded engine: the cells are decided on goodput
within the SLO, computed from the client's records of the blocks tune saved.

The decision logic on known latencies is in tests/decide/test_goodput.py; here a real run's
saved blocks are read back and the decision's pair ratios must be the goodput ones (and not the
mean TPOT's, which the same blocks also give).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from spectool.cli.app import main
from spectool.decide.paired import BlockPair, PairedCell, paired_estimate
from spectool.measure.trial import TrialResult, load_trials
from spectool.tuning.pairing import prompt_bag, strata_of
from spectool.tuning.trials import pooled_cell


def test_goodput_decides_the_cells_from_the_saved_blocks(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [
        "tune",
        "spectool:demo-target",
        "spectool:demo-drafter",
        "--engine",
        "torch",
        "--max-draft-len",
        "1",
        "--concurrency",
        "1",
        "--num-prompts",
        "8",
        "--max-tokens",
        "8",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--budget",
        "1",
        "--objective",
        "goodput",
        "--slo",
        "tpot:40ms",
        "--out",
        str(out),
        "--json",
    ]
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(args) == 0
    summary = json.loads(buffer.getvalue())
    tune = json.loads((out / "tune.json").read_text())
    assert tune["search"]["objective"] == "goodput:tpot:40ms"
    (cell,) = [c for c in summary["decision"]["cells"] if c["k"] == 1]
    spec: dict[int, TrialResult] = {}
    base: dict[int, TrialResult] = {}
    for trial in load_trials(out / "trials.jsonl").values():
        label = trial.config.label
        if m := re.search(r"draft_model k=1 #p(\d+) ", label):
            spec[int(m.group(1))] = trial
        elif m := re.search(r"none k=0 #p(\d+)/k1 ", label):
            base[int(m.group(1))] = trial
    n = cell["pairs"]
    assert n >= 4 and set(range(n)) <= set(spec) & set(base)
    pairs = tuple(
        BlockPair(
            pooled_cell([spec[i]], 1, level=1), pooled_cell([base[i]], 0, level=1), i % 2 == 0
        )
        for i in range(n)
    )
    looks, search = cell["looks"], tune["search"]
    good = paired_estimate(
        PairedCell(
            pairs,
            looks=looks,
            objective="goodput:tpot:40ms",
            rest_looks=cell["rest_looks"],
            strata=strata_of([prompt_bag(spec[i]) for i in range(n)]),
        ),
        confidence=search["confidence"],
        seed=search["seed"],
    )
    tpot = paired_estimate(PairedCell(pairs, objective="tpot"))
    assert good.source == "goodput:tpot:40ms"
    assert cell["pair_ratios"] == pytest.approx(good.to_json()["pair_ratios"])
    assert cell["ratio"] == pytest.approx(good.ratio)
    # the same blocks' mean TPOT is another figure: wall time per good request includes the
    # prefill and the HTTP round trip, which speculation does not shorten
    assert tpot.ratio < good.ratio
    assert (cell["verdict"], cell["ci_low"]) == (good.verdict, pytest.approx(good.ci_low))

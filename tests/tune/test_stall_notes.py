"""The note for cells where users and the decode steps disagree by over 10% (recorded data)."""

from __future__ import annotations

from pathlib import Path

from spectool.decide.cost import evaluate_cell
from spectool.decide.stats import cell_stats, stall_notes
from spectool.measure.grids import read_grids

DEMO_GRIDS = Path(__file__).parents[1] / "decide" / "data" / "demo_grids_n8.json.gz"


def test_stall_note_where_prefills_eat_the_gain() -> None:
    """Demo pair, 32-token outputs: at concurrency 16 k=8 halves the cost of a decode step per
    token, yet users' TPOT improves by about a tenth (newcomers' prefills stall decoding); at
    concurrency 1 both agree."""
    grids, _, _ = read_grids(DEMO_GRIDS)
    grid = grids[0]
    keys = [(1, 0), (1, 8), (16, 0), (16, 8)]
    stats = {key: cell_stats(grid[key], n_boot=200) for key in keys}
    verdicts = [evaluate_cell(grid[(c, 8)], grid[(c, 0)], n_boot=200) for c in (1, 16)]
    assert verdicts[1].ratio < 0.7
    notes = stall_notes({1: 8, 16: 8}, verdicts, stats)
    assert notes[-1].startswith("concurrency 16, k=8: decode steps cost 0.")
    assert "prefills of arriving requests" in notes[-1]
    # at concurrency 1 these grids (recorded before the first token was streamed on its own,
    # so TTFT held one decode step) disagree by about 13%: more than 10%, so noted too
    tpot_1 = stats[(1, 8)].ms_per_token.value / stats[(1, 0)].ms_per_token.value
    assert (len(notes) == 2) == (abs(tpot_1 / verdicts[0].ratio - 1) > 0.10)
    assert stall_notes({1: 8}, verdicts[:1], {**stats, (1, 8): stats[(1, 0)]}) != []
    assert stall_notes({1: 0, 16: 0}, verdicts, stats) == []

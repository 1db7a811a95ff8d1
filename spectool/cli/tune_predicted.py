"""``spectool tune --predict-only``'s run and output (:mod:`spectool.tuning.predicted`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spectool.tuning.request import TuneRequest


def predict_only(
    request: TuneRequest,
    acceptance_length: float | None,
    acceptance_rate: float | None,
    acceptance_from: Path | None,
    *,
    as_json: bool,
) -> None:
    """Resolve the pair as tune does (the check runs), predict, write, and say it is predicted."""
    from spectool.cli.output import console
    from spectool.cli.tune_output import schedule_in_words
    from spectool.predicted import AcceptanceFlags
    from spectool.tuning.predicted import LABEL, run_predict_only
    from spectool.tuning.request import resolve

    if request.resume:
        from spectool.errors import BadInputError

        raise BadInputError("--resume", "--predict-only measures nothing to resume")
    resolved = resolve(request)  # the recipe's own method; alternatives are not predicted
    flags = AcceptanceFlags(acceptance_length, acceptance_rate, acceptance_from)
    outcome = run_predict_only(resolved, flags, force=request.force)
    decision = outcome.decision
    if as_json:
        from spectool.cli.output import print_json

        print_json(
            {
                "decision": str(outcome.decision_path),
                "files": [str(p) for p in outcome.build_files],
                **decision,
            }
        )
        return
    pred = decision["prediction"]
    choices = {int(c): k for c, k in decision["schedule"].items()}
    where = pred["hardware"]
    if pred.get("layout"):
        from spectool.cli.output import layout_words

        where += f"; {layout_words(pred['layout'])}"
    console.print(
        f"[bold yellow]{LABEL}[/]: {decision['method']} on {decision['engine']} "
        f"({where}), nothing was measured"
    )
    console.print(f"acceptance: {pred['acceptance']}", markup=False)
    console.print(f"calibration: {pred['calibration']}", markup=False)
    console.print(f"geometry: {pred['geometry']}", markup=False)
    for line in pred["lines"]:
        console.print(f"  {line}", markup=False)
    console.print(f"schedule ({LABEL}): {schedule_in_words(choices)}", markup=False)
    for note in outcome.notes:
        console.print(f"note: {note}", markup=False, style="yellow")
    for path in dict.fromkeys((outcome.decision_path, *outcome.build_files)):
        console.print(f"wrote {path}")
    console.print(f"serve it: spectool serve {outcome.decision_path.parent}")

"""Garbage-collection pauses of the measuring client during a ``spectool tune`` run.

The load loop runs in tune's own process; a full collection there stops it mid-trial (see
:mod:`spectool.measure.runner`). This runs ``spectool tune`` in this process with a
``gc.callbacks`` hook and prints, per generation, how many collections ran and how long they
took (total, longest, and those of 20 ms or more), in all and while a trial's load loop ran.
``--no-freeze`` runs it as before 2026-12-05, with ``gc.freeze`` (called before each trial)
made a no-op.

    python benchmarks/client_pauses.py --out /tmp/cp -- --out /tmp/cp/tune
    python benchmarks/client_pauses.py --no-freeze --out /tmp/cp0 -- --out /tmp/cp0/tune

Everything after ``--`` is ``spectool tune``'s arguments. The pauses go to ``OUT/pauses.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LONG_MS = 20.0


def pauses_summary(pauses: list[tuple[int, float]]) -> dict[int, dict[str, float]]:
    """Per generation: collections, total and longest pause (ms), and pauses >= LONG_MS."""
    out: dict[int, dict[str, float]] = {}
    for gen in sorted({g for g, _ in pauses}):
        ms = [p for g, p in pauses if g == gen]
        out[gen] = {
            "collections": len(ms),
            "total_ms": sum(ms),
            "longest_ms": max(ms),
            "long": sum(p >= LONG_MS for p in ms),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, tune = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-freeze", action="store_true")
    args = parser.parse_args(ours)
    from spectool.cli.app import main as spectool_main

    if args.no_freeze:
        gc.freeze = lambda: None  # type: ignore[assignment]
    import spectool.measure.runner as runner

    pauses: list[tuple[int, float]] = []
    inside: list[tuple[int, float]] = []  # the pauses while a trial's load loop ran
    started: dict[str, float] = {}
    trials = {"running": 0}
    run_trial = runner.run_trial

    async def timed_trial(*a, **k):  # noqa: ANN002, ANN003, ANN202
        trials["running"] += 1
        try:
            return await run_trial(*a, **k)
        finally:
            trials["running"] -= 1

    runner.run_trial = timed_trial  # type: ignore[assignment]

    def hook(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            pause = (info["generation"], (time.perf_counter() - started.pop("t")) * 1e3)
            pauses.append(pause)
            if trials["running"]:
                inside.append(pause)

    gc.callbacks.append(hook)
    try:
        rc = spectool_main(["tune", *tune])
    finally:
        gc.callbacks.remove(hook)
        runner.run_trial = run_trial  # type: ignore[assignment]
    summary = pauses_summary(pauses)
    summary_inside = pauses_summary(inside)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pauses.json").write_text(
        json.dumps(
            {
                "freeze": not args.no_freeze,
                "pauses": pauses,
                "summary": summary,
                "during_trials": summary_inside,
            }
        )
    )
    for label, table in (("in all", summary), ("during trials", summary_inside)):
        for gen, s in table.items():
            print(
                f"{label}: generation {gen}: {s['collections']:.0f} collections, "
                f"{s['total_ms']:.0f} ms, longest {s['longest_ms']:.1f} ms, "
                f"{s['long']:.0f} of {LONG_MS:.0f} ms or more"
            )
    return rc


if __name__ == "__main__":
    raise SystemExit(main())

"""The deployment tune chose, served next to its baseline: what the rate levels
(:mod:`spectool.tuning.rates`) and the capacity search (:mod:`spectool.tuning.capacity`) drive.

One embedded-engine server holds the target and the chosen method's drafter. Its speculative arm
is the deployment itself: the chosen ``draft_len_schedule`` applied at each step's batch size, as
``spectool serve`` and TensorRT-LLM apply it (:meth:`~spectool.tuning.torch_driver.TorchDriver.
serve_deployed`); its baseline arm is the same server with speculation off, switched in place.
Blocks are saved in ``FOLDER/trials.jsonl`` (a fresh run starts that file anew; ``--resume``
reads it, so only what is missing is measured).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectool.errors import BadInputError
from spectool.measure.trial import TrialConfig, TrialResult, load_trials

if TYPE_CHECKING:
    from spectool.tuning.request import ResolvedTune
    from spectool.tuning.session import TuneProgress


class Deployed:
    """The deployment and its baseline on one server (see the module docstring)."""

    def __init__(
        self,
        resolved: ResolvedTune,
        schedule: Mapping[int, int],
        folder: Path,
        *,
        progress: TuneProgress | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        from spectool.tuning.plan import make_driver, measurement_plan
        from spectool.tuning.session import _CountingHooks

        self.resolved = resolved
        self.schedule = dict(schedule)
        self.count_tokens, self.prompts, _, self.plan = measurement_plan(resolved)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "trials.jsonl"
        if not resolved.request.resume:
            self.path.unlink(missing_ok=True)
        self.saved = load_trials(self.path) if self.path.is_file() else {}
        driver: Any = make_driver(resolved, folder)
        driver.draft_len_schedule = dict(schedule)
        driver.max_draft_len = schedule[min(schedule)]
        self.driver = driver
        self.hooks = _CountingHooks(progress, should_stop)

    @property
    def k(self) -> int:
        """The largest draft length the schedule uses (the speculative blocks' positions)."""
        return max(self.schedule.values())

    def block(self, config: TrialConfig, deployed: bool) -> TrialResult:
        """The block ``config`` on the deployment (else the baseline): saved, or measured now."""
        from spectool.measure.runner import measure
        from spectool.tuning.plan import METRICS_INTERVAL_S
        from spectool.tuning.resume import check_requests

        saved = self.saved.get(config.key())
        if saved is not None:
            return saved
        info = self.driver.serve_deployed() if deployed else self.driver.serve(0)
        trial = measure(
            info.base_url,
            info.model_name,
            self.prompts.prompts,
            [config],
            results_path=self.path,
            progress=self.hooks,
            count_tokens=self.count_tokens,
            metrics_interval_s=METRICS_INTERVAL_S,
            metrics_path=info.metrics_path,
            finished={},
        )[0]
        check_requests([trial], f"block {config.label!r}")
        return trial

    def __enter__(self) -> Deployed:
        self.driver.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.driver.__exit__(*exc)


def deployed_schedule(
    resolved: ResolvedTune, choices: Mapping[int, int], flag: str
) -> dict[int, int]:
    """The embedded engine's schedule for ``choices`` (batch size -> k, upper bounds); empty
    when speculation is off everywhere. ``flag``: the option that asked (for the refusal on
    TensorRT-LLM, whose server restarts per arm)."""
    from spectool.decide.model import schedule_from_choices

    if resolved.engine != "torch":
        raise BadInputError(
            flag,
            "runs on the embedded engine (--engine torch) for now: TensorRT-LLM restarts a "
            "server per arm, which open-loop pairs cannot bridge yet",
        )
    return schedule_from_choices(choices, "up_to")


def rebuild(resolved: ResolvedTune, out: Path) -> list[Path]:
    """The build in ``out`` written again for its ``decision.json`` (so the manifest records
    what was added to it); nothing when ``out`` holds no decision."""
    decision = out / "decision.json"
    if not decision.is_file():
        return []
    from spectool.tuning.deploy import build_for_decision

    decided = json.loads(decision.read_text(encoding="utf-8"))["max_draft_len"]
    return list(build_for_decision(resolved, decision, decided)[0])


def add_to_decision(out: Path, fields: Mapping[str, Any]) -> list[Path]:
    """``fields`` added to ``out/decision.json`` (atomically); nothing when there is none."""
    from spectool.io import atomic_write_text

    decision = out / "decision.json"
    if not decision.is_file():
        return []
    data = {**json.loads(decision.read_text(encoding="utf-8")), **fields}
    return [atomic_write_text(decision, json.dumps(data, indent=2) + "\n")]


def put_report_section(out: Path, lines: list[str]) -> list[Path]:
    """The section ``lines`` (its ``## `` heading first) in ``out/report.md``: in place of the
    one with that heading, up to the next ``## `` heading, else at the end; nothing when there
    is no report."""
    from spectool.io import atomic_write_text

    report = out / "report.md"
    if not report.is_file():
        return []
    text = report.read_text(encoding="utf-8")
    section = "\n".join(lines).rstrip("\n") + "\n"
    start = text.find(lines[0])
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(lines[0]))
        rest = "" if end < 0 else "\n" + text[end + 1 :]
        text = text[:start] + section + rest
    return [atomic_write_text(report, text)]

"""What a tune run measures (``setup.json``) and whether its output folder may be (re)used.

Why: ``--resume`` reuses the trials saved in ``DIR/trials.jsonl``, which is only honest when
they were measured on the same models, engine, server settings and workload. The setup records
exactly that; its :meth:`TuneSetup.fingerprint` goes into every trial's label, and a resumed run
whose setup differs is refused with the differing keys named. The searched grid
(concurrencies, ``--max-draft-len``) is not part of it: a resumed run may widen the search and
still reuse every cell it shares with the first one.

Folder rules (:func:`prepare_out_dir`): a folder holding results of an earlier run (a non-empty
``trials.jsonl`` or a ``tune.json``) is refused without ``--resume`` or ``--force``
(:class:`~spectool.errors.OutputExistsError`, exit 2). ``--force`` deletes the files tune
writes (and nothing else) and starts over.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import spectool
from spectool.constants import MAX_JSON_BYTES
from spectool.errors import BadInputError, OutputExistsError
from spectool.io import atomic_write_text

SETUP_FORMAT = "spectool.tune-setup/1"
SETUP_NAME = "setup.json"
TRIALS_NAME = "trials.jsonl"
TUNE_NAME = "tune.json"
DECISION_NAME = "decision.json"
REPORT_NAME = "report.md"
SERVER_LOG_NAME = "server.log"
PRIOR_NAME = "prior.json"
PLOT_NAMES = ("speedup_heatmap.png", "latency_vs_concurrency.png", "acceptance_per_position.png")
# Files tune writes into its folder; --force removes exactly these (build files are rewritten).
TUNE_FILES = (
    SETUP_NAME,
    TRIALS_NAME,
    TUNE_NAME,
    DECISION_NAME,
    REPORT_NAME,
    SERVER_LOG_NAME,
    PRIOR_NAME,
    *PLOT_NAMES,
)


@dataclass(frozen=True)
class TuneSetup:
    """Everything that decides what one trial measures, apart from its concurrency and ``k``.

    ``target``/``drafter``: the checkpoint records (reference, folder, sha256 of config.json).
    ``server``: engine settings (torch: device, dtype, threads, batch and sequence limits;
    trtllm: release, backend, GPU, TP). ``workload``: where the prompts came from and their
    content digest. ``max_tokens``/``num_prompts``/``repeats`` as asked. The spectool version
    is recorded too: a resumed run must not mix measurements of two versions.
    """

    engine: str
    method: str
    target: dict[str, Any]
    drafter: dict[str, Any] | None
    server: dict[str, Any]
    workload: dict[str, Any]
    max_tokens: int
    num_prompts: int
    repeats: int

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SETUP_FORMAT,
            "spectool_version": spectool.__version__,
            "engine": self.engine,
            "method": self.method,
            "target": self.target,
            "drafter": self.drafter,
            "server": self.server,
            "workload": self.workload,
            "max_tokens": self.max_tokens,
            "num_prompts": self.num_prompts,
            "repeats": self.repeats,
        }

    def fingerprint(self) -> str:
        """12 hex digits of sha256 over the canonical JSON of the setup."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def checkpoint_identity(ref: str, folder: Path) -> dict[str, Any]:
    """A checkpoint as the setup records it: reference, folder, sha256 of its config.json."""
    config = folder / "config.json"
    try:
        digest = hashlib.sha256(config.read_bytes()).hexdigest()
    except OSError as exc:
        raise BadInputError(config, f"cannot read: {exc.strerror or exc}") from None
    return {"ref": ref, "path": str(folder), "config_sha256": digest}


def has_results(out: Path) -> bool:
    """Whether ``out`` holds results of an earlier run (saved trials or a tune.json)."""
    trials = out / TRIALS_NAME
    return (trials.is_file() and trials.stat().st_size > 0) or (out / TUNE_NAME).is_file()


def read_setup(out: Path) -> dict[str, Any] | None:
    """The saved ``setup.json`` of ``out``; None when there is none."""
    path = out / SETUP_NAME
    if not path.is_file():
        return None
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise BadInputError(path, f"larger than {MAX_JSON_BYTES} bytes")
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadInputError(path, f"cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInputError(path, f"malformed JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != SETUP_FORMAT:
        raise BadInputError(path, f"not a {SETUP_FORMAT} file")
    return data


def _differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    keys = sorted(set(old) | set(new))
    found: list[str] = []
    for key in keys:
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            found.append(f"{prefix}{key} ({a!r} then, {b!r} now)")
    return found


def drop_unfinished_line(path: Path) -> bool:
    """Cut a results file back to its last complete line (a crash while appending leaves half a
    line, which the next append would glue to a new one). True when something was cut."""
    if not path.is_file():
        return False
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    keep = data[: data.rfind(b"\n") + 1]
    with open(path, "r+b") as f:
        f.truncate(len(keep))
    return True


def prepare_out_dir(out: Path, setup: TuneSetup, *, resume: bool, force: bool) -> None:
    """Check ``out`` against the folder rules (module docstring) and write ``setup.json``."""
    if resume and force:
        raise BadInputError("--resume", "--resume continues a run, --force starts over; pick one")
    if out.exists() and not out.is_dir():
        raise BadInputError(out, "is a file; choose another --out")
    if has_results(out):
        if resume:
            drop_unfinished_line(out / TRIALS_NAME)
            saved = read_setup(out)
            if saved is not None:
                diffs = _differences(saved, setup.to_json())
                if diffs:
                    raise BadInputError(
                        out,
                        "--resume needs the settings of the saved run; these differ: "
                        + "; ".join(diffs[:6])
                        + ("; ..." if len(diffs) > 6 else "")
                        + " (use --force to start over)",
                    )
        elif force:
            for name in TUNE_FILES:
                (out / name).unlink(missing_ok=True)
        else:
            raise OutputExistsError(
                out,
                "holds the results of an earlier tune; pass --resume to continue it or --force "
                "to start over",
            )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / SETUP_NAME, json.dumps(setup.to_json(), indent=2) + "\n")

"""The tune folder's rules: refuse results without --resume/--force, resume only the same setup."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from spectool.errors import BadInputError, OutputExistsError
from spectool.tuning.setup import (
    SETUP_NAME,
    TRIALS_NAME,
    TUNE_NAME,
    TuneSetup,
    has_results,
    prepare_out_dir,
)

SETUP = TuneSetup(
    engine="torch",
    method="draft_model",
    target={"ref": "t", "path": "/m/t", "config_sha256": "aa"},
    drafter={"ref": "d", "path": "/m/d", "config_sha256": "bb"},
    server={"device": "cpu", "threads": 1, "max_batch_size": 32, "max_seq_len": 1024},
    workload={"source": "builtin", "id": "sha256:0123"},
    max_tokens=32,
    num_prompts=16,
    repeats=1,
)


def _with_results(out: Path) -> None:
    prepare_out_dir(out, SETUP, resume=False, force=False)
    (out / TRIALS_NAME).write_text('{"format": "spectool.trial/1"}\n')
    (out / TUNE_NAME).write_text("{}")


def test_fresh_folder_gets_the_setup(tmp_path: Path) -> None:
    out = tmp_path / "run"
    prepare_out_dir(out, SETUP, resume=False, force=False)
    assert json.loads((out / SETUP_NAME).read_text()) == SETUP.to_json()
    assert not has_results(out)
    prepare_out_dir(out, SETUP, resume=False, force=False)  # no results yet: reusable


def test_results_are_refused_without_resume_or_force(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _with_results(out)
    with pytest.raises(OutputExistsError, match="--resume"):
        prepare_out_dir(out, SETUP, resume=False, force=False)
    with pytest.raises(BadInputError, match="pick one"):
        prepare_out_dir(out, SETUP, resume=True, force=True)
    assert (out / TRIALS_NAME).is_file()


def test_resume_keeps_trials_of_the_same_setup(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _with_results(out)
    prepare_out_dir(out, SETUP, resume=True, force=False)
    assert (out / TRIALS_NAME).read_text().startswith('{"format"')


def test_resume_cuts_a_half_written_trial(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _with_results(out)
    whole = (out / TRIALS_NAME).read_text()
    with open(out / TRIALS_NAME, "a") as f:
        f.write('{"format": "spectool.tri')  # killed while appending
    prepare_out_dir(out, SETUP, resume=True, force=False)
    assert (out / TRIALS_NAME).read_text() == whole


def test_resume_refuses_another_setup_naming_what_differs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _with_results(out)
    other = dataclasses.replace(SETUP, max_tokens=64, server={**SETUP.server, "threads": 2})
    with pytest.raises(BadInputError, match=r"max_tokens .*server\.threads|server\.threads"):
        prepare_out_dir(out, other, resume=True, force=False)
    assert json.loads((out / SETUP_NAME).read_text()) == SETUP.to_json()


def test_force_removes_only_tune_files(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _with_results(out)
    (out / "notes.txt").write_text("mine")
    prepare_out_dir(out, SETUP, resume=False, force=True)
    assert not (out / TRIALS_NAME).exists()
    assert not (out / TUNE_NAME).exists()
    assert (out / "notes.txt").read_text() == "mine"


def test_a_file_is_not_a_folder(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(BadInputError, match="is a file"):
        prepare_out_dir(path, SETUP, resume=False, force=False)


def test_fingerprint_tracks_every_setting() -> None:
    prints = {
        SETUP.fingerprint(),
        dataclasses.replace(SETUP, max_tokens=33).fingerprint(),
        dataclasses.replace(SETUP, method="ngram").fingerprint(),
        dataclasses.replace(SETUP, server={**SETUP.server, "device": "cuda"}).fingerprint(),
        dataclasses.replace(SETUP, workload={"source": "x", "id": "y"}).fingerprint(),
    }
    assert len(prints) == 5
    assert SETUP.fingerprint() == dataclasses.replace(SETUP).fingerprint()

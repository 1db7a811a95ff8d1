"""Model references -> checkpoints: a local folder, ``spectool:NAME`` (a model shipped inside
spectool), or a Hugging Face repo id ``org/name[@revision]``. Profiles are expanded earlier,
by the command (a profile names both models and the method)."""

from __future__ import annotations

import os
from pathlib import Path

from spectool.builtin_models import BUILTIN_PREFIX
from spectool.ckpt.inspect import Checkpoint, inspect_folder
from spectool.errors import CheckpointError

__all__ = ["BUILTIN_PREFIX", "builtin_path", "resolve_checkpoint"]


def builtin_path(name: str) -> Path:
    """The checkpoint folder of a model shipped in ``spectool/assets/models/NAME`` (one shipped
    packed is assembled on first use: :mod:`spectool.builtin_models`)."""
    from spectool.builtin_models import builtin_path as folder_of

    return folder_of(name)


def resolve_checkpoint(ref: str) -> Checkpoint:
    """Read the checkpoint ``ref`` names (metadata and tensor headers only)."""
    from spectool.ckpt import hub

    if ref.startswith(BUILTIN_PREFIX):
        return inspect_folder(builtin_path(ref[len(BUILTIN_PREFIX) :]), ref)
    path = Path(os.path.expanduser(ref))
    try:
        exists = path.exists()
        if path.is_symlink() or exists:
            path = path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # symlink loops, permissions
        raise CheckpointError(
            ref, f"cannot resolve path ({exc.__class__.__name__}: {exc})"
        ) from None
    if exists:
        if not path.is_dir():
            raise CheckpointError(ref, "is a file; pass the checkpoint folder")
        if not os.access(path, os.R_OK | os.X_OK):
            raise CheckpointError(ref, "folder is not readable")
        return inspect_folder(path, ref)
    if hub.looks_like_repo_id(ref):
        folder, tensors, commit = hub.fetch_metadata(ref)
        return inspect_folder(folder, ref, tensors=tensors, revision=commit)
    if "/" in ref.rstrip("/") or ref.startswith((".", "~")):  # a path, never sent to the Hub
        parent = path.parent
        shown = parent not in (Path("."), Path.cwd()) and parent.is_dir()
        beside = f" ({parent} exists; is the name mistyped?)" if shown else ""
        raise CheckpointError(ref, f"no such folder{beside}")
    from spectool.profiles import list_profiles, normalize_name
    from spectool.suggest import suggestion

    hint = suggestion(ref, list_profiles(), key=normalize_name).replace("mean", "mean the profile")
    raise CheckpointError(
        ref, f"no such folder, and not a Hugging Face repo id (org/name) or profile{hint}"
    )

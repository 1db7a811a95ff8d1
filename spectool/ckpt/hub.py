"""Hugging Face references (``org/name[@revision]``): metadata only, never the weights.

config.json, generation_config.json and the tokenizer files come through
``hf_hub_download`` (honouring HF_HOME, HF_HUB_OFFLINE and HF_TOKEN); tensor tables come from
safetensors headers through huggingface_hub's metadata API (range requests), or for
``pytorch_model.bin`` heads from the zip directory and ``data.pkl`` alone, read with range
requests through ``HfFileSystem``. Fetched tensor tables are kept in spectool's cache, keyed by
commit, so a later offline run works.

Without a network the Hub is asked once: one probe of the endpoint with a short timeout
(``SPECTOOL_HUB_TIMEOUT`` seconds, default 3); when it fails, everything comes from the local
cache or ends in one line, instead of huggingface_hub's five logged retries (about 25 s).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

from spectool.ckpt.inspect import read_tensors
from spectool.ckpt.tensors import TensorInfo
from spectool.ckpt.torch_bin import read_torch_bin
from spectool.errors import HubError
from spectool.io import atomic_write_text

REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+(@[\w.\-/]+)?$")
METADATA_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "model.safetensors.index.json",
    "chat_template.jinja",
    "README.md",  # the model card: its base_model metadata (spectool.ckpt.card)
)


def looks_like_path(ref: str) -> bool:
    """Whether ``ref`` can only mean a local path: it starts with ``.``, ``/`` or ``~``, has other
    than one ``/`` before any ``@revision``, or its parent folder exists here (``nope/model``
    beside a folder ``nope``). Such a reference is never sent to the Hub."""
    repo = ref.split("@", 1)[0]
    if ref.startswith((".", "/", "~")) or "\\" in ref or repo.count("/") != 1:
        return True
    try:
        return Path(repo).parent.is_dir()
    except OSError:
        return True


def looks_like_repo_id(ref: str) -> bool:
    return bool(REPO_ID_RE.match(ref)) and not looks_like_path(ref)


def hub_timeout() -> float:
    try:
        return max(0.1, float(os.environ.get("SPECTOOL_HUB_TIMEOUT", "3")))
    except ValueError:
        return 3.0


# Endpoints found unreachable by this process (which then went offline).
_UNREACHABLE: set[str] = set()


@functools.cache
def hub_reachable() -> bool:
    """One request to the Hub's endpoint, one attempt, a short timeout: can it be reached?"""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=hub_timeout(), follow_redirects=False)
    except Exception:  # noqa: BLE001 - any transport failure (DNS, refused, timeout, TLS)
        return False
    return True


@contextlib.contextmanager
def _quiet_hub_logs() -> Iterator[None]:
    """huggingface_hub logs a warning per retry; spectool reports the outcome in one line."""
    from spectool.constants import DEBUG

    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    if not DEBUG:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def split_revision(ref: str) -> tuple[str, str | None]:
    repo, _, rev = ref.partition("@")
    return repo, rev or None


def cache_dir() -> Path:
    base = os.environ.get("SPECTOOL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "spectool"
    )
    return Path(base)


def _tensor_cache_path(repo_id: str, commit: str) -> Path:
    return cache_dir() / "tensors" / f"{repo_id.replace('/', '--')}--{commit}.json"


def fetch_metadata(ref: str) -> tuple[Path, dict[str, TensorInfo], str | None]:
    """(snapshot folder with the metadata files, tensor table, commit) for a hub reference."""
    with _quiet_hub_logs():
        return _fetch_metadata(ref)


def _fetch_metadata(ref: str) -> tuple[Path, dict[str, TensorInfo], str | None]:
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    repo_id, revision = split_revision(ref)
    if not constants.HF_HUB_OFFLINE and not hub_reachable():
        # The rest of this process runs as with HF_HUB_OFFLINE=1: huggingface_hub makes no
        # request at all (not even the ones it makes for its own user-agent string).
        constants.HF_HUB_OFFLINE = True
        _UNREACHABLE.add(constants.ENDPOINT)
    local_only = bool(constants.HF_HUB_OFFLINE)
    try:
        config_path = Path(
            hf_hub_download(repo_id, "config.json", revision=revision, local_files_only=local_only)
        )
    except Exception as exc:  # noqa: BLE001 - mapped to one line below
        raise _hub_error(ref, exc) from None
    folder = config_path.parent
    commit = folder.name if re.fullmatch(r"[0-9a-f]{40}", folder.name) else None
    for name in METADATA_FILES:
        try:
            hf_hub_download(repo_id, name, revision=revision, local_files_only=local_only)
        except EntryNotFoundError:
            continue
        except Exception as exc:  # noqa: BLE001 - optional files: offline and uncached is fine
            if local_only or _is_offline_error(exc):
                continue
            raise _hub_error(ref, exc) from None
    tensors = read_tensors(folder)  # weights already in the local cache (a full download)
    if tensors:
        return folder, tensors, commit
    cached = _tensor_cache_path(repo_id, commit) if commit else None
    if cached and cached.is_file():
        table = json.loads(cached.read_text())
        return folder, {n: TensorInfo(n, d, tuple(s), f) for n, (d, s, f) in table.items()}, commit
    if local_only:
        why = "the Hub is unreachable" if _UNREACHABLE else "offline (HF_HUB_OFFLINE=1)"
        raise HubError(
            ref,
            f"{why} and its tensor headers are not cached; run once online or pass a local folder",
        )
    tensors = _remote_tensors(ref, repo_id, revision)
    if cached:
        table = {n: [t.dtype, list(t.shape), t.file] for n, t in tensors.items()}
        atomic_write_text(cached, json.dumps(table))
    return folder, tensors, commit


def _remote_tensors(ref: str, repo_id: str, revision: str | None) -> dict[str, TensorInfo]:
    from huggingface_hub import HfApi, HfFileSystem
    from huggingface_hub.errors import NotASafetensorsRepoError

    api = HfApi()
    try:
        meta = api.get_safetensors_metadata(repo_id, revision=revision)
        return {
            name: TensorInfo(name, info.dtype, tuple(info.shape), file)
            for file, fmeta in meta.files_metadata.items()
            for name, info in fmeta.tensors.items()
        }
    except NotASafetensorsRepoError:
        pass
    except Exception as exc:  # noqa: BLE001
        raise _hub_error(ref, exc) from None
    try:
        files = api.list_repo_files(repo_id, revision=revision)
    except Exception as exc:  # noqa: BLE001
        raise _hub_error(ref, exc) from None
    candidates = [f for f in files if f.endswith((".bin", ".pt")) and "/" not in f]
    if not candidates:
        raise HubError(ref, "has neither safetensors nor pytorch_model.bin weights")
    fs = HfFileSystem()
    tensors: dict[str, TensorInfo] = {}
    rev = f"@{revision}" if revision else ""
    for name in sorted(candidates):
        try:
            with fs.open(f"{repo_id}{rev}/{name}", "rb", block_size=256 * 1024) as f:
                tensors.update(read_torch_bin(Path(name), fileobj=f))
        except HubError:
            raise
        except OSError as exc:
            raise _hub_error(ref, exc) from None
    return tensors


def _is_offline_error(exc: Exception) -> bool:
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    return isinstance(exc, LocalEntryNotFoundError | OfflineModeIsEnabled)


def _hub_error(ref: str, exc: Exception) -> HubError:
    """One line that covers both readings of ``ref``: a local folder, and a Hub repo."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo = split_revision(ref)[0]
    if isinstance(exc, GatedRepoError):
        return HubError(ref, "gated repository: accept its licence on the Hub and set HF_TOKEN")
    if isinstance(exc, RevisionNotFoundError):
        return HubError(ref, "revision not found on the Hub")
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(
            ref, f"no folder {ref}, and no repo {repo} on the Hub (or private: set HF_TOKEN)"
        )
    if _is_offline_error(exc):
        if not _UNREACHABLE:
            return HubError(
                ref,
                f"no folder {ref}, and repo {repo} is not in the local Hugging Face cache "
                "(offline: HF_HUB_OFFLINE=1); pass an existing folder or run once online",
            )
        return HubError(
            ref,
            f"no folder {ref}; the Hub ({constants.ENDPOINT}) is unreachable to look up repo "
            f"{repo}, and it is not in the local cache; pass an existing folder or run once online",
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return HubError(ref, f"cannot fetch metadata from the Hub: {first}")

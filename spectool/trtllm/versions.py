"""Which of spectool's TensorRT-LLM generations an installed version belongs to."""

from __future__ import annotations

import importlib.metadata
import re

from spectool.errors import ConfigError

_VERSION_RE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?([.\-+_]?[0-9A-Za-z.+\-_]*)\s*$")


def release_for_version(version: str) -> str:
    """Map an installed ``tensorrt_llm`` version string to the nearest known generation.

    Rule: a version belongs to the generation of its ``major.minor``; pre-releases and dev or post
    builds (``1.2.0rc6``, ``1.1.0.post1``) belong to the same generation, because the option set
    of a release line is fixed during its release candidates. Except 1.3's candidates, mapped by
    date (see ``_release_for_1_3_rc``): rc0-rc7 → ``1.2``, rc8-rc13 refused, rc14 on → ``main``.
    Anything else newer than 1.2 (``1.3.0``, ``1.4.0.dev2026``, 2.x) maps to ``main``, the newest
    source spectool has read. ``0.21.x`` maps
    to ``0.21``; 0.22–0.99 never shipped and map to ``1.0``, the next line. Versions older than
    0.21 are refused (:class:`ConfigError`).
    """
    if version.strip() == "main":
        return "main"
    match = _VERSION_RE.match(version)
    if not match:
        from spectool.suggest import suggestion
        from spectool.trtllm.options import RELEASES

        raise ConfigError(
            "tensorrt_llm version", f"cannot parse {version!r}{suggestion(version, RELEASES)}"
        )
    major, minor = int(match.group(1)), int(match.group(2))
    if (major, minor) < (0, 21):
        raise ConfigError(
            "tensorrt_llm version",
            f"{version} is older than 0.21, the oldest TensorRT-LLM spectool supports",
        )
    if major == 0:
        return "0.21" if minor == 21 else "1.0"
    if major == 1 and minor <= 2:
        return f"1.{minor}"
    if (major, minor) == (1, 3):
        rc = re.match(r"^\.?0\.?rc(\d+)", (match.group(3) or "") + match.group(4))
        if rc is not None:
            return _release_for_1_3_rc(version, int(rc.group(1)))
    return "main"


# 1.3 release candidates by date. v1.3.0rc7 was released 2026-03-10 (GitHub release page), three
# days before PR #10860 (one-model dynamic draft length, upper-bound schedule keys) merged on
# 2026-03-13; PR #12905 renamed acceptance_window/acceptance_length_threshold to
# acceptance_rate_window_size/acceptance_rate_threshold in April 2026; v1.3.0rc14 was the newest
# pre-release on 2026-05-18 (NGC image referenced that day). So rc0-rc7 have 1.2's rules, rc14 on
# have main's, and rc8-rc13 fall between the two merges in an order spectool cannot date.
_RC_AS_1_2_UP_TO = 7
_RC_AS_MAIN_FROM = 14


def _release_for_1_3_rc(version: str, rc: int) -> str:
    if rc <= _RC_AS_1_2_UP_TO:
        return "1.2"
    if rc >= _RC_AS_MAIN_FROM:
        return "main"
    raise ConfigError(
        "tensorrt_llm version",
        f"{version} was cut between PR #10860 (2026-03-13: one-model draft_len_schedule, keys "
        "become upper bounds) and PR #12905 (April 2026: acceptance_* fields renamed); spectool "
        "cannot tell which rules it has. Use 1.3.0rc14 or newer, 1.2.x, or pass --trtllm-version "
        "1.2 or main if you know which side it is on",
    )


def detect_installed_version() -> str | None:
    """The installed ``tensorrt_llm`` distribution version, or None when it is not installed."""
    for name in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None

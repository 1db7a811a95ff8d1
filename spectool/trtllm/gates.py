"""Which runtime gates TensorRT-LLM honours, per release, method and drafter path.

A *runtime gate* is ``speculative_config.max_concurrency`` (no speculation above this batch size)
or ``speculative_config.draft_len_schedule`` (draft length per batch size). Accepting a key is not
honouring it: TensorRT-LLM parses both on every method, but whether the executor acts on them
depends on how the method drafts. spectool's cost gate (``build``'s runtime gate, ``serve
--speculation auto``, ``check`` and ``tune``) relies on this table, never on the key alone.

Sources (all NVIDIA/TensorRT-LLM; [SRC] = read in the source, [PR] = pull-request text):

* 1.1 and 1.2: ``tensorrt_llm/_torch/pyexecutor/py_executor.py``
  ``_prepare_and_schedule_batch``: the gate is evaluated only inside ``if self.drafter is not
  None:`` (``self.drafter.should_use_spec_decode(...)``, in 1.2 also
  ``self.drafter.get_draft_len_for_batch_size``) [SRC, two generations of the file read through the
  code index: the 1.1-era one without ``draft_len_schedule``, the 1.2-era one with the
  lower-bound example ``{1:4, 4:2, 8:0}``]. ``max_concurrency`` itself lives on the drafter
  (``tensorrt_llm/_torch/speculative/drafter.py``: ``Drafter.__init__(max_concurrency=...)``) and
  the schedule arrived with PR #8194 ("Dynamic draft length in spec decode (stage 1)", merged
  2025-10, drafter only).
* ``tensorrt_llm/_torch/speculative/utils.py`` ``get_spec_drafter``: a drafter object exists only
  for ``is_draft_target()``, ``is_eagle3()`` (two-model), ``is_mtp_eagle()`` (two-model) and
  ``is_ngram()`` (plus user-provided) [SRC @ 011d0933dcb5e592f5fa2626beaf42a96324c578]. EAGLE-3
  defaults to one model (``eagle3_one_model: True`` in the 1.0, 1.1, 1.2 and main option tables,
  ``spectool/trtllm/schema/*.json``) and MTP drafts inside the target (``MTP`` /
  ``MTP_EAGLE_ONE_MODEL``), so on 1.1 and 1.2 both silently ignore the gate.
* main (and 1.3.0rc8 on): PR #10860 "Dynamic draft length on spec decode one-model path"
  (merged 2026-03-13) made the one-model EAGLE-3 path honour ``draft_len_schedule``
  (``SpeculativeDecodingMode.support_dynamic_draft_len`` returned ``is_eagle3_one_model()`` with a
  "TODO: expand to all one-model algorithms" [SRC interface.py, that generation]); PR #12262
  "Expand dynamic speculation to all spec decode algorithms" (opened 2026-03-17) extended it to
  MTP, MTP-Eagle, draft/target one-model, PARD, DFlash and SA. ``max_concurrency`` is translated
  to a schedule there (research notes, llm_args.py @0004396). Since then vanilla MTP with more
  than one MTP module opts out again ("MTP: max_concurrency is ignored for vanilla MTP ...",
  ``utils.update_spec_config_from_model_config`` [SRC @011d093]): a target with one MTP layer
  runs MTP-Eagle and honours it, a target with several does not.
* main: two-model EAGLE-3 (``eagle3_one_model: false``) is deprecated and ignored with a warning,
  later a ``ValueError`` (PR #18721, 2026-09), so spectool never writes it for main; DraftTarget
  defaults to one model there (PR #10671, 2026-02) and honours the gate through #12262.
* 0.21 and 1.0 have neither key (option tables) — nothing to honour.
* The legacy TensorRT backend has no runtime gate at all (PyTorch-only fields).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from spectool.errors import ConfigError
from spectool.trtllm.releases import RELEASES, check_method, release_info

GATE_KINDS = ("max_concurrency", "draft_len_schedule")
# The methods of the README table (eagle is eagle3 on the PyTorch backend).
TABLE_METHODS = ("eagle3", "mtp", "draft_model", "ngram")
DrafterPath = Literal["one_model", "two_model"]

# Releases whose option tables have eagle3_one_model and whose executor runs the two-model path.
_EAGLE3_TWO_MODEL = frozenset({"0.21", "1.0", "1.1", "1.2"})


@dataclass(frozen=True)
class GateSupport:
    """Which runtime gates one release honours for one method on one drafter path."""

    release: str
    method: str
    path: DrafterPath
    max_concurrency: bool
    draft_len_schedule: bool
    why: str

    @property
    def effective(self) -> bool:
        return self.max_concurrency or self.draft_len_schedule

    def honours(self, kind: str) -> bool:
        return {
            "max_concurrency": self.max_concurrency,
            "draft_len_schedule": self.draft_len_schedule,
        }.get(kind, False)

    def describe(self) -> str:
        honoured = [k for k in GATE_KINDS if self.honours(k)]
        what = " and ".join(honoured) if honoured else "no runtime gate"
        return (
            f"TensorRT-LLM {self.release}, {self.method} ({self.path.replace('_', '-')}): "
            f"{what} ({self.why})"
        )


def default_path(release: str, method: str) -> DrafterPath:
    """The drafter path TensorRT-LLM takes when the YAML does not ask for another one."""
    check_method(method)
    if method in ("draft_model", "ngram"):
        # ≤1.2 DraftTarget is two-model; NGram always has an NGramDrafter object. main's
        # DraftTarget defaults to one model (#10671) but is listed with the drafter methods: it
        # honours the gate on both paths there.
        return "one_model" if (method == "draft_model" and release == "main") else "two_model"
    return "one_model"  # eagle3/eagle (eagle3_one_model=True), mtp, medusa (in the engine)


def two_model_key(release: str, method: str) -> str | None:
    """The ``speculative_config`` key that selects the two-model path, None when unavailable."""
    if method in ("eagle3", "eagle") and release in _EAGLE3_TWO_MODEL:
        return "eagle3_one_model"
    return None


def gate_support(
    release: str,
    method: str,
    *,
    backend: str = "pytorch",
    two_model: bool = False,
    mtp_layers: int | None = None,
) -> GateSupport:
    """The row of the table for ``release`` x ``method`` (x two-model when asked).

    ``mtp_layers`` is the target's MTP layer count (main: vanilla MTP with several ignores the
    gate). ``two_model`` must name a path the release has (see :func:`two_model_key`).
    """
    info = release_info(release)
    check_method(method)
    path: DrafterPath = "two_model" if two_model else default_path(release, method)
    if (
        two_model
        and default_path(release, method) != "two_model"
        and not two_model_key(release, method)
    ):
        raise ConfigError(
            f"{method} two-model",
            f"TensorRT-LLM {release} has no two-model path for {method} "
            "(main ignores eagle3_one_model: false; PR #18721 makes it an error)",
        )

    def row(mc: bool, sched: bool, why: str) -> GateSupport:
        return GateSupport(release, method, path, mc, sched, why)

    has_mc, has_sched = info.has_max_concurrency, info.has_draft_len_schedule
    if backend != "pytorch":
        return row(False, False, "the TensorRT backend has no runtime gate")
    if not (has_mc or has_sched):
        return row(False, False, f"{release} has neither max_concurrency nor draft_len_schedule")
    if method == "medusa":
        return row(False, False, "Medusa runs on the TensorRT backend only")
    if release == "main":
        if method == "mtp" and mtp_layers is not None and mtp_layers > 1:
            return row(
                False,
                False,
                f"vanilla MTP with {mtp_layers} MTP modules opts out of dynamic draft length "
                "(utils.update_spec_config_from_model_config)",
            )
        if path == "one_model":
            return row(
                has_mc,
                has_sched,
                "one-model paths honour it since PR #10860 (EAGLE-3) and #12262 (MTP, "
                "draft/target)",
            )
        return row(has_mc, has_sched, "a drafter object evaluates it each step")
    if path == "two_model":
        return row(has_mc, has_sched, "py_executor evaluates it through the drafter object")
    return row(
        False,
        False,
        "one-model: py_executor checks the gate only when a separate drafter exists "
        "(`if self.drafter is not None`); one-model paths honour it from main/1.3.0rc8 on "
        "(PR #10860)",
    )


def gate_table() -> list[tuple[str, str, GateSupport]]:
    """Every (release, method label, support) row of the README table, releases 1.0 to main."""
    rows: list[tuple[str, str, GateSupport]] = []
    for release in RELEASES:
        if release == "0.21":
            continue
        for method in TABLE_METHODS:
            if method == "eagle3":
                rows.append((release, "eagle3 one-model", gate_support(release, "eagle3")))
                if two_model_key(release, "eagle3"):
                    rows.append(
                        (
                            release,
                            "eagle3 two-model",
                            gate_support(release, "eagle3", two_model=True),
                        )
                    )
                continue
            rows.append((release, method, gate_support(release, method)))
    return rows

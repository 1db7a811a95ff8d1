"""Write the extra LLM-API options (``speculative.yaml``) that ``trtllm-serve --config`` reads.

One function per file spectool writes: :func:`render_speculative_yaml` (a ``speculative_config``
for the method and release, plus iteration stats and memory limits) and
:func:`render_baseline_yaml` (the same limits, no speculation: the comparison run). Both return
YAML text (``yaml.safe_dump``) that has already passed :func:`validate_options` for the release.

Draft-length schedules: spectool's own form is **lower-bound thresholds starting at 1**, e.g.
``{1: 4, 4: 2, 8: 0}`` = batch 1-3 drafts 4, 4-7 drafts 2, 8 and more do not speculate; key 1
maps to ``max_draft_len``. It is written per release:

* 1.2: the same mapping (1.2's own semantics);
* main: upper bounds ``{3: 4, 7: 2}`` (main reads "batch ≤ key", off above the largest key); a
  last range that keeps speculating needs ``limits.max_batch_size`` to end at;
* 1.1 (``max_concurrency`` only): a single cut-off ``{1: D, N: 0}`` becomes
  ``max_concurrency: N-1``; anything finer is refused;
* 0.21, 1.0: refused (no runtime gate), unless the schedule is just ``{1: D}``.

CUDA graphs (PyTorch backend): when batch sizes are given or a schedule/``max_concurrency`` is
written, ``cuda_graph_config.batch_sizes`` (0.21: ``cuda_graph_batch_sizes``) lists the given
sizes, or powers of two up to ``max_batch_size`` (default cap 128, TensorRT-LLM's default), plus
every schedule key, so each draft-length change lands on a captured graph. Padding is switched
on with the list (``cuda_graph_config.enable_padding``, 0.21: ``cuda_graph_padding_enabled``):
``CudaGraphConfig.enable_padding`` defaults to False in 1.0-1.2 (option tables), so without it a
batch size missing from the list runs without a graph, and baseline and speculative configs must
get the same coverage to be compared fairly. Both renderers write the same graph keys.

Runtime gates are written only where the release honours them for the method's drafter path
(:mod:`spectool.trtllm.gates`); elsewhere rendering fails instead of writing an inert key.
``two_model=True`` selects EAGLE-3's two-model path (``eagle3_one_model: false``, 1.0-1.2).

Measuring (:func:`measuring_yaml`): ``tune`` serves a build's file with KV-cache block reuse
off. ``KvCacheConfig.enable_block_reuse`` defaults to True in every release spectool knows
(``tensorrt_llm/llmapi/llm_args.py``, ``KvCacheConfig``, 0.21 to main; the option tables in
``spectool/trtllm/schema/``), and tune sends the workload's prompts again in every block, so
from the second block on each prompt's full KV blocks would be found in the cache: no prefill,
where users' own traffic (new prompts) pays it, and a request's decode waits through the other
requests' prefills. The deployed files keep TensorRT-LLM's default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, PositiveInt

from spectool.errors import BadInputError, ConfigError
from spectool.trtllm.gates import GateSupport, gate_support, two_model_key
from spectool.trtllm.releases import ReleaseInfo, check_method, release_info
from spectool.trtllm.validate import validate_options

DEFAULT_CUDA_GRAPH_CAP = 128  # TensorRT-LLM's CUDA-graph max batch size when none is given


@dataclass(frozen=True)
class ServeLimits:
    """Memory and batch limits written into the YAML; None leaves TensorRT-LLM's default.

    ``free_gpu_memory_fraction`` is the share of free GPU memory (after weights) given to the KV
    cache, in (0, 1]; ``cuda_graph_batch_sizes`` the batch sizes to capture (PyTorch backend).
    """

    free_gpu_memory_fraction: float | None = None
    max_batch_size: int | None = None
    max_num_tokens: int | None = None
    cuda_graph_batch_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        f = self.free_gpu_memory_fraction
        if f is not None and not (isinstance(f, (int, float)) and 0 < f <= 1):
            raise ConfigError("free_gpu_memory_fraction", f"must be in (0, 1], got {f!r}")
        for name in ("max_batch_size", "max_num_tokens"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(name, f"must be a positive integer, got {v!r}")
        sizes = self.cuda_graph_batch_sizes
        if sizes is not None:
            if not sizes or any(
                isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes
            ):
                raise ConfigError(
                    "cuda_graph_batch_sizes", f"must be positive integers, got {sizes!r}"
                )
            if self.max_batch_size is not None and max(sizes) > self.max_batch_size:
                raise ConfigError(
                    "cuda_graph_batch_sizes",
                    f"{max(sizes)} exceeds max_batch_size {self.max_batch_size}",
                )


# ---- the options spectool writes (boundary models: a key spectool does not know is a bug) ----


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KvCacheOut(_Out):
    free_gpu_memory_fraction: float


class CudaGraphOut(_Out):
    batch_sizes: list[PositiveInt]
    enable_padding: bool | None = None
    mode: Literal["decode"] | None = None


class SpeculativeOut(_Out):
    decoding_type: str
    max_draft_len: PositiveInt | None = None
    num_nextn_predict_layers: PositiveInt | None = None
    prompt_lookup_num_tokens: PositiveInt | None = None
    max_matching_ngram_size: PositiveInt | None = None
    speculative_model: str | None = None
    speculative_model_dir: str | None = None
    pytorch_weights_path: str | None = None
    max_concurrency: PositiveInt | None = None
    draft_len_schedule: dict[PositiveInt, int] | None = None
    eagle3_one_model: bool | None = None


class LlmApiOptionsOut(_Out):
    speculative_config: SpeculativeOut | None = None
    enable_iter_perf_stats: bool | None = None
    disable_overlap_scheduler: bool | None = None
    max_batch_size: PositiveInt | None = None
    max_num_tokens: PositiveInt | None = None
    kv_cache_config: KvCacheOut | None = None
    cuda_graph_config: CudaGraphOut | None = None
    use_cuda_graph: bool | None = None
    cuda_graph_batch_sizes: list[PositiveInt] | None = None
    cuda_graph_padding_enabled: bool | None = None


# ---- schedules ---------------------------------------------------------------------------------


def normalize_schedule(schedule: Mapping[int, int], max_draft_len: int) -> list[tuple[int, int]]:
    """spectool's schedule as sorted ``(first batch size, draft len)`` ranges, equal runs merged.

    Raises :class:`ConfigError` unless keys are integers >= 1 including 1, lengths are integers in
    ``[0, max_draft_len]`` and key 1 maps to ``max_draft_len``.
    """
    items: list[tuple[int, int]] = []
    for batch, length in sorted(schedule.items()):
        for v in (batch, length):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError("draft_len_schedule", f"needs integer keys and values, got {v!r}")
        if batch < 1:
            raise ConfigError("draft_len_schedule", f"batch sizes start at 1, got {batch}")
        if not 0 <= length <= max_draft_len:
            raise ConfigError(
                f"draft_len_schedule[{batch}]", f"{length} is outside [0, {max_draft_len}]"
            )
        if not items or items[-1][1] != length:
            items.append((batch, length))
    if not items or items[0][0] != 1:
        raise ConfigError("draft_len_schedule", "must start at batch size 1 ({1: max_draft_len})")
    if items[0][1] != max_draft_len:
        raise ConfigError(
            "draft_len_schedule[1]", f"must equal max_draft_len {max_draft_len}, got {items[0][1]}"
        )
    return items


def schedule_to_upper_bounds(
    ranges: Sequence[tuple[int, int]], max_batch_size: int | None
) -> dict[int, int]:
    """main's form: key = last batch size of a range; speculation is off above the largest key."""
    out: dict[int, int] = {}
    for i, (start, length) in enumerate(ranges):
        if max_batch_size is not None and start > max_batch_size:
            break
        if i + 1 < len(ranges):
            end = ranges[i + 1][0] - 1
        elif length == 0:
            break
        elif max_batch_size is None:
            raise ConfigError(
                "draft_len_schedule",
                "TensorRT-LLM main turns speculation off above the largest key; give "
                "max_batch_size so the last range (speculating) can end there",
            )
        else:
            end = max_batch_size
        if max_batch_size is not None:
            end = min(end, max_batch_size)
        out[end] = length
    while out and out[max(out)] == 0:
        del out[max(out)]
    return out


def _runtime_gate(
    info: ReleaseInfo,
    backend: str,
    max_draft_len: int,
    schedule: Mapping[int, int] | None,
    max_concurrency: int | None,
    max_batch_size: int | None,
    support: GateSupport | None = None,
) -> dict[str, Any]:
    """``draft_len_schedule`` / ``max_concurrency`` entries for the release (may be empty).

    ``support`` (the gate table's row for the method) refuses a gate the release would ignore.
    """
    rel = f"TensorRT-LLM {info.release}"
    if schedule is not None and max_concurrency is not None:
        raise ConfigError(
            "draft_len_schedule", "give draft_len_schedule or max_concurrency, not both"
        )
    if max_concurrency is not None:
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int):
            raise ConfigError("max_concurrency", f"must be an integer, got {max_concurrency!r}")
        if max_concurrency < 1:
            raise ConfigError("max_concurrency", f"must be >= 1, got {max_concurrency}")
        schedule = {1: max_draft_len, max_concurrency + 1: 0}
    if schedule is None:
        return {}
    ranges = normalize_schedule(schedule, max_draft_len)
    if len(ranges) == 1:
        return {}  # {1: max_draft_len}: speculation always on, nothing to write
    if backend != "pytorch":
        raise ConfigError(
            "draft_len_schedule", f"runtime draft-length gates are PyTorch-only ({rel})"
        )
    if (
        support is not None
        and not support.effective
        and (info.has_max_concurrency or info.has_draft_len_schedule)
    ):
        raise ConfigError(
            "max_concurrency" if max_concurrency is not None else "draft_len_schedule",
            f"{rel} accepts the key but ignores it for {support.method} "
            f"({support.path.replace('_', '-')}): {support.why}",
        )
    if max_concurrency is not None and info.has_max_concurrency:
        return {"max_concurrency": max_concurrency}
    if info.has_draft_len_schedule:
        if info.schedule_rule == "smallest_key":
            return {"draft_len_schedule": schedule_to_upper_bounds(ranges, max_batch_size)}
        return {"draft_len_schedule": dict(ranges)}
    if info.has_max_concurrency:
        if len(ranges) == 2 and ranges[1][1] == 0:
            return {"max_concurrency": ranges[1][0] - 1}
        raise ConfigError(
            "draft_len_schedule",
            f"{rel} has no draft_len_schedule; only a cut-off {{1: D, N: 0}} can be written "
            "(as max_concurrency: N-1)",
        )
    raise ConfigError(
        "max_concurrency" if max_concurrency is not None else "draft_len_schedule",
        f"{rel} has neither draft_len_schedule nor max_concurrency; speculation stays on at "
        "every batch size",
    )


# ---- rendering ---------------------------------------------------------------------------------


def _graph_sizes(limits: ServeLimits, gate: Mapping[str, Any]) -> list[int] | None:
    keys: set[int] = set()
    if "draft_len_schedule" in gate:
        keys = set(gate["draft_len_schedule"])
    elif "max_concurrency" in gate:
        keys = {gate["max_concurrency"]}
    if limits.cuda_graph_batch_sizes is None and not keys:
        return None  # TensorRT-LLM's own default list, the same for baseline and speculative
    cap = limits.max_batch_size or DEFAULT_CUDA_GRAPH_CAP
    if limits.cuda_graph_batch_sizes is not None:
        base = set(limits.cuda_graph_batch_sizes)
    else:
        base = {1 << i for i in range(cap.bit_length()) if 1 << i <= cap} | {cap}
    return sorted(s for s in base | keys if s <= max(cap, max(base)))


def _common(
    info: ReleaseInfo, backend: str, limits: ServeLimits, gate: Mapping[str, Any]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if backend == "pytorch":
        out["enable_iter_perf_stats"] = True  # /metrics returns nothing without it [SRC]
    if limits.max_batch_size is not None:
        out["max_batch_size"] = limits.max_batch_size
    if limits.max_num_tokens is not None:
        out["max_num_tokens"] = limits.max_num_tokens
    if limits.free_gpu_memory_fraction is not None:
        out["kv_cache_config"] = {"free_gpu_memory_fraction": limits.free_gpu_memory_fraction}
    sizes = _graph_sizes(limits, gate) if backend == "pytorch" else None
    if sizes is not None:
        style = info.cuda_graph_style
        if style == "flat":
            out["use_cuda_graph"] = True
            out["cuda_graph_batch_sizes"] = sizes
            out["cuda_graph_padding_enabled"] = True
        else:
            out["cuda_graph_config"] = {"batch_sizes": sizes, "enable_padding": True}
            if style == "config_mode":
                out["cuda_graph_config"]["mode"] = "decode"
    return out


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``extra`` into a copy of ``base`` (mappings merge, other values replace)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def _dump(options: Mapping[str, Any], header: str) -> str:
    body = yaml.safe_dump(dict(options), sort_keys=False, default_flow_style=False)
    return f"# {header}\n{body}"


def render_speculative_yaml(
    method: str,
    release: str,
    backend: str,
    *,
    drafter_ref: str | None,
    max_draft_len: int,
    draft_len_schedule: Mapping[int, int] | None = None,
    max_concurrency: int | None = None,
    limits: ServeLimits | None = None,
    speculative_extra: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    two_model: bool = False,
    mtp_layers: int | None = None,
) -> str:
    """YAML for ``trtllm-serve --config``: speculation with ``method`` on ``release``/``backend``.

    ``two_model`` writes EAGLE-3's two-model switch (``eagle3_one_model: false``, 1.0-1.2);
    ``mtp_layers`` (the target's MTP layer count) decides whether main's MTP honours a gate.

    ``drafter_ref`` is the draft model (HF id or local folder; None for NGram and MTP's own
    layers), ``max_draft_len`` the draft length (tokens per step). ``draft_len_schedule`` (spectool
    form, see the module docstring) or ``max_concurrency`` (speculate only up to this batch size)
    gate speculation at run time. ``speculative_extra`` adds or overrides ``speculative_config``
    fields, ``extra`` top-level options; the result is validated for the release. Raises
    :class:`ConfigError` for a combination the release cannot express.
    """
    check_method(method)
    info = release_info(release)
    reason = info.unsupported_reason(method, backend)
    if reason is not None:
        raise ConfigError(f"{method} on {backend}", f"TensorRT-LLM {release}: {reason}")
    spec = info.method(method, backend)
    assert spec is not None  # unsupported_reason returned None
    if isinstance(max_draft_len, bool) or not isinstance(max_draft_len, int) or max_draft_len < 1:
        raise ConfigError("max_draft_len", f"must be a positive integer, got {max_draft_len!r}")
    if drafter_ref is not None and spec.drafter_key is None:
        raise ConfigError(
            "drafter", f"{method} in TensorRT-LLM {release} takes no separate draft model"
        )
    if spec.drafter_required and not drafter_ref:
        raise ConfigError("drafter", f"{method} in TensorRT-LLM {release} needs a draft model")
    limits = limits or ServeLimits()
    switch = two_model_key(release, method) if two_model else None
    if two_model and switch is None:
        raise ConfigError(
            f"{method} two-model",
            f"TensorRT-LLM {release} has no two-model switch for {method} (eagle3 on 1.0-1.2 only)",
        )
    support = gate_support(
        release, method, backend=backend, two_model=two_model, mtp_layers=mtp_layers
    )
    gate = _runtime_gate(
        info,
        backend,
        max_draft_len,
        draft_len_schedule,
        max_concurrency,
        limits.max_batch_size,
        support,
    )
    speculative: dict[str, Any] = {"decoding_type": spec.decoding_type}
    speculative.update({key: max_draft_len for key in spec.depth_keys})
    if drafter_ref is not None:
        speculative[spec.drafter_key] = str(drafter_ref)
    speculative.update(spec.fixed)
    if switch is not None:
        speculative[switch] = False
    speculative.update(gate)
    options = LlmApiOptionsOut(
        speculative_config=SpeculativeOut(**speculative),
        **dict(spec.top_level),
        **_common(info, backend, limits, gate),
    ).model_dump(exclude_none=True)
    if speculative_extra:
        if "decoding_type" in speculative_extra:
            raise ConfigError("speculative_extra.decoding_type", "is set by the method")
        options["speculative_config"] = _merge(options["speculative_config"], speculative_extra)
    if extra:
        if "speculative_config" in extra:
            raise ConfigError("extra.speculative_config", "use speculative_extra instead")
        options = _merge(options, extra)
    validate_options(options, release, backend)
    return _dump(options, f"spectool: {method} for TensorRT-LLM {release} ({backend} backend)")


def render_baseline_yaml(
    release: str,
    backend: str,
    *,
    limits: ServeLimits | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """YAML for the no-speculation comparison run: the same limits, no ``speculative_config``."""
    info = release_info(release)
    missing = info.backend_missing_reason(backend)
    if missing is not None:
        raise ConfigError(f"backend {backend!r}", missing)
    limits = limits or ServeLimits()
    options = LlmApiOptionsOut(**_common(info, backend, limits, {})).model_dump(exclude_none=True)
    if extra:
        if "speculative_config" in extra:
            raise ConfigError("extra.speculative_config", "a baseline has no speculation")
        options = _merge(options, extra)
    validate_options(options, release, backend)
    return _dump(
        options, f"spectool: baseline (no speculation), TensorRT-LLM {release} ({backend})"
    )


# What tune changes in a build's options while it measures (module docstring).
MEASURING_OPTIONS: dict[str, Any] = {"kv_cache_config": {"enable_block_reuse": False}}


def measuring_yaml(path: str | Path, release: str, backend: str) -> str:
    """The options of the build file ``path`` as ``tune`` serves them: :data:`MEASURING_OPTIONS`
    merged in (block reuse off), validated for the release."""
    options = _merge(read_options_yaml(path, release, backend), MEASURING_OPTIONS)
    validate_options(options, release, backend)
    return _dump(
        options,
        f"spectool tune: {Path(path).name} with KV-cache block reuse off while measuring "
        f"(tune repeats its prompts), TensorRT-LLM {release} ({backend})",
    )


def read_options_yaml(path: str | Path, release: str, backend: str) -> dict[str, Any]:
    """Read a user's ``--config`` YAML (``yaml.safe_load``) and validate it for the release."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadInputError(path, f"cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise BadInputError(path, f"not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadInputError(path, "the YAML root must be a mapping of LLM-API options")
    try:
        validate_options(data, release, backend)
    except ConfigError as exc:
        raise ConfigError(path, f"{exc.where}: {exc.problem}") from exc
    return data

"""Command lines for ``trtllm-serve`` and the legacy ``trtllm-build``.

Pure argv building (lists of strings, never a shell string: no ``shell=True`` anywhere).
Process supervision (start, log streaming, signals, the ``/health`` wait, no orphans) lives with
the serve command (:mod:`spectool.deploy.supervise`), not here.

Per-release differences (from :mod:`spectool.trtllm.releases`): the YAML flag is ``--config`` from
1.2 (``--extra_llm_api_options`` before, still accepted as an alias later); ``--backend`` exists up
to 1.2 (0.21: only ``--backend pytorch``, the TensorRT path is the default; 1.0-1.2: ``pytorch`` |
``tensorrt``); main has PyTorch only and spectool passes no ``--backend``. ``trtllm-build`` exists
up to 1.2 and was removed with the TensorRT backend.

Flag precedence: in the 1.2-era ``serve.py`` the YAML overrode CLI flags, in main explicit CLI
flags win [SRC]; pass each limit in one place only (spectool writes them into the YAML).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from spectool.errors import ConfigError, EngineMissingError
from spectool.trtllm.releases import check_backend, release_info

# trtllm-serve binds an IPv4 socket before loading (commands/serve.py launch_server:
# socket.socket(socket.AF_INET, ...); s.bind((host, port)) -> "Failed to bind socket" [SRC @00209af]),
# so an IPv6 host never works there.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost"})
IPV6_LOOPBACK = frozenset({"::1", "[::1]"})
SERVE_INSTALL_HINT = (
    "install TensorRT-LLM (pip install tensorrt-llm --extra-index-url https://pypi.nvidia.com) or "
    "run inside the NGC container nvcr.io/nvidia/tensorrt-llm/release"
)

# spectool method -> trtllm-build --speculative_decoding_mode [SRC tensorrt_llm/commands/build.py]
BUILD_MODES = {
    "draft_model": "draft_tokens_external",
    "medusa": "medusa",
    "eagle": "eagle",
}
BUILD_MODE_CHOICES = (
    "draft_tokens_external",
    "medusa",
    "eagle",
    "lookahead_decoding",
    "explicit_draft_tokens",
)


def _find(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        raise EngineMissingError(f"{program} not found on PATH; {SERVE_INSTALL_HINT}")
    return path


def find_trtllm_serve() -> str:
    """Absolute path of ``trtllm-serve``; :class:`EngineMissingError` with an install hint if absent."""
    return _find("trtllm-serve")


def find_trtllm_build() -> str:
    """Absolute path of ``trtllm-build`` (TensorRT-LLM ≤1.2 only)."""
    return _find("trtllm-build")


def _positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(name, f"must be a positive integer, got {value!r}")


def build_serve_argv(
    model: str | Path,
    *,
    release: str,
    backend: str,
    config_path: str | Path | None,
    host: str = "127.0.0.1",
    port: int = 8000,
    executable: str = "trtllm-serve",
    tokenizer: str | Path | None = None,
    tp_size: int | None = None,
    pp_size: int | None = None,
    max_batch_size: int | None = None,
    max_num_tokens: int | None = None,
    max_seq_len: int | None = None,
    kv_cache_free_gpu_memory_fraction: float | None = None,
    log_level: str | None = None,
    parallel_flags: Sequence[str] = (),
) -> list[str]:
    """argv for ``trtllm-serve MODEL ...`` on ``release``/``backend``.

    ``model`` is an HF id or checkpoint folder (PyTorch) or an engine folder (TensorRT; then pass
    ``tokenizer``). ``config_path`` is the YAML from :mod:`spectool.trtllm.spec_yaml`. The server
    binds ``host`` which must be a loopback address. Raises :class:`ConfigError` for a backend the
    release lacks or a bad value. ``parallel_flags`` are a layout's own flags
    (:meth:`spectool.parallel.ParallelLayout.serve_flags`; give them instead of ``tp_size``).
    """
    check_backend(backend)
    info = release_info(release)
    missing = info.backend_missing_reason(backend)
    if missing is not None:
        raise ConfigError(f"backend {backend!r}", missing)
    if host in IPV6_LOOPBACK:
        raise ConfigError(
            "host",
            f"trtllm-serve binds an IPv4 socket only (launch_server: AF_INET), so {host!r} fails "
            "with 'Failed to bind socket'; use --host 127.0.0.1",
        )
    if host not in LOOPBACK_HOSTS:
        raise ConfigError("host", f"spectool binds servers to loopback only, got {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigError("port", f"must be in 1..65535, got {port!r}")
    for name, value in (
        ("tp_size", tp_size),
        ("pp_size", pp_size),
        ("max_batch_size", max_batch_size),
        ("max_num_tokens", max_num_tokens),
        ("max_seq_len", max_seq_len),
    ):
        _positive(name, value)
    if (
        kv_cache_free_gpu_memory_fraction is not None
        and not 0 < kv_cache_free_gpu_memory_fraction <= 1
    ):
        raise ConfigError(
            "kv_cache_free_gpu_memory_fraction",
            f"must be in (0, 1], got {kv_cache_free_gpu_memory_fraction!r}",
        )
    argv = [executable, str(model), *info.serve_backend_argv[backend]]
    argv += ["--host", host, "--port", str(port)]
    if config_path is not None:
        argv += [info.serve_config_flag, str(config_path)]
    optional = (
        ("--tokenizer", tokenizer),
        ("--tp_size", tp_size),
        ("--pp_size", pp_size),
        ("--max_batch_size", max_batch_size),
        ("--max_num_tokens", max_num_tokens),
        ("--max_seq_len", max_seq_len),
        ("--kv_cache_free_gpu_memory_fraction", kv_cache_free_gpu_memory_fraction),
        ("--log_level", log_level),
    )
    for flag, value in optional:
        if value is not None:
            argv += [flag, str(value)]
    argv += list(parallel_flags)
    unknown = [a for a in argv if a.startswith("--") and a not in info.serve_flags]
    assert not unknown, f"flags not in the {release} table: {unknown}"
    return argv


# EAGLE-1 engines: examples/eagle/README.md (TensorRT-LLM @06255cb) converts with
# --max_draft_len 63 --num_eagle_layers 4 and runs trtllm-build with --speculative_decoding_mode
# eagle and no --max_draft_len: the draft tree (eagle_choices, 63 nodes of depth 4) is the
# checkpoint's and the run's, not the build's.
BUILD_MODES_WITHOUT_DRAFT_LEN = frozenset({"eagle"})
EAGLE1_TREE_NODES = 63
EAGLE1_LAYERS = 4


def build_trtllm_build_argv(
    *,
    release: str,
    checkpoint_dir: str | Path,
    output_dir: str | Path,
    speculative_decoding_mode: str | None,
    max_draft_len: int | None = None,
    max_batch_size: int | None = None,
    max_seq_len: int | None = None,
    max_num_tokens: int | None = None,
    use_paged_context_fmha: bool = True,
    gather_generation_logits: bool = False,
    executable: str = "trtllm-build",
) -> list[str]:
    """argv for the legacy ``trtllm-build`` (TensorRT engines, releases ≤1.2).

    ``speculative_decoding_mode`` is one of :data:`BUILD_MODE_CHOICES` (None: no speculation);
    ``max_draft_len`` is required with it, except for EAGLE
    (:data:`BUILD_MODES_WITHOUT_DRAFT_LEN`), whose draft tree comes from the checkpoint;
    draft/target engines need ``--use_paged_context_fmha enable`` and usually
    ``--gather_generation_logits`` (examples/draft_target_model/README.md).
    """
    info = release_info(release)
    if not info.has_trtllm_build:
        raise ConfigError(
            "trtllm-build", f"removed with the TensorRT backend; TensorRT-LLM {release} has none"
        )
    for name, value in (
        ("max_batch_size", max_batch_size),
        ("max_seq_len", max_seq_len),
        ("max_num_tokens", max_num_tokens),
    ):
        _positive(name, value)
    argv = [executable, "--checkpoint_dir", str(checkpoint_dir), "--output_dir", str(output_dir)]
    if speculative_decoding_mode is not None:
        if speculative_decoding_mode not in BUILD_MODE_CHOICES:
            raise ConfigError(
                "speculative_decoding_mode",
                f"{speculative_decoding_mode!r} is not one of {', '.join(BUILD_MODE_CHOICES)}",
            )
        _positive("max_draft_len", max_draft_len)
        argv += ["--speculative_decoding_mode", speculative_decoding_mode]
        if speculative_decoding_mode in BUILD_MODES_WITHOUT_DRAFT_LEN:
            if max_draft_len is not None:
                raise ConfigError(
                    "max_draft_len",
                    f"{speculative_decoding_mode} engines take their draft tree from the "
                    "converted checkpoint (examples/eagle/README.md builds without "
                    "--max_draft_len)",
                )
        elif max_draft_len is None:
            raise ConfigError("max_draft_len", "required with a speculative decoding mode")
        else:
            argv += ["--max_draft_len", str(max_draft_len)]
    elif max_draft_len is not None:
        raise ConfigError("max_draft_len", "needs a speculative_decoding_mode")
    for flag, value in (
        ("--max_batch_size", max_batch_size),
        ("--max_seq_len", max_seq_len),
        ("--max_num_tokens", max_num_tokens),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if use_paged_context_fmha:
        argv += ["--use_paged_context_fmha", "enable"]
    if gather_generation_logits:
        argv.append("--gather_generation_logits")
    return argv


def build_mode_for_method(method: str) -> str:
    """``trtllm-build --speculative_decoding_mode`` for a spectool method (engine methods only)."""
    try:
        return BUILD_MODES[method]
    except KeyError:
        raise ConfigError(
            f"method {method!r}",
            f"has no TensorRT engine mode; engine methods: {', '.join(BUILD_MODES)}",
        ) from None

"""What counts as bad input, checked before anything is read, and "did you mean" for names.

The rule (README, "Exit codes"), the same for every command: a flag value outside what the flag
accepts (a range, a known name, a format) is **bad input**: one line naming the flag, exit 2,
raised here before any checkpoint, engine rule or prediction is looked at. A **finding** (exit
1) is something true about the models, the engine release or the GPU together: a drafter that
does not fit its target, a method a release cannot run, a model too large for the memory.
``check``, ``build`` and ``tune`` call :func:`check_pair_options` first, so the first thing
wrong with what the user typed is the thing reported.
"""

from __future__ import annotations

from typing import Any

from spectool.compat import MAX_DRAFT_LEN
from spectool.errors import BadInputError, ProfileError
from spectool.suggest import suggestion

TRTLLM_BACKENDS = ("pytorch", "tensorrt")


def check_range(flag: str, value: int | None, low: int = 1, high: int | None = None) -> None:
    if value is None or (value >= low and (high is None or value <= high)):
        return
    bound = f"between {low} and {high}" if high is not None else f"{low} or more"
    raise BadInputError(flag, f"must be {bound}, got {value}")


def check_pair_options(opts: Any) -> None:
    """Every flag value of :class:`spectool.check.PairOptions` (and, where present, the
    prediction's ``concurrency`` and ``acceptance_*``), checked against what it accepts.

    :class:`BadInputError` (exit 2) naming the flag; unknown names come with the closest known
    one. Nothing is read from disk or the network except spectool's own tables.
    """
    from spectool import methods, profiles

    check_range("--max-draft-len", opts.max_draft_len, 1, MAX_DRAFT_LEN)
    check_range("--tp", opts.tp)
    for flag, name in (("--pp", "pp"), ("--ep", "ep"), ("--nodes", "nodes")):
        check_range(flag, getattr(opts, name, 1))
    check_range("--gpus-per-node", getattr(opts, "gpus_per_node", None))
    check_range("--max-batch-size", opts.max_batch_size)
    check_range("--max-seq-len", opts.max_seq_len, 2)
    if opts.method != "auto" and not methods.is_method(opts.method):
        raise BadInputError("--method", methods.unknown_method_problem(opts.method))
    if opts.trtllm_backend not in TRTLLM_BACKENDS:
        raise BadInputError(
            "--trtllm-backend",
            f"unknown backend {opts.trtllm_backend!r}{suggestion(opts.trtllm_backend, TRTLLM_BACKENDS)}"
            "; choose pytorch or tensorrt",
        )
    if opts.trtllm_version is not None:
        from spectool.trtllm.versions import release_for_version

        try:
            release_for_version(opts.trtllm_version)
        except BadInputError as exc:
            raise BadInputError("--trtllm-version", exc.problem) from None
    gpu = None if opts.gpu is None or opts.gpu.strip().lower() in ("", "auto") else opts.gpu
    for flag, value, load in (
        ("--profile", opts.profile, profiles.load_profile),
        ("--gpu", gpu, profiles.load_gpu),
    ):
        if value is not None:
            try:
                load(value)
            except ProfileError as exc:
                raise ProfileError(flag, exc.problem) from None
    rate = getattr(opts, "acceptance_rate", None)
    if rate is not None and not 0.0 <= rate <= 1.0:
        raise BadInputError("--acceptance-rate", f"must be in [0, 1], got {rate}")
    length = getattr(opts, "acceptance_length", None)
    if length is not None and not 1.0 <= length <= MAX_DRAFT_LEN + 1:
        raise BadInputError(
            "--acceptance-length",
            f"must be in [1, {MAX_DRAFT_LEN + 1}] (tokens per step, the bonus token included), "
            f"got {length}",
        )

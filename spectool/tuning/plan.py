"""What every measurement of a tune run shares, before anything is measured: the token
counter, the prompts, the setup (its fingerprint labels the trials), the trial plan, the server
driver and how the engine reads a schedule."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from spectool.decide.model import ScheduleSemantics
from spectool.measure.client import RequestOptions
from spectool.tuning.driver import ServerDriver
from spectool.tuning.prompts import TunePrompts, output_range, tune_prompts
from spectool.tuning.request import ResolvedTune
from spectool.tuning.setup import SERVER_LOG_NAME, TuneSetup, checkpoint_identity
from spectool.tuning.trials import CellPlan

# /metrics polling period: the engines keep 1000 iterations between reads, far more than a
# quarter second holds; a short period shortens the wait after each trial.
METRICS_INTERVAL_S = 0.25


def count_tokens_for(resolved: ResolvedTune) -> Callable[[str], int] | None:
    """The target tokenizer's counter when its folder has ``tokenizer.json``."""
    from spectool.measure.client import tokenizer_counter

    folder = Path(resolved.report.target.path)
    return tokenizer_counter(folder) if (folder / "tokenizer.json").is_file() else None


def chat_renderer_for(resolved: ResolvedTune) -> Callable[[Sequence[Mapping[str, str]]], str]:
    """How the target's server renders a chat request: its chat template when its folder has
    a tokenizer (the embedded server's plain rendering without a template or a tokenizer).
    The tokenizer is loaded on the first chat request only."""
    from spectool.engine.tokenizer import Tokenizer, plain_chat_text

    folder = Path(resolved.report.target.path)
    if not (folder / "tokenizer.json").is_file():
        return plain_chat_text
    loaded: list[Tokenizer] = []

    def render(messages: Sequence[Mapping[str, str]]) -> str:
        if not loaded:
            loaded.append(Tokenizer.from_dir(folder))
        return loaded[0].apply_chat_template(messages)

    return render


def _server_settings(resolved: ResolvedTune) -> dict[str, object]:
    req = resolved.request
    common: dict[str, object] = {
        "max_batch_size": resolved.max_batch_size,
        "max_seq_len": resolved.max_seq_len,
    }
    if resolved.engine == "torch":
        return {**common, "device": req.device, "dtype": req.dtype, "threads": resolved.threads}
    trtllm = resolved.report.trtllm or {}
    return {
        **common,
        "release": trtllm.get("release"),
        "version": trtllm.get("version"),
        "backend": req.trtllm_backend,
        "gpu": (resolved.report.gpu or {}).get("name"),
        "tp": req.tp,
        # two GPU sets or more measure concurrent pairs: their trials are not the bracketed
        # design's, so a resume with another --gpus is refused (one set: as before)
        **(
            {"gpu_sets": resolved.gpu_sets.count}
            if resolved.gpu_sets is not None and resolved.gpu_sets.concurrent
            else {}
        ),
    }


def prompts_for(resolved: ResolvedTune, count_tokens: Callable[[str], int] | None) -> TunePrompts:
    """The run's prompts: enough for the largest trial, each fitting the sequence limit with
    the output and one verify step's drafts."""
    # the built-in prompts' outputs vary around --max-tokens (tuning.prompts.output_lengths)
    longest = (
        resolved.max_tokens
        if resolved.request.workload is not None
        else output_range(resolved.max_tokens)[1]
    )
    probe = CellPlan(
        resolved.engine, resolved.method, "-", "-", resolved.num_prompts, resolved.max_tokens
    )
    workload = resolved.request.workload
    return tune_prompts(
        workload,
        max(probe.requests_at(c) for c in resolved.concurrencies),
        count_tokens=count_tokens,
        max_prompt_tokens=resolved.max_seq_len - longest - resolved.max_draft_len - 1,
        seed=resolved.request.seed,
        mean_output=None if workload is not None else resolved.max_tokens,
        output_tokens=resolved.max_tokens if workload is not None else None,
        render_chat=chat_renderer_for(resolved) if workload is not None else None,
        time_scale=resolved.request.time_scale,
    )


def cell_plan(resolved: ResolvedTune, setup: TuneSetup, prompts: TunePrompts) -> CellPlan:
    """How every cell of the run is measured (the trials' configs)."""
    return CellPlan(
        engine=resolved.engine,
        method=resolved.method,
        fingerprint=setup.fingerprint(),
        workload_id=prompts.workload_id,
        num_prompts=resolved.num_prompts,
        max_tokens=resolved.max_tokens,
        repeats=resolved.request.repeats,
        workload_prompts=len(prompts.prompts),
        seed=resolved.request.seed,
        request=RequestOptions(
            temperature=resolved.request.temperature, top_p=resolved.request.top_p
        ),
    )


def make_setup(resolved: ResolvedTune, prompts: TunePrompts) -> TuneSetup:
    """The setup of this run (what its trials measure; see :mod:`spectool.tuning.setup`)."""
    report = resolved.report
    drafter = report.drafter
    return TuneSetup(
        engine=resolved.engine,
        method=resolved.method,
        target=checkpoint_identity(report.target.ref, Path(report.target.path)),
        drafter=(
            checkpoint_identity(drafter.ref, Path(drafter.path)) if drafter is not None else None
        ),
        server=_server_settings(resolved),
        workload={"source": prompts.source, "id": prompts.workload_id},
        max_tokens=resolved.max_tokens,
        num_prompts=resolved.num_prompts,
        repeats=resolved.request.repeats,
    )


def measurement_plan(
    resolved: ResolvedTune,
) -> tuple[Callable[[str], int] | None, TunePrompts, TuneSetup, CellPlan]:
    """What every measurement of a run shares: the token counter, the prompts, the setup
    (its fingerprint labels the trials) and the trial plan (tune and its benchmarks alike)."""
    count_tokens = count_tokens_for(resolved)
    prompts = prompts_for(resolved, count_tokens)
    setup = make_setup(resolved, prompts)
    return count_tokens, prompts, setup, cell_plan(resolved, setup, prompts)


def make_driver(
    resolved: ResolvedTune, out: Path, alternatives: Sequence[ResolvedTune] = ()
) -> ServerDriver:
    """The server driver for the resolved engine; with ``alternatives`` (embedded engine only)
    one server that also holds their methods' drafters and switches between them in place."""
    if resolved.engine == "torch":
        from spectool.tuning.torch_driver import TorchDriver

        assert resolved.target_dir is not None
        assert resolved.threads is not None
        return TorchDriver(
            resolved.target_dir,
            resolved.drafter_dir,
            resolved.method,
            model_name=resolved.target_dir.name,
            max_batch_size=resolved.max_batch_size,
            max_seq_len=resolved.max_seq_len,
            device=resolved.request.device,
            dtype=resolved.request.dtype,
            threads=resolved.threads,
            log_path=out / SERVER_LOG_NAME,
            ready_timeout_s=resolved.ready_timeout_s,
            max_draft_len=max(r.max_draft_len for r in (resolved, *alternatives)),
            alternatives={r.method: r.drafter_dir for r in alternatives},
        )
    from spectool.tuning.trtllm_driver import TrtllmDriver

    return TrtllmDriver(resolved, configs_dir=out / "configs", log_dir=out / "logs")


def schedule_semantics(resolved: ResolvedTune) -> ScheduleSemantics:
    """How the engine reads ``draft_len_schedule`` keys (informational in decision.json)."""
    if resolved.engine == "trtllm" and resolved.report.trtllm is not None:
        from spectool.trtllm.releases import release_info

        rule = release_info(resolved.report.trtllm["release"]).schedule_rule
        return "up_to" if rule == "smallest_key" else "from"
    return "up_to"

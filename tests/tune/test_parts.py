"""tune's small parts: option parsing, defaults, trial plans, pooling, prompts, per-cell stats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectool.cli.app import main
from spectool.decide.cell import CellMeasurement
from spectool.decide.latency import RequestRecord
from spectool.decide.stats import cell_stats
from spectool.errors import BadInputError
from spectool.measure.runner import TrialConfig, TrialResult
from spectool.tuning.prompts import BUILTIN, tune_prompts
from spectool.tuning.request import (
    ENGINE_DEFAULTS,
    TuneRequest,
    parse_concurrencies,
    resolve,
)
from spectool.tuning.trials import CellPlan, pooled_cell


def _record(i: int, ttft_s: float, decode_s: float, tokens: int) -> RequestRecord:
    first = 0.01 + ttft_s
    return RequestRecord(
        request_id=f"r{i}",
        category="c",
        send_time_s=0.01,
        first_token_time_s=first,
        chunk_times_s=(first, first + decode_s),
        chunk_token_counts=(1, tokens - 1),
        end_time_s=first + decode_s,
        prompt_tokens=5,
        output_tokens=tokens,
    )


def test_parse_concurrencies() -> None:
    assert parse_concurrencies("8, 1,2,2") == (1, 2, 8)
    for bad in ("0", "a", " , ", "1,-4"):
        with pytest.raises(BadInputError, match="--concurrency"):
            parse_concurrencies(bad)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--concurrency", "0"], "--concurrency"),
        (["--repeats", "0"], "--repeats"),
        (["--max-tokens", "1"], "--max-tokens"),
        (["--engine", "vllm"], "--engine"),
        (["--confidence", "1.5"], "--confidence"),
        (["--objective", "speed"], "--objective"),
        (["--temperature", "-1"], "--temperature"),
        (["--top-p", "0"], "--top-p"),
        (["--top-p", "1.5"], "--top-p"),
        (["--time-scale", "0"], "--time-scale"),
        (["--time-scale", "2"], "--time-scale"),  # without a trace workload
    ],
)
def test_bad_options_exit_2(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", *args]) == 2
    assert needle in capsys.readouterr().err


def test_torch_defaults_and_limits(tune_models: tuple[Path, Path], tmp_path: Path) -> None:
    target, drafter = tune_models
    resolved = resolve(TuneRequest(target=str(target), drafter=str(drafter), engine="torch"))
    defaults = ENGINE_DEFAULTS["torch"]
    assert resolved.concurrencies == defaults.concurrencies == (1, 4, 16)
    assert (resolved.num_prompts, resolved.max_tokens) == (16, 32)
    assert resolved.method == "draft_model"
    assert resolved.max_batch_size == 16  # the largest concurrency: every batch it can run
    assert resolved.max_seq_len == 1024
    assert resolved.target_dir == target.resolve()
    with pytest.raises(BadInputError, match="--max-batch-size"):
        resolve(
            TuneRequest(target=str(target), drafter=str(drafter), engine="torch", max_batch_size=4)
        )


def test_cell_plan_trials() -> None:
    plan = CellPlan(
        "torch", "draft_model", "abc", "sha256:w", num_prompts=4, max_tokens=8, repeats=2
    )
    configs = plan.configs(8, 3)
    assert [c.num_prompts for c in configs] == [16, 16]  # two full waves at concurrency 8
    assert [c.warmup_requests for c in configs] == [8, 8]
    assert len({c.key() for c in configs}) == 2
    assert plan.configs(1, 0)[0].label.startswith("torch none k=0 #0")
    assert plan.configs(2, 1)[0].num_prompts == 4
    other = CellPlan("torch", "draft_model", "xyz", "sha256:w", num_prompts=4, max_tokens=8)
    assert other.configs(8, 3)[0].key() != configs[0].key()  # another setup: another trial


def test_pooled_cell_concatenates_repeats() -> None:
    plan = CellPlan(
        "torch", "draft_model", "abc", "sha256:w", num_prompts=2, max_tokens=4, repeats=2
    )
    results = [
        TrialResult(
            config=config,
            records=(_record(2 * n, 0.1, 0.3, 4), _record(2 * n + 1, 0.1, 0.6, 4)),
            token_count_sources=("usage", "usage"),
            iteration_stats=(),
            raw_iteration_stats=(),
            wall_time_s=1.5,
            started_at="",
        )
        for n, config in enumerate(plan.configs(1, 2))
    ]
    cell = pooled_cell(results, 2)
    assert cell.key == (1, 2)
    assert len(cell.records) == 4
    assert cell.duration_s == pytest.approx(3.0)


def test_cell_stats_formulas() -> None:
    records = [_record(i, 0.05, 0.03 * (i + 1), 4) for i in range(6)]  # 3 decode tokens each
    cell = CellMeasurement(concurrency=2, k=0, records=tuple(records), duration_s=2.0)
    stats = cell_stats(cell, n_boot=200)
    decode_ms = sum(0.03 * (i + 1) for i in range(6)) * 1000
    assert stats.ms_per_token.value == pytest.approx(decode_ms / 18)
    assert stats.ms_per_token.low <= stats.ms_per_token.value <= stats.ms_per_token.high
    assert stats.tokens_per_s_per_user.value == pytest.approx(1000 / stats.ms_per_token.value)
    e2e = sum(0.05 + 0.03 * (i + 1) for i in range(6))
    assert stats.throughput_tokens_per_s.value == pytest.approx(2 * 24 / e2e)
    assert stats.wall_tokens_per_s == pytest.approx(24 / 2.0)
    assert stats.ttft_p50_ms == pytest.approx(50.0)


def test_prompts_too_long_are_dropped_never_cut(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    lines = [{"prompt": "a b c"}, {"prompt": " ".join(["w"] * 50)}, {"prompt": "d e"}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))

    def words(text: str) -> int:
        return len(text.split())

    chosen = tune_prompts(path, 16, count_tokens=words, max_prompt_tokens=10)
    assert [p.text for p in chosen.prompts] == ["a b c", "d e"]
    assert chosen.dropped == 1
    with pytest.raises(BadInputError, match="no prompt fits"):
        tune_prompts(path, 16, count_tokens=words, max_prompt_tokens=2)


def test_builtin_prompts_fit_and_are_stable() -> None:
    def chars(text: str) -> int:
        return len(text) // 4

    first = tune_prompts(None, 6, count_tokens=chars, max_prompt_tokens=120)
    again = tune_prompts(None, 6, count_tokens=chars, max_prompt_tokens=120)
    assert first.source == BUILTIN
    assert len(first.prompts) == 6
    assert all(chars(p.text) + 1 <= 120 for p in first.prompts)
    assert first.workload_id == again.workload_id


def test_failed_trials_are_dropped_so_resume_measures_them_again(tmp_path: Path) -> None:
    from spectool.measure.runner import load_trials
    from spectool.tuning.resume import drop_failed_trials

    plan = CellPlan("torch", "draft_model", "abc", "sha256:w", num_prompts=2, max_tokens=4)
    good = _record(0, 0.1, 0.3, 4)
    bad = RequestRecord(
        request_id="r1",
        category="c",
        send_time_s=0.0,
        first_token_time_s=None,
        chunk_times_s=(),
        chunk_token_counts=(),
        end_time_s=0.1,
        prompt_tokens=5,
        output_tokens=0,
        error="HTTP 503: engine stopped",
    )
    path = tmp_path / "trials.jsonl"
    lines = []
    for config, records in ((plan.configs(1, 0)[0], (good,)), (plan.configs(1, 1)[0], (good, bad))):
        trial = TrialResult(config, records, ("usage",) * len(records), (), (), 1.0, "")
        lines.append(json.dumps(trial.to_json()) + "\n")
    path.write_text("".join(lines))
    assert drop_failed_trials(path, load_trials(path)) == 1
    assert path.read_text() == lines[0]
    assert drop_failed_trials(path, load_trials(path)) == 0


def test_block_configs_pair_the_same_prompts_and_cycle_through_the_workload() -> None:
    plan = CellPlan("torch", "draft_model", "fp", "wl", num_prompts=4, max_tokens=8, repeats=2)
    spec, base = plan.block_config(4, 3, 2, 3), plan.block_config(4, 3, 2, 0)
    assert spec.label.endswith(f"#p2 setup={plan.fingerprint}") and "k=3" in spec.label
    assert base.label.endswith(f"#p2/k3 setup={plan.fingerprint}") and "none k=0" in base.label
    # two waves of the concurrency, no warmup, both arms on the same prompts
    assert (spec.num_prompts, spec.warmup_requests, spec.concurrency) == (8, 0, 4)
    assert spec.prompt_indices == base.prompt_indices and len(spec.prompt_indices) == 8
    # every block is a distinct trial for resuming, and none is a cell's ordinary trial
    keys = {
        plan.block_config(4, k, i, arm).key() for k in (1, 3) for i in range(3) for arm in (0, k)
    }
    assert len(keys) == 12 and not keys & {c.key() for c in plan.configs(4, 0)}


def test_pairs_walk_shuffled_passes_over_the_whole_workload() -> None:
    plan = CellPlan(
        "torch", "draft_model", "fp", "wl", num_prompts=4, max_tokens=8, workload_prompts=10
    )
    assert plan.pass_pairs(1) == 5 and plan.pass_pairs(2) == 1 and plan.pass_pairs(16) == 1
    # a block: two requests at concurrency 1, above it the whole workload in whole waves
    # (at least two)
    assert [plan.block_requests(c) for c in (1, 2, 3, 16)] == [2, 10, 12, 32]
    # concurrency 1: every pass the same blocks, pair p and pair p + 5 a stratum
    blocks = [plan.block_config(1, 2, p, 2).prompt_indices for p in range(15)]
    assert sorted(i for b in blocks[:5] for i in b) == list(range(10))
    assert blocks[5:] == blocks[:10] and len(set(blocks[:5])) == 5
    # above 1 (requests of a block run together): each pass shuffled anew
    for c in (2, 3):
        sent = [
            i
            for p in range(3 * plan.pass_pairs(c))
            for i in plan.block_config(c, 2, p, 2).prompt_indices
        ]
        passes = [sent[i : i + 10] for i in range(0, 30, 10)]
        assert all(sorted(p) == list(range(10)) for p in passes)  # each pass: every prompt once
        assert len({tuple(p) for p in passes}) == 3  # each pass shuffled anew
    # the first block is not the file's first prompts, and the order is the same for every k
    # (so methods and draft lengths compared at one concurrency see the same prompts)
    firsts = [plan.block_config(1, k, 0, k).prompt_indices for k in (1, 4)]
    assert firsts[0] == firsts[1]
    assert {plan.block_config(1, 1, 0, 1).prompt_indices for _ in range(2)} == {firsts[0]}
    assert (
        sum(plan.block_config(1, 1, p, 1).prompt_indices == (2 * p, 2 * p + 1) for p in range(5))
        < 5
    )
    # saved and read back, the indices are the same trial
    config = plan.block_config(2, 3, 4, 0)
    assert TrialConfig.from_dict(json.loads(config.key())).key() == config.key()


def test_after_config_is_the_baselines_first_trial_relabelled() -> None:
    plan = CellPlan("torch", "draft_model", "fp", "wl", num_prompts=4, max_tokens=8, repeats=2)
    again = plan.after_config(2)
    first = plan.configs(2, 0)[0]
    assert again.label.endswith(f"#after setup={plan.fingerprint}") and "k=0" in again.label
    assert (again.concurrency, again.num_prompts, again.max_tokens) == (2, 4, 8)
    assert again.key() != first.key()


def test_schedule_in_words() -> None:
    from spectool.cli.tune_output import schedule_in_words

    assert schedule_in_words({1: 4, 2: 4, 4: 4, 8: 4, 16: 4}) == "k=4 at concurrency 1-16"
    assert (
        schedule_in_words({1: 4, 2: 4, 4: 2, 8: 0, 16: 0})
        == "k=4 at concurrency 1-2; k=2 at concurrency 4; speculation off at 8 and above"
    )
    assert schedule_in_words({1: 0, 2: 0}) == "speculation off at 1-2"


def test_builtin_prompts_vary_their_output_lengths_around_max_tokens() -> None:
    """So the baseline's batch never runs in lockstep: requests of one length start and end
    together in a closed loop, and no arrival's prefill ever stalls another's decoding."""
    from spectool.tuning.prompts import output_lengths, output_range

    assert output_range(32) == (16, 48) and output_range(3) == (2, 4)
    got = tune_prompts(None, 40, count_tokens=None, max_prompt_tokens=None, mean_output=32)
    lengths = [p.max_tokens for p in got.prompts]
    assert all(16 <= n <= 48 for n in lengths) and len(set(lengths)) > 10
    assert abs(sum(lengths) / len(lengths) - 32) < 4
    again = tune_prompts(None, 40, count_tokens=None, max_prompt_tokens=None, mean_output=32)
    assert again.prompts == got.prompts  # seeded: a resumed run sends the same requests
    assert output_lengths(40, 32, seed=1) != lengths
    plain = tune_prompts(None, 40, count_tokens=None, max_prompt_tokens=None)
    assert all(p.max_tokens is None for p in plain.prompts)


def test_the_temperature_reaches_every_trial(tune_models: tuple[Path, Path]) -> None:
    from spectool.tuning.plan import measurement_plan

    target, drafter = tune_models
    req = TuneRequest(target=str(target), drafter=str(drafter), engine="torch", temperature=0.8)
    _, _, _, plan = measurement_plan(resolve(req))
    assert plan.request.temperature == 0.8
    assert plan.block_config(2, 3, 0, 0).request.temperature == 0.8
    assert all(c.request.temperature == 0.8 for c in plan.configs(4, 0))
    with pytest.raises(BadInputError, match="--temperature"):
        resolve(
            TuneRequest(target=str(target), drafter=str(drafter), engine="torch", temperature=-1)
        )


def test_top_p_reaches_every_trial_and_tells_saved_trials_apart(
    tune_models: tuple[Path, Path],
) -> None:
    from spectool.tuning.plan import measurement_plan

    target, drafter = tune_models
    _, _, _, plan = measurement_plan(
        resolve(
            TuneRequest(
                target=str(target), drafter=str(drafter), engine="torch", top_p=0.9, temperature=0.7
            )
        )
    )
    assert (plan.request.top_p, plan.request.temperature) == (0.9, 0.7)
    assert plan.block_config(2, 1, 0, 0).request.top_p == 0.9
    assert all(c.request.top_p == 0.9 for c in plan.configs(4, 0))
    _, _, _, off = measurement_plan(
        resolve(
            TuneRequest(target=str(target), drafter=str(drafter), engine="torch", temperature=0.7)
        )
    )
    assert off.request.top_p == 1.0
    # a resumed run with another --top-p reuses none of the saved trials
    assert plan.block_config(2, 1, 0, 0).key() != off.block_config(2, 1, 0, 0).key()
    assert plan.configs(4, 0)[0].key() != off.configs(4, 0)[0].key()

"""Closed- and open-loop trials against spectool's real server: records, metrics, resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from spectool.errors import BadInputError
from spectool.measure.runner import (
    TrialConfig,
    TrialResult,
    load_trials,
    measure,
    poisson_arrival_offsets_s,
    run_trial,
    run_trials,
)
from spectool.measure.workloads import Prompt

from .conftest import MAX_TOKENS, MODEL_NAME, Recorder, run_with_client, trial_config


def _max_in_flight(result: TrialResult) -> int:
    events = sorted(
        [(r.send_time_s, 1) for r in result.records] + [(r.end_time_s, -1) for r in result.records],
        key=lambda e: (e[0], e[1]),
    )
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def test_closed_loop_records(ladder, prompts: list[Prompt]) -> None:
    configs, results, _, _ = ladder
    for config, result in zip(configs, results, strict=True):
        assert result.config == config
        assert [r.request_id for r in result.records] == [f"r{i:05d}" for i in range(len(prompts))]
        assert result.errors == ()
        for record, prompt in zip(result.records, prompts, strict=True):
            assert record.category == prompt.category
            assert record.ttft_s is not None and 0 < record.ttft_s <= record.e2e_s
            assert record.output_tokens == (prompt.max_tokens or MAX_TOKENS)
            assert sum(record.chunk_token_counts) == record.output_tokens
            assert 0.0 <= record.send_time_s and record.end_time_s <= result.wall_time_s + 1e-6
        assert set(result.token_count_sources) <= {"usage", "tokenizer"}  # never guessed
        assert len(result.token_count_sources) == len(result.records)
        assert result.arrival_offsets_s == ()
        summary = result.latency()
        assert summary.completed == len(prompts) and summary.errors == 0
    c1, c4 = results
    assert _max_in_flight(c1) == 1
    assert _max_in_flight(c4) == 4


def test_closed_loop_users_join_one_at_a_time(ladder) -> None:
    """Each of the 4 users sends its first request only once the one before has its first
    token: started together, equal-length requests would run in lockstep (module docstring of
    ``spectool.measure.runner``, ``_closed_loop``)."""
    _, (_, c4), _, _ = ladder
    joins, ended = [], []  # a user's first request; the requests a user has finished
    for record in sorted(c4.records, key=lambda r: r.send_time_s):
        free = [e for e in ended if e.end_time_s <= record.send_time_s]
        if free:  # a user sending its next request (short requests end before all joined)
            ended.remove(free[0])
        else:
            joins.append(record)
        ended.append(record)
    assert len(joins) == 4
    for before, after in zip(joins[:-1], joins[1:], strict=True):
        assert before.first_token_time_s is not None
        assert after.send_time_s >= before.first_token_time_s


def test_closed_loop_users_join_after_the_previous_first_token() -> None:
    import asyncio

    from spectool.measure.runner import _closed_loop

    log: list[tuple[str, int]] = []

    async def send(index: int, on_first_chunk) -> None:  # noqa: ANN001
        log.append(("send", index))
        await asyncio.sleep(0.01)
        if on_first_chunk is not None:
            log.append(("first", index))
            on_first_chunk()
        await asyncio.sleep(0.03)

    asyncio.run(_closed_loop(3, 7, None, send))
    assert sorted(i for kind, i in log if kind == "send") == list(range(7))
    firsts = [i for kind, i in log if kind == "first"]  # one per user: its first request
    assert firsts == [0, 1, 2]
    for before, after in zip(firsts[:-1], firsts[1:], strict=True):
        assert log.index(("send", after)) > log.index(("first", before))
    # in flight at once: all three users, once they have joined
    assert log.index(("send", 2)) < log.index(("send", 3))

    # fewer requests than users: only as many users; a request that fails before its first
    # token (the callback never called) does not keep the next user waiting
    sent: list[int] = []

    async def silent(index: int, on_first_chunk) -> None:  # noqa: ANN001
        sent.append(index)
        if index == 0:
            raise RuntimeError("refused")

    with pytest.raises(RuntimeError):
        asyncio.run(_closed_loop(4, 2, None, silent))
    assert sent == [0, 1]


def test_metrics_polled_parsed_and_warmup_excluded(ladder, prompts: list[Prompt]) -> None:
    configs, results, _, _ = ladder
    for config, result in zip(configs, results, strict=True):
        assert result.metrics_error is None
        stats = result.iteration_stats
        assert stats and len(stats) == len(result.raw_iteration_stats)
        assert all(s.spec_decoding is not None and s.spectool is not None for s in stats)
        # Every measured request was admitted exactly once; the warmup ones were drained before.
        assert sum(s.num_new_active_requests or 0 for s in stats) == len(prompts)
        assert sum(s.num_completed_requests or 0 for s in stats) == len(prompts)
        assert max(s.num_active_requests for s in stats) <= config.concurrency
        assert sum(s.spec_decoding.num_draft_tokens for s in stats) > 0
    assert max(s.num_active_requests for s in results[1].iteration_stats) > 1


def test_progress_hooks(ladder, prompts: list[Prompt]) -> None:
    _, _, _, recorder = ladder
    per_trial = ["start"] + ["request"] * len(prompts) + ["done"]
    assert recorder.kinds() == per_trial * 2
    assert recorder.calls[0] == ("start", ("c1", len(prompts)))
    assert recorder.calls[-1] == ("done", "c4")


def test_resume_skips_finished_trials(ladder, server_url: str, prompts: list[Prompt]) -> None:
    configs, results, path, _ = ladder
    saved = load_trials(path)
    assert list(saved) == [c.key() for c in configs]
    for result in results:  # the JSON line round-trips exactly
        loaded = saved[result.config.key()]
        assert loaded.records == result.records
        assert loaded.iteration_stats == result.iteration_stats
        assert loaded.wall_time_s == result.wall_time_s
        assert loaded.token_count_sources == result.token_count_sources

    extra = trial_config(prompts, "c2", concurrency=2)
    recorder = Recorder()
    again = run_with_client(
        server_url, run_trials, prompts, [*configs, extra], results_path=path, progress=recorder
    )
    assert [kind for kind, _ in recorder.calls if kind != "request"] == ["start", "done"]
    assert recorder.calls[0] == ("start", ("c2", len(prompts)))
    assert again[:2] == [saved[c.key()] for c in configs]
    assert again[2].config == extra and len(again[2].records) == len(prompts)
    assert len(path.read_text().splitlines()) == 3

    # A crash while appending leaves an unfinished last line: ignored.
    with path.open("a") as f:
        f.write('{"format": "spectool.trial/1", "key": "x", "rec')
    assert list(load_trials(path)) == [c.key() for c in (*configs, extra)]
    # Any other malformed line is an error naming the line.
    lines = path.read_text().splitlines()
    broken = path.with_name("broken.jsonl")
    broken.write_text("\n".join([lines[0], "{oops", lines[1]]) + "\n")
    with pytest.raises(BadInputError, match="line 2: not valid JSON"):
        load_trials(broken)
    broken.write_text(json.dumps({"format": "spectool.trial/1", "config": {"label": 1}}) + "\n")
    with pytest.raises(BadInputError, match="line 1: "):
        load_trials(broken)


def test_poisson_offsets_are_a_seeded_numpy_draw() -> None:
    offsets = poisson_arrival_offsets_s(4.0, 50, seed=7)
    gaps = np.random.default_rng(7).exponential(0.25, size=49)
    assert offsets[0] == 0.0
    np.testing.assert_array_equal(
        np.diff(offsets), np.diff(np.concatenate([[0.0], np.cumsum(gaps)]))
    )
    np.testing.assert_array_equal(offsets, poisson_arrival_offsets_s(4.0, 50, seed=7))
    assert not np.array_equal(offsets, poisson_arrival_offsets_s(4.0, 50, seed=8))
    assert 0.15 < float(np.mean(np.diff(offsets))) < 0.4  # mean gap 1/rate
    assert len(poisson_arrival_offsets_s(1.0, 0, seed=0)) == 0


def test_open_loop_follows_the_seeded_schedule(server_url: str, prompts: list[Prompt]) -> None:
    config = trial_config(prompts, "rate", rate_per_s=8.0, seed=11)
    result = run_with_client(server_url, run_trial, prompts, config)
    expected = poisson_arrival_offsets_s(8.0, len(prompts), seed=11)
    assert result.arrival_offsets_s == tuple(expected.tolist())
    assert result.errors == () and len(result.records) == len(prompts)
    sends = np.array([r.send_time_s for r in result.records])
    assert np.all(sends >= expected - 1e-3)  # never early
    assert np.all(sends <= expected + 0.5)  # and not late by more than scheduling noise
    assert result.iteration_stats  # polled in open loop too


def test_time_limit_stops_new_requests(server_url: str, prompts: list[Prompt]) -> None:
    config = trial_config(
        prompts, "limited", concurrency=2, num_prompts=500, max_tokens=4, time_limit_s=1.0
    )
    result = run_with_client(server_url, run_trial, prompts, config)
    assert 2 <= len(result.records) < 500
    assert all(r.send_time_s < 1.0 + 0.05 for r in result.records)
    assert result.errors == ()


def test_a_server_without_iteration_stats_still_measures(
    server_url: str, prompts: list[Prompt]
) -> None:
    config = trial_config(prompts, "nometrics", concurrency=2, num_prompts=2, max_tokens=4)
    result = run_with_client(server_url, run_trial, prompts, config, metrics_path="/v1/models")
    assert result.metrics_error is not None and "/v1/models" in result.metrics_error
    assert result.iteration_stats == () and result.raw_iteration_stats == ()
    assert len(result.records) == 2 and result.errors == ()


def test_config_validation_and_keys(prompts: list[Prompt]) -> None:
    with pytest.raises(BadInputError, match="exactly one"):
        TrialConfig("x")
    with pytest.raises(BadInputError, match="exactly one"):
        TrialConfig("x", concurrency=1, rate_per_s=1.0)
    with pytest.raises(BadInputError, match="concurrency must be >= 1"):
        TrialConfig("x", concurrency=0)
    config = trial_config(prompts, "k", concurrency=3, time_limit_s=9.0)
    assert TrialConfig.from_dict(config.to_dict()) == config
    assert TrialConfig.from_dict(json.loads(json.dumps(config.to_dict()))).key() == config.key()
    assert config.key() != trial_config(prompts, "k", concurrency=3).key()
    with pytest.raises(BadInputError, match="unexpected keyword"):
        TrialConfig.from_dict({**config.to_dict(), "colour": "red"})


def test_workload_mismatch_is_refused(server_url: str, prompts: list[Prompt]) -> None:
    config = trial_config(prompts, "wrong", concurrency=1)
    with pytest.raises(BadInputError, match="does not match the prompts"):
        run_with_client(server_url, run_trial, prompts[:-1], config)


def test_measure_is_the_blocking_entry_point(
    server_url: str, prompts: list[Prompt], tmp_path: Path
) -> None:
    import gc

    config = trial_config(prompts, "sync", concurrency=2, num_prompts=2, max_tokens=4)
    path = tmp_path / "r.jsonl"
    gc.unfreeze()
    held = [[i] for i in range(10_000)]  # objects the run holds before the trial
    (result,) = measure(server_url, MODEL_NAME, prompts, [config], results_path=path)
    assert len(result.records) == 2 and result.errors == ()
    # they were frozen before the trial: no full collection traversed them while it ran
    assert gc.get_freeze_count() >= len(held)
    gc.unfreeze()
    assert list(load_trials(path)) == [config.key()]
    recorder = Recorder()
    (again,) = measure(
        server_url, MODEL_NAME, prompts, [config], results_path=path, progress=recorder
    )
    assert again == result and recorder.calls == []  # loaded from the file, nothing sent


def test_gamma_gaps_keep_the_rate_and_set_the_spread() -> None:
    """vLLM's --burstiness: gamma gaps of shape b and mean 1/rate (CV 1/sqrt(b)); b=1 is the
    Poisson draw itself."""
    poisson = poisson_arrival_offsets_s(4.0, 4001, seed=3)
    np.testing.assert_array_equal(poisson, poisson_arrival_offsets_s(4.0, 4001, 3, burstiness=1.0))
    for b in (0.25, 4.0):
        gaps = np.diff(poisson_arrival_offsets_s(4.0, 4001, seed=3, burstiness=b))
        assert abs(gaps.mean() - 0.25) < 0.03
        assert abs(gaps.std() / gaps.mean() - 1 / np.sqrt(b)) < 0.15
    with pytest.raises(BadInputError):
        poisson_arrival_offsets_s(4.0, 10, seed=0, burstiness=0.0)


def test_open_loop_replays_given_send_times(server_url: str, prompts: list[Prompt]) -> None:
    times = tuple(0.05 * i * i for i in range(len(prompts)))  # a trace's own, uneven pace
    config = trial_config(prompts, "trace", rate_per_s=1.0, arrivals_s=times)
    result = run_with_client(server_url, run_trial, prompts, config)
    assert result.arrival_offsets_s == times
    sends = np.array([r.send_time_s for r in result.records])
    assert np.all(sends >= np.array(times) - 1e-3) and np.all(sends <= np.array(times) + 0.5)
    assert TrialConfig.from_dict(config.to_dict()) == config


def test_arrival_fields_are_checked_and_absent_by_default() -> None:
    base = TrialConfig("x", rate_per_s=1.0, num_prompts=2)
    assert "burstiness" not in base.to_dict() and "arrivals_s" not in base.to_dict()
    for bad in (
        {"concurrency": 1, "burstiness": 2.0},
        {"rate_per_s": 1.0, "burstiness": 0.0},
        {"rate_per_s": 1.0, "arrivals_s": (0.0,)},  # one time for two requests
        {"rate_per_s": 1.0, "arrivals_s": (1.0, 0.5)},  # out of order
        {"concurrency": 1, "arrivals_s": (0.0, 1.0)},
    ):
        with pytest.raises(BadInputError):
            TrialConfig("x", num_prompts=2, **bad)


def test_full_load_measures_only_requests_with_every_user_busy() -> None:
    """The users join one at a time, the loop turns over once, then the measured requests go
    out; extra requests keep every user busy until the last measured one ends, and those
    still running then are cancelled."""
    import asyncio

    from spectool.measure.runner import _full_load_loop

    log: list[tuple[str, str, int]] = []
    in_flight: list[int] = [0]
    levels: dict[int, list[int]] = {}
    cancelled: list[int] = []

    def request(kind: str) -> object:
        async def run(index: int, on_first_chunk) -> None:  # noqa: ANN001
            log.append(("send", kind, index))
            in_flight[0] += 1
            seen = levels.setdefault(index, []) if kind == "m" else []
            try:
                seen.append(in_flight[0])
                await asyncio.sleep(0.01)
                if on_first_chunk is not None:
                    log.append(("first", kind, index))
                    on_first_chunk()
                for _ in range(4):
                    await asyncio.sleep(0.01)
                    seen.append(in_flight[0])
            except asyncio.CancelledError:
                cancelled.append(index)
                raise
            finally:
                in_flight[0] -= 1
            log.append(("end", kind, index))

        return run

    asyncio.run(_full_load_loop(3, 5, request("m"), request("x")))
    sends = [(kind, i) for what, kind, i in log if what == "send"]
    assert [i for kind, i in sends if kind == "m"] == list(range(5))
    first_measured = sends.index(("m", 0))
    assert [kind for kind, _ in sends[:first_measured]] == ["x"] * 6  # 3 joining + a turnover
    assert sum(1 for what, kind, _ in log if what == "first") == 3  # one per user joining
    assert all(min(seen) == 3 for seen in levels.values())  # every user busy all through
    assert log[-1][:2] == ("end", "m") or cancelled  # nothing measured is left running
    assert all(("end", "m", i) in log for i in range(5))
    assert cancelled and all(("end", "x", i) not in log for i in cancelled)

    # one measured request at concurrency 3 still runs beside two busy users
    levels.clear()
    asyncio.run(_full_load_loop(3, 1, request("m"), request("x")))
    assert list(levels) == [0] and min(levels[0]) == 3


def test_full_load_trial_against_the_server(server_url: str, prompts: list[Prompt]) -> None:
    config = trial_config(prompts, "full", concurrency=3, num_prompts=4, full_load=True)
    result = run_with_client(server_url, run_trial, prompts, config)
    assert [r.request_id for r in result.records] == [f"r{i:05d}" for i in range(4)]
    assert result.errors == ()
    assert TrialConfig.from_dict(config.to_dict()) == config
    assert "full_load" not in trial_config(prompts, "plain", concurrency=3).to_dict()
    with pytest.raises(BadInputError, match="full_load needs concurrency"):
        TrialConfig("x", rate_per_s=1.0, full_load=True)
    # the cancelled extra requests were aborted, not left running: a trial right after it
    # has the engine to itself (its iterations never hold more than its one request)
    after = run_with_client(
        server_url, run_trial, prompts, trial_config(prompts, "alone", concurrency=1)
    )
    assert after.errors == () and after.iteration_stats
    assert max(it.num_active_requests for it in after.iteration_stats) == 1

"""benchmarks/steady_state.py splits a block's time per output token into the decode intervals
at full load (every user's request in flight) and the rest, and pairs tune's blocks."""

from __future__ import annotations

import math
from types import SimpleNamespace

from bench_support import load_benchmark

from spectool.decide.latency import RequestRecord

steady = load_benchmark("steady_state.py")


def record(name: str, send: float, chunks: list[float]) -> RequestRecord:
    """A request sent at ``send``, one token per chunk at ``chunks``, ending at the last."""
    return RequestRecord(
        request_id=name,
        category="t",
        send_time_s=send,
        first_token_time_s=chunks[0],
        chunk_times_s=tuple(chunks),
        chunk_token_counts=tuple([1] * len(chunks)),
        end_time_s=chunks[-1],
        prompt_tokens=4,
        output_tokens=len(chunks),
    )


def test_only_intervals_with_every_user_in_flight_count_as_full_load() -> None:
    # Two users: A decodes 0.1 s a token from 0 to 1.0; B joins at 0.45 and decodes 0.2 s a
    # token until 1.45, so both are in flight from 0.45 to 1.0 only.
    a = record("a", 0.0, [0.1 * i for i in range(1, 11)])  # intervals end 0.2 .. 1.0
    b = record("b", 0.45, [0.45 + 0.2 * i for i in range(1, 6)])  # 0.65 .. 1.45
    whole, full, share = steady.split_tpot([a, b], concurrency=2)
    # whole: A 9 intervals of 0.1, B 4 of 0.2 -> 1.7 s over 13 tokens
    assert math.isclose(whole, 1.7 / 13)
    # full load: A's intervals within [0.45, 1.0] (0.5-0.6 .. 0.9-1.0: 5 of 0.1) and B's
    # 0.65-0.85 (0.85-1.05 crosses A's end at 1.0): 0.7 s over 6 tokens
    assert math.isclose(full, 0.7 / 6)
    assert math.isclose(share, 6 / 13)
    # at concurrency 1 every interval is at full load
    assert steady.split_tpot([a, b], concurrency=1)[1:] == (whole, 1.0)


def test_blocks_pair_by_their_pair_number_and_draft_length() -> None:
    def trial(label: str, c: int = 4) -> SimpleNamespace:
        return SimpleNamespace(config=SimpleNamespace(label=label, concurrency=c))

    trials = {
        "1": trial("torch draft_model k=4 #p0 setup=x"),
        "2": trial("torch none k=0 #p0/k4 setup=x"),
        "3": trial("torch draft_model k=1 #p0 setup=x"),
        "4": trial("torch none k=0 #p0/k1 setup=x"),
        "5": trial("torch draft_model k=4 #p1 setup=x"),  # its baseline block is missing
        "6": trial("torch none k=0 #0 setup=x"),  # a baseline cell's block: no pair
    }
    pairs = steady.paired_blocks(trials)
    assert sorted(pairs) == [(4, 1), (4, 4)]
    assert pairs[4, 4] == [(trials["1"], trials["2"])]
    assert pairs[4, 1] == [(trials["3"], trials["4"])]

"""Speed target of ``spectool serve --engine torch``: 128 concurrent streaming clients (8 tokens
each, greedy) against a real uvicorn server on 127.0.0.1 all complete, with no error, in under
10 s wall on 2 cores with the tiny test models (2 layers, hidden 64, draft_model k=3, batch 16).

Starts the server in this process (uvicorn in a thread, the engine on its own thread), fires the
clients with httpx.AsyncClient, and prints wall time, request and token throughput, TTFT
percentiles, errors, and the server's own iteration stats (mean batch, acceptance length).

    python benchmarks/server_load.py [--clients 128] [--max-tokens 8] [TARGET [DRAFTER]]

Without TARGET it builds the tiny random models of tests/server/conftest.py in a temp folder.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "server"))

from spectool.engine.engine import Engine, EngineConfig  # noqa: E402
from spectool.server.app import create_app  # noqa: E402
from spectool.server.run import bind_socket, make_server  # noqa: E402
from spectool.trtllm.iter_stats import parse_iteration_stats  # noqa: E402

WALL_TARGET_S = 10.0
WORDS = "the draft model proposes tokens and the target verifies them in one pass".split()


async def one_client(client: httpx.AsyncClient, i: int, max_tokens: int) -> tuple[float, int]:
    """TTFT (s) and completion tokens of one streamed greedy completion."""
    prompt = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(3 + i % 20))
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft_s = float("nan")
    tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {") and ttft_s != ttft_s:
                ttft_s = time.perf_counter() - t0
            if '"usage"' in line:
                tokens = int(line.split('"completion_tokens":')[1].split(",")[0])
    return ttft_s, tokens


async def run_clients(url: str, clients: int, max_tokens: int) -> tuple[float, list, list]:
    limits = httpx.Limits(max_connections=clients * 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120.0) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(one_client(client, i, max_tokens) for i in range(clients)), return_exceptions=True
        )
        wall_s = time.perf_counter() - t0
    ok = [r for r in results if not isinstance(r, BaseException)]
    errors = [r for r in results if isinstance(r, BaseException)]
    return wall_s, ok, errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", nargs="?")
    parser.add_argument("drafter", nargs="?")
    parser.add_argument("--clients", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--max-batch-size", type=int, default=16)
    args = parser.parse_args()

    if args.target is None:
        from conftest import write_tiny_llama

        tmp = Path(tempfile.mkdtemp(prefix="spectool-load-"))
        target = write_tiny_llama(tmp / "target", seed=1)
        drafter = write_tiny_llama(tmp / "drafter", seed=1, noise=0.015)
    else:
        target = Path(args.target)
        drafter = Path(args.drafter) if args.drafter else None
    config = EngineConfig(
        method="draft_model" if drafter else "none",
        max_draft_len=3,
        max_batch_size=args.max_batch_size,
        max_seq_len=1024,
    )
    app = create_app(lambda: Engine(target, drafter, config), model_name="bench")
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = make_server(app, log_level="warning", access_log=False)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.05)

    httpx.get(f"{url}/metrics")
    wall_s, ok, errors = asyncio.run(run_clients(url, args.clients, args.max_tokens))
    stats = parse_iteration_stats(httpx.get(f"{url}/metrics").json())
    server.should_exit = True
    thread.join(30)

    ttfts = sorted(t for t, _ in ok)
    tokens = sum(n for _, n in ok)
    print(f"clients {args.clients}, max_tokens {args.max_tokens}, batch {args.max_batch_size}")
    print(f"wall {wall_s:.2f} s, completed {len(ok)}, errors {len(errors)}")
    print(f"requests/s {len(ok) / wall_s:.1f}, output tokens/s {tokens / wall_s:.1f}")
    if ttfts:
        p99 = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]
        print(f"TTFT p50 {statistics.median(ttfts) * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms")
    if stats:
        print(
            f"iterations {len(stats)}, mean batch "
            f"{statistics.mean(s.num_active_requests for s in stats):.1f}, "
            f"max queued {max(s.num_queued_requests or 0 for s in stats)}"
        )
        spec = [s.spec_decoding for s in stats if s.spec_decoding]
        drafts = sum(s.num_requests_with_draft_tokens for s in spec)
        if drafts:
            accepted = sum(s.num_accepted_tokens for s in spec)
            print(f"acceptance length {(accepted + drafts) / drafts:.2f}")
    for error in errors[:3]:
        print(f"error: {error!r}")
    passed = not errors and len(ok) == args.clients and wall_s < WALL_TARGET_S
    print(
        f"target: all complete, no error, wall < {WALL_TARGET_S:.0f} s: {'PASS' if passed else 'FAIL'}"
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

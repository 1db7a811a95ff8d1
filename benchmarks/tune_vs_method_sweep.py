"""Proof for tune's method choice: its deployed (method, k) against an interleaved brute-force
sweep of every method and every draft length, on the embedded engine.

1. **Sweep**: one server holding every method's drafter (the demo profile's draft model,
   EAGLE-3 head, the target's MTP module and n-gram lookup) and switching method and ``k`` in
   place, as tune's own server does. (Until 2026-12-04 one server per method, every baseline
   block on the draft model's: a configuration was read against another server's baseline,
   which ran 3% slower than the n-gram server's, median of 6 interleaved pairs, range -10% to
   +9%.) Each round visits every concurrency; there every configuration (every method
   at every ``k``) runs one whole pass over tune's prompts, in a fresh random order per round,
   with a baseline block before the first, after the last and after every second one
   (``B x x B x x ... B``: each configuration sits beside a baseline block of its own minutes).
   Per block: per-user decode tokens/s as users' time per output token gives it, 1 / TPOT
   with TPOT pooled over the block's requests (decode time over decode tokens: what tune's
   default objective compares, and :func:`spectool.decide.replay.per_user_tokens_per_s`);
   per round and configuration, that over the
   mean of the baseline blocks bracketing it (:func:`spectool.decide.sweep_judge.
   bracketed_speedups`), so a round that ran on a slower machine does not reorder the rest.
   Every block's trial (requests and the engine's iteration stats) is kept in
   ``OUT/sweep/trials.jsonl``, labelled ``sweep CONFIG c=C round=R block=B``.
2. **Tune**: ``spectool tune`` (the method comparison) ``--runs`` times, each in a fresh
   folder, with the same workload, concurrencies and settings.
3. **Checks** per run and concurrency: the sweep's speed-up of tune's deployed (method, k)
   (off = the baseline, 1) is at least 95% of the sweep's best; where the sweep's best differs
   from its baseline by more than 5%, tune's on/off agrees (read again against the best's
   gain held out, :func:`spectool.decide.sweep_judge.heldout_gain`: where only the winner's
   curse put it past 5%, a disagreement is *within noise*). The share is given three ways
   (:mod:`spectool.decide.sweep_judge`): in sample (the bar as written), held out (each
   round's best picked on the other rounds: no winner's curse) and the interval of the paired
   per-round shares; the verdict is ``holds``, ``within noise`` or ``short``. Per
   concurrency, beside them, the sweep's own repeatability (:func:`~spectool.decide.
   sweep_judge.split_half`): in how many ways of splitting its rounds in two the best of one
   half reaches 95% on the other, the bar a tuner as good as the sweep itself would meet.
   A last line sums both over the concurrencies (``in all: the checks hold in A of B; ...
   X of Y splits``): the checks' hold rate beside the reference's own.

Prints the table and the checks and writes ``OUT/benchmark.json``; exit 0 when every check
holds in sample, 1 otherwise. ``--rejudge OUT`` judges a finished ``OUT/benchmark.json`` again
without measuring (one written before the bracketing baselines is split into its rounds and
judged on tokens/s, said so); ``--commits A,B`` judges only the runs recorded on those
commits. ``--add-runs N --out OUT`` runs tune N more times against the sweep in ``OUT`` (its
own settings, the engine unchanged) and judges them with the earlier runs; each run records
the commit it ran on. ``--interleave`` adds a sweep round before the first of them and after
each (:func:`add_runs`), tagged with the batch; ``--rejudge OUT --beside`` then judges each
such run against its own batch's rounds only (the same hours).

Usage::

    python benchmarks/tune_vs_method_sweep.py --out out/msweep                   # built-in
    python benchmarks/tune_vs_method_sweep.py --rejudge out/msweep              # no measuring
    python benchmarks/tune_vs_method_sweep.py --add-runs 3 --out out/msweep     # more tune runs
    python benchmarks/tune_vs_method_sweep.py --add-runs 5 --interleave --out out/msweep
    python benchmarks/tune_vs_method_sweep.py --rejudge out/msweep --beside
    python benchmarks/tune_vs_method_sweep.py --workload code --runs 5 --out out/ms-code
    python benchmarks/tune_vs_method_sweep.py --workload prose --runs 5 --out out/ms-prose
    python benchmarks/tune_vs_method_sweep.py --workload code.jsonl --concurrency 1,4,16 \
        --max-tokens 64 --num-prompts 16 --runs 5 --out out/msweep-code
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.sweep_workloads import named_workload  # noqa: E402
from spectool.decide.sweep_judge import (  # noqa: E402
    BASE,
    SplitHalf,
    bracketed_speedups,
    deployable_best,
    heldout_gain,
    judge,
    split_half,
)
from spectool.io import atomic_write_text  # noqa: E402
from spectool.measure.runner import TrialConfig, measure  # noqa: E402
from spectool.tuning.compare import method_requests, resolve_all  # noqa: E402
from spectool.tuning.plan import METRICS_INTERVAL_S, make_driver, measurement_plan  # noqa: E402
from spectool.tuning.request import TuneRequest, parse_concurrencies  # noqa: E402
from spectool.tuning.trials import BLOCK_WAVES  # noqa: E402

QUALITY = 0.95
TRIALS = "trials.jsonl"
VERDICT_MARGIN = 0.05


def decode_spans(records) -> list[tuple[int, float]]:  # noqa: ANN001
    """Per request: decode tokens and decode seconds (the first token is the prefill's)."""
    spans = []
    for r in records:
        if r.first_token_time_s is None or r.output_tokens < 2:
            continue
        span = r.end_time_s - r.first_token_time_s
        if span > 0:
            spans.append((r.output_tokens - 1, span))
    return spans


def pooled_rate(spans: list) -> float:  # noqa: ANN001
    """1 / TPOT, TPOT pooled over requests: decode tokens over decode seconds."""
    return sum(t for t, _ in spans) / sum(s for _, s in spans)


def means_of(requests: dict) -> dict:
    """Per concurrency and configuration, the pooled per-user rate of its requests."""
    return {c: {k: pooled_rate(v) for k, v in by.items()} for c, by in requests.items()}


def with_baselines(configs: list) -> list:  # noqa: ANN001
    """``B x x B x x ... B``: the baseline first, last and after every second configuration."""
    out = [None]
    for i, config in enumerate(configs):
        out.append(config)
        if i % 2 == 1 or i == len(configs) - 1:
            out.append(None)
    return out


def sweep(
    args: argparse.Namespace, out: Path, first_round: int = 0
) -> tuple[dict[str, dict[str, list]], dict[str, list[list[tuple[str, float]]]], list[str]]:
    """``{concurrency: {config: per-request (decode tokens, seconds)}}`` (config ``base`` or
    ``method k=K``), and per concurrency the rounds as run: ``[(config, its block's pooled
    per-user tokens/s), ...]``; and the methods in the profile's order. ``first_round``: the
    number of the first round in the blocks' labels (rounds added to a finished sweep)."""
    requests = method_requests(_request(args, out / "sweep-setup"))
    resolved = resolve_all(requests)
    count_tokens, prompts, _, _ = measurement_plan(resolved[0])
    rates: dict[str, dict[str, list[tuple[int, float]]]] = {}
    rounds: dict[str, list[list[tuple[str, float]]]] = {}
    methods = [r.method for r in resolved]
    folder = out / "sweep" / "server"
    folder.mkdir(parents=True, exist_ok=True)
    # one server holding every drafter, switching method and k in place (tune's own setup): a
    # configuration and its bracketing baselines then run on the same server
    driver = make_driver(resolved[0], folder, alternatives=resolved[1:])
    rng = random.Random(args.seed)
    n = len(prompts.prompts)
    try:
        for round_ in range(args.rounds):
            for c in parse_concurrencies(args.concurrency):
                configs = [
                    (f"{m} k={k}", m, k) for m in methods for k in range(1, args.max_draft_len + 1)
                ]
                rng.shuffle(configs)
                order = list(range(n))
                rng.shuffle(order)
                blocks: list[tuple[str, float]] = []
                for position, slot in enumerate(with_baselines(configs)):
                    name, method, k = slot or (BASE, None, 0)
                    info = driver.serve(k, method)
                    trial = TrialConfig(
                        label=f"sweep {name} c={c} round={first_round + round_} block={position}",
                        concurrency=c,
                        # at least two waves, as tune's blocks (trials.BLOCK_WAVES): a closed
                        # loop in which finished requests are replaced and arriving prefills
                        # stall the others' decoding; one wave of c would decode in lockstep
                        num_prompts=max(n, BLOCK_WAVES * c),
                        max_tokens=args.max_tokens,
                        prompt_indices=tuple(order),
                    )
                    result = measure(
                        info.base_url,
                        info.model_name,
                        prompts.prompts,
                        [trial],
                        count_tokens=count_tokens,
                        metrics_interval_s=METRICS_INTERVAL_S,
                        metrics_path=info.metrics_path,
                        results_path=out / "sweep" / TRIALS,  # every block, for replays
                        finished={},
                    )[0]
                    got = decode_spans(result.records)
                    rates.setdefault(str(c), {}).setdefault(name, []).extend(got)
                    blocks.append((name, pooled_rate(got)))
                rounds.setdefault(str(c), []).append(blocks)
                print(f"sweep round {round_ + 1}/{args.rounds}, concurrency {c} done", flush=True)
    finally:
        driver.close()
    return rates, rounds, methods


def _request(args: argparse.Namespace, out: Path) -> TuneRequest:
    return TuneRequest(
        out=out,
        engine="torch",
        concurrencies=parse_concurrencies(args.concurrency),
        workload=Path(args.workload) if args.workload else None,
        num_prompts=args.num_prompts,
        max_tokens=args.max_tokens,
        max_draft_len=args.max_draft_len,
        seed=args.seed,
        force=True,
    )


def run_tune(args: argparse.Namespace, out: Path) -> tuple[dict, float]:
    argv = [
        sys.executable, "-m", "spectool.cli.app", "tune", "--out", str(out), "--force",
        "--max-draft-len", str(args.max_draft_len), "--concurrency", args.concurrency,
        "--max-tokens", str(args.max_tokens),
    ]  # fmt: skip
    if args.num_prompts:
        argv += ["--num-prompts", str(args.num_prompts)]
    if args.workload:
        argv += ["--workload", args.workload]
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    return json.loads((out / "decision.json").read_text()), wall


def one_run(args: argparse.Namespace, out: Path) -> dict:
    """One tune run, with the commit it started on (runs added later may run on newer code)."""
    head = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    decision, wall = run_tune(args, out)
    return {"decision": decision, "wall_s": wall, "commit": head or "unknown"}


def add_runs(out: Path, count: int, *, interleave: bool = False) -> int:
    """``count`` more tune runs against the sweep in ``out`` (its own settings), judged with
    the earlier runs; ``OUT/benchmark.json`` is rewritten after each one (atomically).

    ``interleave``: a sweep round before the first run and after each (``R T R ... T R``), all
    tagged with this batch, so a run can be judged against the rounds of its own hours
    (``--rejudge OUT --beside``): on this shared machine a gain moves with the load (built-in,
    draft_model k=2 at concurrency 4: 1.10x in the sweep's 12 rounds of 2026-12-03..05, 1.04x
    in 12 rounds at 14:30 on 12-05)."""
    path = out / "benchmark.json"
    data = json.loads(path.read_text())
    args = argparse.Namespace(**data["args"])
    tag = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()) if interleave else None
    ok = False
    for i in range(count):
        if tag is not None and i == 0:
            add_round(data, args, out, tag)
        run = one_run(args, out / f"tune-{len(data['runs'])}")
        data["runs"].append(run | ({"tag": tag} if tag is not None else {}))
        if tag is not None:
            add_round(data, args, out, tag)
        ok = report(data)
        atomic_write_text(path, json.dumps(data | {"ok": ok}, indent=2))
    return 0 if ok else 1


def add_round(data: dict, args: argparse.Namespace, out: Path, tag: str) -> None:
    """One more sweep round in ``data`` (every concurrency), tagged ``tag``; saved at once."""
    tags = round_tags(data)
    done = len(next(iter(data["rounds"].values())))
    seed = 100 + done  # a fresh shuffle per round, reproducible
    started = time.perf_counter()
    rates, rounds, _ = sweep(
        argparse.Namespace(**vars(args) | {"rounds": 1, "seed": seed}), out, first_round=done
    )
    data["sweep_s"] += time.perf_counter() - started
    for c, by_round in rounds.items():
        data["rounds"][c] += by_round
        tags[c] += [tag] * len(by_round)
        for name, spans in rates[c].items():
            data["requests"][c].setdefault(name, []).extend(spans)
    data["round_tags"] = tags
    data["means"] = means_of(data["requests"])
    atomic_write_text(out / "benchmark.json", json.dumps(data, indent=2))


def round_scores(data: dict) -> tuple[dict[str, list[dict[str, float]]], str]:
    """Per concurrency, each round's score per configuration, and what the scores are: speed-ups
    over the bracketing baselines, or (a benchmark.json from before them, which kept only each
    request's tokens/s) per round 1 / the mean of the requests' TPOT, in tokens/s."""
    if "rounds" in data:
        scores = {
            c: [bracketed_speedups([tuple(b) for b in blocks]) for blocks in by_round]
            for c, by_round in data["rounds"].items()
        }
        return scores, "speed-ups over the bracketing baseline blocks"
    n = data["args"]["rounds"]
    scores = {
        c: [
            {name: (len(v) // n) / sum(1 / x for x in v[i * len(v) // n : (i + 1) * len(v) // n])
             for name, v in by.items()}
            for i in range(n)
        ]
        for c, by in data["rates"].items()
    }  # fmt: skip
    return scores, "1 / mean TPOT in tokens/s, the requests split into rounds (no bracketing)"


def round_tags(data: dict) -> dict[str, list[str | None]]:
    """Per concurrency, each round's tag: the interleaved batch it was measured in (``None``:
    the sweep measured before the runs)."""
    tags = data.get("round_tags", {})
    return {c: tags.get(c) or [None] * len(rounds) for c, rounds in data.get("rounds", {}).items()}


def report(data: dict, commits: tuple[str, ...] = (), *, beside: bool = False) -> bool:
    """Print the table and the checks; whether every check holds in sample. ``commits``: judge
    only the runs whose recorded commit starts with one of these (all runs when empty).
    ``beside``: judge each interleaved run only against the sweep rounds of its own batch
    (measured between the batch's runs, the same hours), runs without a batch not at all."""
    scores, what = round_scores(data)
    tags = round_tags(data)
    runs = [
        (i, run)
        for i, run in enumerate(data["runs"])
        if (not commits or str(run.get("commit", "")).startswith(commits))
        and (not beside or run.get("tag") is not None)
    ]
    ok = True
    print(f"\nsweep: {data['sweep_s']:.0f} s, {len(next(iter(scores.values())))} rounds; {what}")
    deployable, plan = deployable_best(scores) if "rounds" in data and not beside else (None, {})
    if deployable is not None:
        print(
            f"the best one-method deployment the sweep finds: {deployable} ("
            + ", ".join(f"c={c}: {n}" for c, n in plan.items())
            + "); 'one method' below is each run's share of it"
        )
    groups: dict[str | None, list] = {}  # runs by the rounds they are judged against
    for i, run in runs:
        groups.setdefault(run.get("tag") if beside else None, []).append((i, run))
    checks, splits = [0, 0], [0, 0]  # [held, judged]; [reached, splits]
    for c, all_rounds in scores.items():
        held = 0
        for tag, group in groups.items():
            rounds = (
                [r for r, t in zip(all_rounds, tags[c], strict=True) if t == tag]
                if beside
                else all_rounds
            )
            if not rounds:
                print(f"c={c}: no sweep rounds of batch {tag}")
                ok = False
                continue
            label = f"c={c} (batch {tag}, {len(rounds)} rounds beside)" if beside else f"c={c}"
            text, group_ok, group_held, ceiling = _check_runs(
                label, c, rounds, group, plan, "rounds" in data
            )
            print(text)
            ok &= group_ok
            held += group_held
            if ceiling is not None:
                splits[0] += ceiling.reached
                splits[1] += ceiling.splits
        print(f"  c={c}: every check holds in {held} of {len(runs)} runs")
        checks[0] += held
        checks[1] += len(runs)
    if splits[1] and checks[1]:  # what bounds the checks: the reference's own repeatability
        print(
            f"in all: the checks hold in {checks[0]} of {checks[1]} ({checks[0] / checks[1]:.0%});"
            f" the sweep's best of half its rounds reaches {QUALITY:.0%} on the other half in "
            f"{splits[0]} of {splits[1]} splits ({splits[0] / splits[1]:.0%})"
        )
    for i, run in runs:
        print(
            f"tune run {i} (commit {run.get('commit', 'not recorded')}): {run['wall_s']:.0f} s, "
            f"{run['decision']['methods']['why']}"
        )
    print("all checks hold" if ok else "a check failed")
    return ok


def _check_runs(
    label: str, c: str, rounds: list, runs: list, plan: dict[str, str], bracketed: bool
) -> tuple[str, bool, int, SplitHalf | None]:
    """The checks of ``runs`` at concurrency ``c`` against the sweep's ``rounds``: the text,
    whether all hold, in how many runs, and the sweep's own split-half repeatability."""
    ok, held = True, 0
    means = {name: sum(r[name] for r in rounds) / len(rounds) for name in rounds[0]}
    best_name = max(means, key=means.get)
    row = f"{label}: best {best_name} {means[best_name]:.2f} of base {means[BASE]:.2f}"
    ceiling = split_half(rounds, QUALITY)
    if ceiling is not None:
        row += (
            f"; the sweep's best of half its rounds reaches {QUALITY:.0%} on the other half "
            f"in {ceiling.reached} of {ceiling.splits} splits (worst {ceiling.worst_share:.0%})"
        )
    held_gain = heldout_gain(rounds) if bracketed else None
    if held_gain is not None:
        row += f"; the best's gain held out {held_gain:.2f}"
    for i, run in runs:
        d = run["decision"]
        k = int(d["schedule"].get(c, 0))
        name = BASE if k == 0 else f"{d['method']} k={k}"
        j = judge(rounds, name)
        best_gain = means[best_name] / means[BASE]
        agree = abs(best_gain - 1) <= VERDICT_MARGIN or ((k > 0) == (best_name != BASE))
        ok &= j.share >= QUALITY and agree
        held += j.share >= QUALITY and agree
        onoff = ""
        if not agree:  # held out, the best's gain may be within the margin (winner's curse)
            within = held_gain is not None and abs(held_gain - 1) <= VERDICT_MARGIN
            onoff = ", on/off wrong" + (
                f" in sample (held out the best gains {held_gain:.2f}: within noise)"
                if within
                else ""
            )
        row += (
            f"\n  run {i}: {name}: {j.share:.0%} in sample, {j.heldout_share:.0%} held out, "
            f"interval {j.low:.0%}-{j.high:.0%}: {j.verdict(QUALITY)}{onoff}"
        )
        if c in plan:  # against the one-method deployment's configuration here
            pair = [{n: r[n] for n in {name, plan[c]}} for r in rounds]
            one = judge(pair, name)
            row += f"; one method: {one.share:.0%} ({one.verdict(QUALITY)})"
    return row, ok, held, ceiling


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default=None, help="a workload file, or code / prose")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--max-draft-len", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("out/method-sweep"))
    parser.add_argument("--sweep-only", action="store_true")
    parser.add_argument("--rejudge", type=Path, default=None, help="judge OUT/benchmark.json again")
    parser.add_argument(
        "--commits",
        default="",
        help="with --rejudge: judge only the runs recorded on these commits (comma-separated prefixes)",
    )
    parser.add_argument(
        "--beside",
        action="store_true",
        help="with --rejudge: judge each interleaved run against its own batch's rounds only",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="with --add-runs: a sweep round before the first run and after each run",
    )
    parser.add_argument(
        "--add-runs",
        type=int,
        default=0,
        help="run tune N more times against the finished sweep in --out (same settings)",
    )
    args = parser.parse_args()
    if args.rejudge is not None:
        data = json.loads((args.rejudge / "benchmark.json").read_text())
        commits = tuple(c for c in args.commits.split(",") if c)
        return 0 if report(data, commits, beside=args.beside) else 1
    if args.add_runs:
        return add_runs(args.out.resolve(), args.add_runs, interleave=args.interleave)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.workload in ("code", "prose"):
        args.workload = str(named_workload(args.workload, out))
    started = time.perf_counter()
    rates, rounds, methods = sweep(args, out)
    sweep_s = time.perf_counter() - started
    runs = [one_run(args, out / f"tune-{i}") for i in range(0 if args.sweep_only else args.runs)]
    data = {
        "args": vars(args) | {"out": str(out), "rejudge": None},
        "sweep_s": sweep_s,
        "means": means_of(rates),
        "requests": rates,
        "rounds": rounds,
        "methods": methods,  # the profile's order (the order tune compares them in)
        "runs": runs,
    }
    ok = report(data)
    atomic_write_text(out / "benchmark.json", json.dumps(data | {"ok": ok}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

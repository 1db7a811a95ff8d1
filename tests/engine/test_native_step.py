"""The C decoder step (spectool.engine.native_step): what the PyTorch path computes, each row's
numbers independent of the rest of its call, and a clean fallback where it cannot run."""

from __future__ import annotations

import platform
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch  # noqa: TID253 (engine tests use torch throughout)

from spectool.engine import native_step
from spectool.engine.load import load_model
from spectool.engine.model import Transformer

from .helpers import write_checkpoint

# The kernel needs x86-64 with AVX2 and a C compiler; this project's CI machines have both, so
# there the tests below must find it running (a silent fallback would hide a broken build).
CAN_BUILD = (
    platform.machine().lower() in ("x86_64", "amd64")
    and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    and shutil.which("cc") is not None
)


@pytest.fixture(scope="module")
def f16_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A float16 Llama (GQA 4:2, untied): the weights the kernel takes."""
    return write_checkpoint(
        tmp_path_factory.mktemp("f16"), seed=5, init_range=0.2, save_dtype=torch.float16
    )


@pytest.fixture(params=["wide", "pairs"])
def kernel(request: pytest.FixtureRequest) -> Iterator[str]:
    """Products of 3 rows or more on each kernel this CPU can run: the AVX-512 one (512-bit
    vectors, up to twelve rows per widened weight) where it has it, and two rows a block (what
    other CPUs run)."""
    if not CAN_BUILD:
        pytest.skip("needs x86-64 with AVX2 and a C compiler")
    if request.param == "wide" and torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip("needs AVX-512")
    was = native_step.wide_rows()
    assert native_step.wide_rows(request.param == "wide") == (request.param == "wide")
    yield request.param
    native_step.wide_rows(was)


def test_a_cpu_with_avx512_runs_the_wide_kernel() -> None:
    """The dispatch is not silently off: where torch sees AVX-512 (this project's CI machines),
    products of 3 rows or more use it by default."""
    if not CAN_BUILD:
        pytest.skip("needs x86-64 with AVX2 and a C compiler")
    assert native_step.wide_rows() == (torch.backends.cpu.get_cpu_capability() == "AVX512")


def _pair(folder: Path) -> tuple[Transformer, Transformer]:
    """The same checkpoint twice: on the kernel, and on the PyTorch path."""
    native = load_model(folder, max_seq_len=128)
    eager = load_model(folder, max_seq_len=128)
    eager.native = None
    return native, eager


def test_the_kernel_builds_and_binds_here(f16_dir: Path) -> None:
    if not CAN_BUILD:
        assert native_step.unavailable_reason() is not None
        return
    assert native_step.unavailable_reason() is None
    model = load_model(f16_dir, max_seq_len=64)
    assert model.native is not None


def _prefill_then_steps(model: Transformer, ids: torch.Tensor, slots: list[int]) -> list:
    """Rows of ``ids`` [B, 40] in ``slots``: a padded prefill (rows of different lengths), a
    5-token verify-shaped chunk, then three single tokens; every call's logits and the cache."""
    cache = model.new_cache(max_batch_size=6, max_seq_len=128)
    slot_t = torch.tensor(slots)
    out = []
    lengths = [30, 22][: ids.shape[0]]
    tokens = torch.zeros(ids.shape[0], 30, dtype=torch.long)
    positions = torch.full((ids.shape[0], 30), -1, dtype=torch.long)
    for b, length in enumerate(lengths):
        tokens[b, :length] = ids[b, :length]
        positions[b, :length] = torch.arange(length)
    with torch.no_grad():
        logits = model(tokens, positions, cache, slot_t)
        out.append([logits[b, : lengths[b]] for b in range(len(lengths))])
        chunk = torch.stack([ids[b, n : n + 5] for b, n in enumerate(lengths)])
        pos = torch.stack([torch.arange(n, n + 5) for n in lengths])
        out.append(model(chunk, pos, cache, slot_t))
        for i in range(3):
            tok = torch.stack([ids[b, n + 5 + i : n + 6 + i] for b, n in enumerate(lengths)])
            pos = torch.tensor([[n + 5 + i] for n in lengths])
            out.append(model(tok, pos, cache, slot_t))
    out.append(cache.kv)
    return out


@pytest.mark.skipif(not CAN_BUILD, reason="needs x86-64 with AVX2 and a C compiler")
@pytest.mark.parametrize("slots", [[0, 1], [3, 0], [5, 2]])
def test_kernel_matches_the_pytorch_path(f16_dir: Path, slots: list[int]) -> None:
    """Logits of a padded prefill, a 5-token chunk and single steps, and the KV cache written,
    agree with the PyTorch path to float rounding, in consecutive, swapped and scattered slots."""
    native, eager = _pair(f16_dir)
    assert native.native is not None
    ids = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(0))
    got = _prefill_then_steps(native, ids, slots)
    want = _prefill_then_steps(eager, ids, slots)
    for b in range(2):
        assert (got[0][b] - want[0][b]).abs().max() < 1e-4
    for g, w in zip(got[1:-1], want[1:-1], strict=True):
        assert g.shape == w.shape
        assert (g - w).abs().max() < 1e-4
    for b, slot in enumerate(slots):  # every written position, padding never written
        length = [30, 22][b] + 8
        assert (got[-1][:, slot, :, :length] - want[-1][:, slot, :, :length]).abs().max() < 1e-4
        assert got[-1][:, slot, :, length:].abs().max() == 0


@pytest.mark.skipif(not CAN_BUILD, reason="needs x86-64 with AVX2 and a C compiler")
@pytest.mark.parametrize(("hidden", "heads", "kv_heads"), [(624, 6, 2), (512, 4, 2), (256, 4, 1)])
def test_attention_gives_the_same_numbers_on_either_kernel(
    tmp_path: Path, hidden: int, heads: int, kv_heads: int
) -> None:
    """Heads of 104 dimensions in groups of three (the passes over the values of 64, 32 and 8
    dimensions; a pair of heads, then one), of 128 in pairs and of 64 in fours: a padded
    prefill, a 5-token chunk and single steps give bit for bit the same logits and cache on the
    512-bit attention as on the 256-bit one, and the PyTorch path's to float rounding
    (relative: sums up to 624 wide)."""
    folder = write_checkpoint(
        tmp_path,
        seed=6,
        init_range=0.2,
        save_dtype=torch.float16,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=64,
    )
    native, eager = _pair(folder)
    assert native.native is not None
    ids = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(2))
    was = native_step.wide_rows()
    try:
        wide = native_step.wide_rows(True)
        assert wide == (torch.backends.cpu.get_cpu_capability() == "AVX512")
        on_wide = _prefill_then_steps(native, ids, [0, 1])
        assert not native_step.wide_rows(False)
        on_pairs = _prefill_then_steps(native, ids, [0, 1])
    finally:
        native_step.wide_rows(was)
    want = _prefill_then_steps(eager, ids, [0, 1])
    for b in range(2):
        assert torch.equal(on_wide[0][b], on_pairs[0][b])
        assert (on_wide[0][b] - want[0][b]).abs().max() < 1e-3 * want[0][b].abs().max()
    for w, p, e in zip(on_wide[1:], on_pairs[1:], want[1:], strict=True):
        assert torch.equal(w, p)
        assert (w - e).abs().max() < 1e-3 * e.abs().max()  # logits up to about 10


@pytest.mark.skipif(not CAN_BUILD, reason="needs x86-64 with AVX2 and a C compiler")
def test_a_verify_pass_repeats_single_steps_bit_for_bit(f16_dir: Path) -> None:
    """k + 1 tokens in one call give exactly the logits (and hidden states, and cache) of k + 1
    one-token calls, and a row's logits do not depend on the other rows of its batch: what
    makes greedy speculative decoding repeat plain greedy decoding."""
    model = load_model(f16_dir, max_seq_len=128)
    assert model.native is not None
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 64, (1, 20), generator=gen)
    draft = torch.randint(0, 64, (1, 5), generator=gen)
    other = torch.randint(0, 64, (1, 7), generator=gen)
    slot = torch.tensor([1])
    with torch.no_grad():
        one = model.new_cache(max_batch_size=4, max_seq_len=128)
        model(prompt, torch.arange(20)[None], one, slot)
        many, hidden_many = model(
            draft, torch.arange(20, 25)[None], one, slot, hidden_layers=[0, 1]
        )
        two = model.new_cache(max_batch_size=4, max_seq_len=128)
        model(prompt, torch.arange(20)[None], two, slot)
        singles = [
            model(draft[:, i : i + 1], torch.tensor([[20 + i]]), two, slot, hidden_layers=[0, 1])
            for i in range(5)
        ]
        # the same five tokens beside another request's row in another slot
        three = model.new_cache(max_batch_size=4, max_seq_len=128)
        model(prompt, torch.arange(20)[None], three, slot)
        model(other, torch.arange(7)[None], three, torch.tensor([3]))
        tokens = torch.stack([draft[0], torch.tensor([5, 6, 7, 0, 0])])
        positions = torch.stack([torch.arange(20, 25), torch.tensor([7, 8, 9, -1, -1])])
        mixed = model(tokens, positions, three, torch.tensor([1, 3]))
    assert torch.equal(many, torch.cat([s[0] for s in singles], dim=1))
    assert torch.equal(hidden_many, torch.cat([s[1] for s in singles], dim=1))
    assert torch.equal(one.kv, two.kv)
    assert torch.equal(mixed[0], many[0])


@pytest.mark.parametrize("width", [256, 704])
def test_a_long_product_equals_its_rows_one_by_one(f16_dir: Path, width: int, kernel: str) -> None:
    """A prefill-sized product runs in chunks of rows (activations kept in L2) and in blocks
    of rows within them: every row is still bit for bit what a one-row product gives, across
    the chunks' and blocks' boundaries, and outputs past the last block of four too."""
    model = load_model(f16_dir, max_seq_len=32)
    native = model.native
    assert native is not None
    gen = torch.Generator().manual_seed(3)
    weight = (torch.randn(38, width, generator=gen) * 0.1).half()  # 9 blocks of 4 and 2 more
    x = torch.randn(301, width, generator=gen)  # 301 rows: several chunks and an odd tail
    out = torch.empty(301, 38)
    native.product(x, weight, out)
    for r in (0, 1, 5, 6, 11, 45, 46, 127, 128, 129, 299, 300):
        one = torch.empty(1, 38)
        native.product(x[r : r + 1].contiguous(), weight, one)
        assert torch.equal(out[r], one[0]), r
    assert torch.allclose(out, x @ weight.float().T, atol=1e-3, rtol=1e-4)


def test_every_number_of_rows_equals_its_rows_one_by_one(f16_dir: Path, kernel: str) -> None:
    """1 to 14 rows, each kernel's every block of rows (the wide kernel's twelve and its tails
    of one to eleven from 3 rows on, two rows a block below): bit for bit one-row products."""
    model = load_model(f16_dir, max_seq_len=32)
    native = model.native
    assert native is not None
    gen = torch.Generator().manual_seed(4)
    weight = (torch.randn(20, 64, generator=gen) * 0.1).half()
    for n in range(1, 15):
        x = torch.randn(n, 64, generator=gen)
        out = torch.empty(n, 20)
        native.product(x, weight, out)
        for r in range(n):
            one = torch.empty(1, 20)
            native.product(x[r : r + 1].contiguous(), weight, one)
            assert torch.equal(out[r], one[0]), (n, r)


@pytest.mark.skipif(not CAN_BUILD, reason="needs x86-64 with AVX2 and a C compiler")
def test_the_kernels_profile_splits_forwards_into_products_and_the_rest(f16_dir: Path) -> None:
    """The benchmark's split of a step (issue 27): counted only while on, products inside the
    forwards' time, the LM head's product apart, reset on every read."""
    model = load_model(f16_dir, max_seq_len=64)
    cache = model.new_cache(max_batch_size=1, max_seq_len=64)
    native_step.profile(False)  # zero whatever an earlier test left

    def forward(position: int) -> None:
        with torch.no_grad():
            model(torch.tensor([[3]]), torch.tensor([[position]]), cache, torch.tensor([0]))

    forward(0)
    assert native_step.profile(True) == (0.0, 0.0, 0, 0.0)  # off: nothing counted
    for position in (1, 2, 3):
        forward(position)
    counted = native_step.profile(True)
    assert counted.calls == 3
    assert 0 < counted.layer_products < counted.forwards
    assert counted.products > 0  # the LM head, outside spectool_forward
    forward(4)
    again = native_step.profile(False)
    assert again.calls == 1  # the read before reset the counters
    forward(5)
    assert native_step.profile(False).calls == 0


@pytest.mark.skipif(not CAN_BUILD, reason="needs x86-64 with AVX2 and a C compiler")
def test_bad_calls_raise_as_the_pytorch_path_does(f16_dir: Path) -> None:
    model = load_model(f16_dir, max_seq_len=32)
    assert model.native is not None
    cache = model.new_cache(max_batch_size=2, max_seq_len=32)
    with torch.no_grad():
        with pytest.raises(ValueError, match="hidden_layers"):
            model(torch.tensor([[1]]), torch.tensor([[0]]), cache, torch.tensor([0]), None, [0, 0])
        with pytest.raises(ValueError, match="position"):
            model(torch.tensor([[1]]), torch.tensor([[40]]), cache, torch.tensor([0]))


def test_models_the_kernel_does_not_cover_keep_the_pytorch_path(tmp_path: Path) -> None:
    """Biases, q/k norms and weights float16 does not hold stay on PyTorch (bind gives None)."""
    cases = {
        "qwen2-bias": write_checkpoint(tmp_path / "q2", "qwen2", save_dtype=torch.float16),
        "qwen3-qknorm": write_checkpoint(
            tmp_path / "q3", "qwen3", head_dim=8, save_dtype=torch.float16
        ),
        "float32-weights": write_checkpoint(tmp_path / "f32", seed=3),
    }
    for name, folder in cases.items():
        assert load_model(folder, max_seq_len=32).native is None, name


def test_no_compiler_or_switched_off_means_the_pytorch_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, f16_dir: Path
) -> None:
    """A failed build or SPECTOOL_NATIVE=0 is a reason, not an error: the model still loads
    and runs on PyTorch."""
    for fn in (native_step.library, native_step.unavailable_reason, native_step._load):
        monkeypatch.setattr(native_step, fn.__name__, fn.__wrapped__)  # no cached answers
    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECTOOL_NATIVE", "0")
    assert native_step.unavailable_reason() == "SPECTOOL_NATIVE=0"
    assert load_model(f16_dir, max_seq_len=32).native is None
    monkeypatch.delenv("SPECTOOL_NATIVE")
    if not CAN_BUILD:
        return
    monkeypatch.setenv("CC", "/bin/false")
    reason = native_step.unavailable_reason()
    assert reason is not None and reason.startswith("building native_step.c failed")
    model = load_model(f16_dir, max_seq_len=32)
    assert model.native is None
    with torch.no_grad():
        cache = model.new_cache(max_batch_size=1, max_seq_len=32)
        assert model(
            torch.tensor([[1, 2]]), torch.arange(2)[None], cache, torch.tensor([0])
        ).shape == (1, 2, 64)
    assert not list((tmp_path / "cache").rglob("*.so"))  # nothing half-built left behind
    monkeypatch.delenv("CC")
    assert native_step.unavailable_reason() is None
    assert len(list((tmp_path / "cache" / "native").glob("native_step-*.so"))) == 1


@pytest.mark.skipif(not CAN_BUILD, reason="needs x86-64 with AVX2 and a C compiler")
@pytest.mark.parametrize("method", ["draft_model", "ngram", "eagle3"])
def test_greedy_speculation_on_the_kernel_equals_plain_decoding(
    tmp_path_factory: pytest.TempPathFactory, method: str
) -> None:
    """Requests joining mid-run, eos on and off, k = 1..4, target (and draft model) on the C
    step: the target's own greedy output every time, drafts both accepted and rejected."""
    from spectool.engine.engine import Engine, EngineConfig

    from .helpers import write_eagle3_head
    from .test_engine import _run_mix, _solo_outputs

    root = tmp_path_factory.mktemp("greedy16")
    target = write_checkpoint(root / "t", seed=1, save_dtype=torch.float16)
    drafter = {
        "draft_model": write_checkpoint(root / "d", seed=1, noise=0.25, save_dtype=torch.float16),
        "eagle3": write_eagle3_head(root / "h", target, seed=5, draft_vocab_size=48, layers=[0, 1]),
    }.get(method)
    plain = Engine(target, config=EngineConfig(method="none"))
    assert plain.target.native is not None
    baseline = _solo_outputs(plain)
    accepted = drafted = 0
    for k in (1, 2, 4):
        engine = Engine(
            target, drafter, EngineConfig(method=method, max_draft_len=k, max_batch_size=4)
        )
        assert engine.target.native is not None
        outputs, _ = _run_mix(engine)
        assert outputs == baseline, f"k={k}"
        stats = engine.drain_stats()
        accepted += sum(s.num_accepted_tokens for s in stats)
        drafted += sum(s.num_draft_tokens for s in stats)
    assert drafted > 0
    if method == "draft_model":
        assert 0 < accepted < drafted


@pytest.mark.skipif(not CAN_BUILD, reason="needs x86-64 with AVX2 and a C compiler")
@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
def test_the_demo_drafting_layers_run_on_the_kernel_as_on_pytorch(kind: str) -> None:
    """The shipped EAGLE-3 head and MTP module (float16) run their layer on the kernel: the
    same outputs as their PyTorch forward, over a prefill-shaped call with padding and then a
    chain step, and the same keys and values in their caches."""
    from spectool.ckpt.refs import builtin_path
    from spectool.engine.eagle3_head import load_eagle3_head
    from spectool.engine.model import make_step
    from spectool.engine.mtp_module import load_mtp_module

    target = load_model(builtin_path("demo-target"), max_seq_len=64)
    if kind == "eagle3":
        module, layers = load_eagle3_head(
            builtin_path("demo-eagle3"), target.args, torch.device("cpu"), torch.float32, 64, True
        )
        width = len(layers) * target.args.dim
    else:
        module = load_mtp_module(
            builtin_path("demo-target-mtp"),
            target.args,
            target.output,
            torch.device("cpu"),
            torch.float32,
            64,
            pack_fp16=True,
        )
        width = target.args.dim
    assert module.native is not None
    gen = torch.Generator().manual_seed(3)
    calls = [  # (positions [B, T], slots, hidden width): a padded prefill, then a chain step
        (torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, -1, -1]]), torch.tensor([2, 0]), width),
        (torch.tensor([[5], [3]]), torch.tensor([2, 0]), target.args.dim),
    ]
    caches = [module.new_cache(4, 64) for _ in "ab"]
    with torch.no_grad():
        for positions, slots, w in calls:
            n = positions.numel()
            embeds = torch.randn(n, target.args.dim, generator=gen)
            hidden = torch.randn(n, w, generator=gen)
            got = module.native.forward(embeds, hidden, positions, slots, caches[0])
            step = make_step(
                module.args, module.rope_cos_sin, positions, caches[1], slots, target.output.weight
            )
            want = module.forward(embeds, hidden, step)
            keep = (positions.reshape(-1) >= 0).nonzero().squeeze(1)
            assert (got[keep] - want[keep]).abs().max() < 1e-4
    assert (caches[0].kv - caches[1].kv).abs().max() < 1e-4

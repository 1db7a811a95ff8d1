"""The decoder layers of a CPU forward in one C call (``native_step.c``), built on first use.

Why: at decode sizes on a CPU, the eager model spends two thirds of a step in PyTorch's operator
overhead (about 1,280 operators of 1-5 us each per step of the demo target), not in its matrix
work (issue 27). ``native_step.c`` runs every layer of a forward of N rows in one call: float16
weights widened in registers, float32 activations, sums and KV cache, AVX2 with FMA and F16C;
where the CPU has AVX-512 (F, VL, DQ), products of 3 rows or more (a verify pass, a batch, a
prefill) run on 512-bit vectors, each widened weight shared by up to twelve rows, and attention
passes over keys and values for two query heads at once (:func:`wide_rows`).

It is built with the system's C compiler (``cc``, or ``$CC``) into spectool's cache folder,
keyed by the source's hash, written atomically; a machine without a compiler, or a CPU without
AVX2, keeps the PyTorch path (same results to float rounding, slower). ``SPECTOOL_NATIVE=0``
turns it off. Each row's arithmetic does not depend on the other rows of the call, so a verify
pass of k + 1 rows reproduces k + 1 single-row steps bit for bit (greedy speculative decoding
repeats plain greedy decoding).

Only what the demo models and plain Llama / Qwen2-without-bias checkpoints need is covered:
float32 weights that float16 holds exactly, no projection biases, no q/k norm, widths that are
multiples of 8; anything else keeps the PyTorch path (:func:`bind` returns None).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

if TYPE_CHECKING:
    from spectool.engine.kv_cache import KVCache

# A spectool.engine.model.Transformer (model.py imports this module: no import back).
Transformer = Any

SOURCE = Path(__file__).with_name("native_step.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fPIC", "-shared")
ABI = 4
_P = ctypes.c_void_p
_I = ctypes.c_int64


class _Layer(ctypes.Structure):
    _fields_ = [
        ("attn_norm", _P),
        ("qkv_in", _I),
        *[(name, _P) for name in ("wqkv", "wo", "ffn_norm", "w13", "w2")],
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        *[(name, _I) for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim")],
        ("hidden", _I),
        ("eps", ctypes.c_double),
        ("layers", ctypes.POINTER(_Layer)),
        ("final_norm", _P),
        ("rope", _P),
        ("max_pos", _I),
    ]


def _disabled() -> str | None:
    if os.environ.get("SPECTOOL_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return "SPECTOOL_NATIVE=0"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"CPU {platform.machine()} (needs x86-64 with AVX2)"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return f"CPU capability {capability} (needs AVX2)"
    return None


@functools.cache
def library() -> ctypes.CDLL | None:
    """The built kernel (built now if this source was never built here), or None (see
    :func:`unavailable_reason`)."""
    return None if unavailable_reason() else _load()


@functools.cache
def unavailable_reason() -> str | None:
    """Why the native step is not used on this machine, or None when it is."""
    reason = _disabled()
    if reason:
        return reason
    try:
        _load()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"building {SOURCE.name} failed: {str(exc).strip().splitlines()[-1][:200]}"
    return None


@functools.cache
def _load() -> ctypes.CDLL:
    from spectool.ckpt.hub import cache_dir

    source = SOURCE.read_bytes()
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler (cc or $CC) on PATH")
    key = hashlib.sha256(source + " ".join((compiler, *FLAGS)).encode()).hexdigest()[:16]
    folder = cache_dir() / "native"
    target = folder / f"native_step-{key}.so"
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            built = Path(tmp) / target.name
            done = subprocess.run(  # noqa: S603 (fixed arguments, no shell)
                [compiler, *FLAGS, str(SOURCE), "-o", str(built), "-lm"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if done.returncode != 0:
                raise OSError(done.stderr or f"{compiler} exited with {done.returncode}")
            os.replace(built, target)  # atomic: a concurrent builder writes the same bytes
    lib = ctypes.CDLL(str(target))
    lib.spectool_native_abi.restype = ctypes.c_int
    if lib.spectool_native_abi() != ABI:
        raise OSError(f"{target} has another ABI")
    lib.spectool_scratch_floats.restype = _I
    lib.spectool_scratch_floats.argtypes = [ctypes.POINTER(_Model), _I, _I]
    lib.spectool_forward.restype = ctypes.c_int
    lib.spectool_forward.argtypes = [ctypes.POINTER(_Model), _I, _P, _P, _P, _P, _I, _I, _I]
    lib.spectool_forward.argtypes += [_P, _P, _P, _P, _P]
    lib.spectool_wide_rows.restype = ctypes.c_int
    lib.spectool_wide_rows.argtypes = [ctypes.c_int]
    lib.spectool_matmul.restype = None
    lib.spectool_matmul.argtypes = [_P, _I, _I, _P, _I, _P]
    lib.spectool_profile.restype = None
    lib.spectool_profile.argtypes = [ctypes.c_int, ctypes.POINTER(_I * 4)]
    return lib


class Profile(NamedTuple):
    """What :func:`profile` counted: seconds and calls."""

    layer_products: float  # the layers' weight products, inside the forwards
    forwards: float  # whole spectool_forward calls (every layer)
    calls: int  # spectool_forward calls
    products: float  # spectool_matmul calls (the LM head)


def profile(on: bool) -> Profile:
    """What the kernel counted since the last call; the counting (two clock reads per product)
    then goes on or off. For benchmarks: it splits a step's time into matrix work and the rest,
    in the same steps."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"no native step: {unavailable_reason()}")
    out = (_I * 4)()
    lib.spectool_profile(int(on), ctypes.byref(out))
    return Profile(out[0] / 1e9, out[1] / 1e9, out[2], out[3] / 1e9)


def wide_rows(on: bool | None = None) -> bool:
    """Whether products of 3 rows or more run on the AVX-512 kernel (512-bit vectors, up to
    twelve rows sharing each widened weight; 1.3-1.45x at 3-80 rows on a Zen 5 core) rather than
    two rows a block, and attention on 512-bit passes (two query heads of a group a pass over
    the keys, 64 dimensions of two heads a pass over the values). ``on`` switches it (True has
    effect only where the CPU has AVX-512 F, VL and DQ); the numbers are the same bit for bit
    either way, which the tests check by switching."""
    lib = library()
    if lib is None:
        raise RuntimeError(f"no native step: {unavailable_reason()}")
    return bool(lib.spectool_wide_rows(-1 if on is None else int(on)))


def _f16(weight: Tensor) -> Tensor | None:
    """``[in, out]`` float32 -> ``[out, in]`` float16, when float16 holds every value."""
    half = weight.detach().t().contiguous().half()
    return half if torch.equal(half.float(), weight.detach().t()) else None


class _Bound:
    """Layers bound to the kernel: the table of pointers, the tensors that own them (float16
    weights ``[out, in]``, norms, rotary table), a reusable scratch buffer."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        args: Any,  # ModelArgs
        layers: list[dict[str, Tensor]],  # attn_norm (or absent), wqkv, wo, ffn_norm, w13, w2
        final_norm: Tensor | None,
        rope: Tensor,  # [max_pos, 2, head_dim] float32
    ) -> None:
        self.lib = lib
        self.args = args
        self._tensors = [t for entry in layers for t in entry.values()] + [rope]
        self._tensors += [final_norm] if final_norm is not None else []
        self._layers = (_Layer * len(layers))()
        for i, entry in enumerate(layers):
            for name, tensor in entry.items():
                setattr(self._layers[i], name, tensor.data_ptr())
            self._layers[i].qkv_in = entry["wqkv"].shape[1]
        m = self._struct = _Model()
        m.dim, m.n_layers, m.n_heads = args.dim, len(layers), args.n_heads
        m.n_kv_heads, m.head_dim, m.hidden = args.n_kv_heads, args.head_dim, args.intermediate_size
        m.eps = float(args.norm_eps)
        m.layers = self._layers
        m.final_norm = final_norm.data_ptr() if final_norm is not None else None
        m.rope, m.max_pos = rope.data_ptr(), rope.shape[0]
        self._scratch = torch.empty(0)
        self._none = torch.empty(0, 0)  # the captured rows of a call that captures none
        self._captures: dict[tuple[int, ...], Tensor] = {}  # layer lists as int64 tensors

    def weights(self) -> list[Tensor]:
        return [t for t in self._tensors if t.dtype == torch.float16]

    def product(self, x: Tensor, weight: Tensor, out: Tensor) -> None:
        """``out = x @ weight.T`` with the kernel's product (``x`` [N, in] float32 contiguous,
        ``weight`` [out, in] float16, ``out`` [N, out] float32)."""
        self.lib.spectool_matmul(
            x.data_ptr(), x.shape[0], x.shape[1], weight.data_ptr(), weight.shape[0], out.data_ptr()
        )

    def run(
        self,
        x: Tensor,  # [N, dim] float32 contiguous, updated in place: the residual stream
        pos: Tensor,  # [N] int64 contiguous, -1 = padding
        rows: Tensor,  # [N] int64 contiguous: cache slots
        cache: KVCache,
        hidden_layers: Sequence[int] = (),
        attn_in: Tensor | None = None,  # [N, qkv_in] for layers without attn_norm
    ) -> tuple[Tensor, Tensor]:
        """One call through every layer; returns (final-normed rows (junk without a final
        norm), captured layer outputs ``[N, len(hidden_layers) * dim]``)."""
        n, dim = x.shape
        layers = tuple(hidden_layers)
        capture = self._captures.get(layers)
        if capture is None:
            capture = self._captures[layers] = torch.tensor(layers, dtype=torch.int64)
        captured = x.new_empty(n, len(layers) * dim) if layers else self._none  # returned
        normed = x.new_empty(n, dim)
        need = self.lib.spectool_scratch_floats(ctypes.byref(self._struct), n, cache.max_seq_len)
        if self._scratch.numel() < need:
            self._scratch = torch.empty(need, dtype=torch.float32)
        kv = cache.kv
        status = self.lib.spectool_forward(
            ctypes.byref(self._struct),
            n,
            x.data_ptr(),
            pos.data_ptr(),
            rows.data_ptr(),
            kv.data_ptr(),
            kv.shape[1],
            kv.shape[3],
            len(hidden_layers),
            capture.data_ptr(),
            captured.data_ptr(),
            normed.data_ptr(),
            attn_in.data_ptr() if attn_in is not None else None,
            self._scratch.data_ptr(),
        )
        if status != 0:
            raise ValueError(
                f"a position or slot lies outside the rope table ({self._struct.max_pos}) "
                f"or the cache ({kv.shape[1]} slots, {kv.shape[3]} positions)"
                if status == -1
                else "a layer without its norm needs attn_in"
            )
        return normed, captured


def _rows(positions: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
    """Token-major positions and cache slots ``[B * T]`` of a ``[B, T]`` call."""
    bsz, seqlen = positions.shape
    rows = slots if seqlen == 1 else slots[:, None].expand(bsz, seqlen).reshape(-1)
    return positions.reshape(-1).contiguous(), rows.contiguous()


def _layer_weights(attn: Any, ffn: Any) -> dict[str, Tensor] | None:
    """The float16 ``[out, in]`` copies of a layer's projections, or None where one has a bias,
    the attention a q/k norm, or a weight float16 does not hold."""
    if attn.q_norm is not None or any(p.has_bias for p in (attn.wqkv, attn.wo, ffn.w13, ffn.w2)):
        return None
    entry = {}
    for name, proj in (("wqkv", attn.wqkv), ("wo", attn.wo), ("w13", ffn.w13), ("w2", ffn.w2)):
        half = _f16(proj.weight)
        if half is None:
            return None
        entry[name] = half
    return entry


def _fits(args: Any, weight: Tensor, rope: Tensor | None) -> bool:
    """Whether the kernel takes a model of these shapes, dtype and device at all."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or rope is None:
        return False
    widths = (args.dim, args.n_heads * args.head_dim, args.intermediate_size, args.head_dim)
    return not (any(w % 8 for w in widths) or args.head_dim > 512 or args.n_heads % args.n_kv_heads)


class NativeModel:
    """A :class:`~spectool.engine.model.Transformer` on the kernel: its layers (:class:`_Bound`)
    and its LM head as a float16 ``[V, dim]`` copy (the kernel's product: rows independent)."""

    def __init__(self, model: Transformer, bound: _Bound, head: Tensor) -> None:
        self.model = model
        self.bound = bound
        self.head = head
        self._tied = bool(model.args.tie_word_embeddings)

    def weights(self) -> list[Tensor]:
        """Every float16 weight the kernel multiplies by (``[out, in]``), the LM head last."""
        return [*self.bound.weights(), self.head]

    def product(self, x: Tensor, weight: Tensor, out: Tensor) -> None:
        """The kernel's product, ``out = x @ weight.T`` (for benchmarks' floors)."""
        self.bound.product(x, weight, out)

    def embed(self, ids: Tensor) -> Tensor:
        """Embedding rows ``[N, dim]`` of ``ids`` ``[N]``, fresh: rows of the float16 LM head
        when the embeddings are tied to it (a contiguous copy of the same values; the float32
        table is its transposed view, slow to gather from), else of the embedding table."""
        if self._tied:
            return self.head.index_select(0, ids).float()
        return self.model.tok_embeddings.weight.index_select(0, ids)

    def forward(
        self,
        tokens: Tensor,  # [B, T]
        positions: Tensor,  # [B, T], -1 = padding
        cache: KVCache,
        slots: Tensor,  # [B]
        select: Tensor | None,
        hidden_layers: Sequence[int],
    ) -> Any:
        """As :meth:`Transformer.forward` with a cache (which calls it)."""
        dim = self.model.args.dim
        bsz, seqlen = positions.shape
        x = self.embed(tokens.reshape(-1))  # [N, dim], fresh: the residual stream
        pos, rows = _rows(positions, slots)
        normed, captured = self.bound.run(x, pos, rows, cache, hidden_layers)
        out = normed.view(bsz, seqlen, dim)
        if select is not None:
            out = torch.gather(out, 1, select[:, :, None].expand(-1, -1, dim))
        steps = out.shape[1]
        out = out.reshape(bsz * steps, dim).contiguous()
        vocab = self.head.shape[0]
        logits = out.new_empty(bsz * steps, vocab)
        self.bound.product(out, self.head, logits)
        logits = logits.view(bsz, steps, vocab)
        if not hidden_layers:
            return logits
        return logits, captured.view(bsz, seqlen, -1)


def bind(model: Transformer) -> NativeModel | None:
    """The model bound to the kernel, or None where the kernel or the model does not fit it."""
    args = model.args
    if not _fits(args, model.tok_embeddings.weight, model.rope_cos_sin):
        return None
    lib = library()
    if lib is None:
        return None
    layers = []
    for layer in model.layers:
        entry = _layer_weights(layer.attention, layer.feed_forward)
        if entry is None:
            return None
        entry["attn_norm"] = layer.attention_norm.weight.detach().contiguous()
        entry["ffn_norm"] = layer.ffn_norm.weight.detach().contiguous()
        layers.append(entry)
    head = _f16(model.output.weight)
    if head is None or model.output.has_bias:
        return None
    bound = _Bound(
        lib, args, layers, model.norm.weight.detach().contiguous(), model.rope_cos_sin.contiguous()
    )
    return NativeModel(model, bound, head)


def _one_layer(
    args: Any, like: Tensor, rope: Tensor | None, owner: Any
) -> tuple[ctypes.CDLL, dict[str, Tensor]] | None:
    """The kernel and the float16 weights of ``owner``'s one decoder layer (its ``attention``
    and ``feed_forward``), or None where either does not fit."""
    if not _fits(args, like, rope):
        return None
    lib = library()
    entry = _layer_weights(owner.attention, owner.feed_forward) if lib is not None else None
    return None if lib is None or entry is None else (lib, entry)


class NativeHead:
    """An EAGLE-3 head's decoder layer on the kernel (:class:`~spectool.engine.eagle3_head.
    Eagle3Head`): ``fc`` and the two input norms stay on PyTorch, the layer is one call."""

    def __init__(self, head: Any, bound: _Bound) -> None:
        self.head = head
        self.bound = bound

    def forward(
        self,
        embeds: Tensor,  # [N, dim]
        hidden: Tensor,  # [N, C]
        positions: Tensor,  # [B, T], -1 = padding
        slots: Tensor,  # [B]
        cache: KVCache,
    ) -> Tensor:
        """As :meth:`Eagle3Head.forward`: the layer's pre-norm output ``[N, dim]``."""
        head = self.head
        if hidden.shape[-1] != head.args.dim:
            hidden = head.fc.forward(hidden)
        both = torch.cat(
            [head.input_layernorm.forward(embeds), head.hidden_norm.forward(hidden)], dim=-1
        )
        x = hidden.clone(memory_format=torch.contiguous_format)  # the residual, updated in place
        pos, rows = _rows(positions, slots)
        self.bound.run(x, pos, rows, cache, attn_in=both.contiguous())
        return x


def bind_eagle3_head(head: Any) -> NativeHead | None:
    """An :class:`~spectool.engine.eagle3_head.Eagle3Head` bound to the kernel, or None."""
    found = _one_layer(head.args, head.lm_head.weight, head.rope_cos_sin, head)
    if found is None:
        return None
    lib, entry = found
    entry["ffn_norm"] = head.post_attention_layernorm.weight.detach().contiguous()
    return NativeHead(head, _Bound(lib, head.args, [entry], None, head.rope_cos_sin.contiguous()))


class NativeMtp:
    """An MTP module's decoder layer and output norm on the kernel (:class:`~spectool.engine.
    mtp_module.MtpModule`): the input norms and ``eh_proj`` stay on PyTorch."""

    def __init__(self, module: Any, bound: _Bound) -> None:
        self.module = module
        self.bound = bound

    def forward(
        self, embeds: Tensor, hidden: Tensor, positions: Tensor, slots: Tensor, cache: KVCache
    ) -> Tensor:
        """As :meth:`MtpModule.forward`: the normed output ``[N, dim]``."""
        module = self.module
        both = torch.cat([module.enorm.forward(embeds), module.hnorm.forward(hidden)], dim=-1)
        x = module.eh_proj.forward(both).contiguous()  # fresh: updated in place
        pos, rows = _rows(positions, slots)
        normed, _ = self.bound.run(x, pos, rows, cache)
        return normed


def bind_mtp_module(module: Any) -> NativeMtp | None:
    """An :class:`~spectool.engine.mtp_module.MtpModule` bound to the kernel, or None."""
    block = module.block
    found = _one_layer(module.args, module.eh_proj.weight, module.rope_cos_sin, block)
    if found is None:
        return None
    lib, entry = found
    entry["attn_norm"] = block.attention_norm.weight.detach().contiguous()
    entry["ffn_norm"] = block.ffn_norm.weight.detach().contiguous()
    final = module.head_norm.weight.detach().contiguous()
    rope = module.rope_cos_sin.contiguous()
    return NativeMtp(module, _Bound(lib, module.args, [entry], final, rope))

"""The decoder layers of a CPU forward in one C call (``native_step.c``), built on first use.

Why: at decode sizes on a CPU, the eager model spends two thirds of a step in PyTorch's operator
overhead (about 1,280 operators of 1-5 us each per step of the demo target), not in its matrix
work (issue 27). ``native_step.c`` runs every layer of a forward of N rows in one call: float16
weights widened in registers, float32 activations, sums and KV cache, AVX2 with FMA and F16C.

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
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from spectool.engine.kv_cache import KVCache

# A spectool.engine.model.Transformer (model.py imports this module: no import back).
Transformer = Any

SOURCE = Path(__file__).with_name("native_step.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fPIC", "-shared")
ABI = 1
_P = ctypes.c_void_p
_I = ctypes.c_int64


class _Layer(ctypes.Structure):
    _fields_ = [(name, _P) for name in ("attn_norm", "wqkv", "wo", "ffn_norm", "w13", "w2")]


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
    lib.spectool_forward.argtypes += [_P, _P, _P, _P]
    lib.spectool_matmul.restype = None
    lib.spectool_matmul.argtypes = [_P, _I, _I, _P, _I, _P]
    return lib


def _f16(weight: Tensor) -> Tensor | None:
    """``[in, out]`` float32 -> ``[out, in]`` float16, when float16 holds every value."""
    half = weight.detach().t().contiguous().half()
    return half if torch.equal(half.float(), weight.detach().t()) else None


class NativeModel:
    """A :class:`~spectool.engine.model.Transformer` bound to the kernel: its float16 weights
    (``[out, in]``, kept alive here), the layer table, a reusable scratch buffer."""

    def __init__(
        self, lib: ctypes.CDLL, model: Transformer, tensors: list[Tensor], head: Tensor
    ) -> None:
        self.lib = lib
        self.model = model
        self.head = head  # the LM head, [V, dim] float16
        self._tensors = tensors  # owners of every pointer in the table
        args = model.args
        self._layers = (_Layer * args.n_layers)()
        self._struct = _Model()
        self._scratch = torch.empty(0)

    def weights(self) -> list[Tensor]:
        """Every float16 weight the kernel multiplies by (``[out, in]``), the LM head last."""
        return [t for t in self._tensors if t.dtype == torch.float16] + [self.head]

    def product(self, x: Tensor, weight: Tensor, out: Tensor) -> None:
        """``out = x @ weight.T`` with the kernel's product (``x`` [N, in] float32 contiguous,
        ``weight`` [out, in] float16, ``out`` [N, out] float32): for benchmarks' floors."""
        self.lib.spectool_matmul(
            x.data_ptr(), x.shape[0], x.shape[1], weight.data_ptr(), weight.shape[0], out.data_ptr()
        )

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
        model, args = self.model, self.model.args
        bsz, seqlen = positions.shape
        n = bsz * seqlen
        x = model.tok_embeddings.weight.index_select(0, tokens.reshape(-1))  # [N, dim], fresh
        pos = positions.reshape(-1).contiguous()
        rows = slots if seqlen == 1 else slots[:, None].expand(bsz, seqlen).reshape(-1)
        rows = rows.contiguous()
        capture = torch.tensor(list(hidden_layers), dtype=torch.int64)
        captured = x.new_empty(n, len(hidden_layers) * args.dim)
        normed = x.new_empty(n, args.dim)
        max_len = cache.max_seq_len
        need = self.lib.spectool_scratch_floats(ctypes.byref(self._struct), n, max_len)
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
            self._scratch.data_ptr(),
        )
        if status != 0:
            raise ValueError(
                f"a position or slot lies outside the rope table ({self._struct.max_pos}) "
                f"or the cache ({kv.shape[1]} slots, {kv.shape[3]} positions)"
            )
        out = normed.view(bsz, seqlen, args.dim)
        if select is not None:
            out = torch.gather(out, 1, select[:, :, None].expand(-1, -1, args.dim))
        steps = out.shape[1]
        out = out.reshape(bsz * steps, args.dim).contiguous()
        vocab = self.head.shape[0]
        logits = out.new_empty(bsz * steps, vocab)
        self.product(out, self.head, logits)
        logits = logits.view(bsz, steps, vocab)
        if not hidden_layers:
            return logits
        return logits, captured.view(bsz, seqlen, -1)


def bind(model: Transformer) -> NativeModel | None:
    """The model bound to the kernel, or None where the kernel or the model does not fit it."""
    args = model.args
    weight = model.tok_embeddings.weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or model.rope_cos_sin is None:
        return None
    widths = (args.dim, args.n_heads * args.head_dim, args.intermediate_size, args.head_dim)
    if any(w % 8 for w in widths) or args.head_dim > 512 or args.n_heads % args.n_kv_heads:
        return None
    lib = library()
    if lib is None:
        return None
    tensors: list[Tensor] = []
    table: list[dict[str, Tensor]] = []
    for layer in model.layers:
        attn, ffn = layer.attention, layer.feed_forward
        if attn.q_norm is not None or any(
            p.has_bias for p in (attn.wqkv, attn.wo, ffn.w13, ffn.w2)
        ):
            return None
        entry = {
            "attn_norm": layer.attention_norm.weight.detach().contiguous(),
            "ffn_norm": layer.ffn_norm.weight.detach().contiguous(),
        }
        for name, proj in (("wqkv", attn.wqkv), ("wo", attn.wo), ("w13", ffn.w13), ("w2", ffn.w2)):
            half = _f16(proj.weight)
            if half is None:
                return None
            entry[name] = half
        if any(t.dtype != torch.float32 for k, t in entry.items() if k.endswith("norm")):
            return None
        table.append(entry)
        tensors.extend(entry.values())
    final_norm = model.norm.weight.detach().contiguous()
    rope = model.rope_cos_sin.contiguous()
    head = _f16(model.output.weight)
    if head is None or model.output.has_bias:
        return None
    tensors += [final_norm, rope]
    native = NativeModel(lib, model, tensors, head)
    for i, entry in enumerate(table):
        for name, tensor in entry.items():
            setattr(native._layers[i], name, tensor.data_ptr())
    s = native._struct
    s.dim, s.n_layers, s.n_heads = args.dim, args.n_layers, args.n_heads
    s.n_kv_heads, s.head_dim, s.hidden = args.n_kv_heads, args.head_dim, args.intermediate_size
    s.eps = float(args.norm_eps)
    s.layers = native._layers
    s.final_norm, s.rope, s.max_pos = final_norm.data_ptr(), rope.data_ptr(), rope.shape[0]
    return native

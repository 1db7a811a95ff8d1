"""A Llama / Qwen2 / Qwen3 decoder in plain PyTorch, built from a Hugging Face ``config.json``.

In the spirit of gpt-fast's ``model.py``: one ``ModelArgs``, one ``Transformer``, RMSNorm, SwiGLU,
grouped-query attention and rotary embeddings in Hugging Face's "rotate half" layout, so weights
load without any permutation. Every forward carries per-row positions, which lets one batch mix
requests of different lengths (continuous batching) and lets padding be marked with position -1.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from spectool.engine.kv_cache import CachePlan, KVCache
from spectool.engine.model_args import (  # noqa: F401 (re-exported: model's public names)
    SUPPORTED_ARCHITECTURES,
    SUPPORTED_ROPE_TYPES,
    ModelArgs,
    RopeScaling,
    rope_inv_freq,
    rope_tables,
)


def apply_rope(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """Rotate ``x`` [N, heads, D] by ``cos`` / ``sin_signed`` [N, 1, D] (in x's dtype), in place.

    Hugging Face's ``x * cos + rotate_half(x) * sin`` with rotate-half's sign folded into the
    table (``sin_signed`` = ``[-sin_1, sin_2]`` halves): ``x * cos + [x2, x1] * sin_signed``.
    Written back into ``x`` (which may be a view into the q/k/v projection output) and
    returned. Separate multiply and add, each rounded as in Hugging Face's version (not
    ``addcmul``: a fused multiply-add rounds differently in vectorized and scalar loops, which
    would make results depend on the batch shape).
    """
    n, heads, dim = x.shape
    swapped = x.view(n, heads, 2, dim // 2).flip(2).view(n, heads, dim)  # [x2, x1], a copy
    swapped.mul_(sin_signed)
    return x.mul_(cos).add_(swapped)


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 like Hugging Face's ``LlamaRMSNorm``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32:
            # [x, -x] has mean 0 and mean square mean(x^2), so its layer norm starts with
            # x / sqrt(mean(x^2) + eps): one fused kernel where rms_norm runs about eight ops.
            dim = x.shape[-1]
            both = torch.cat([x, x.neg()], dim=-1)
            return torch.layer_norm(both, (2 * dim,), None, None, self.eps)[..., :dim] * self.weight
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


# Rows up to which a packed projection uses fbgemm's one-threaded kernel however many threads
# torch has (decode steps and verify passes of small batches).
PACKED_MAX_ROWS = 64


def fp16_weight_kernel() -> Any:
    """fbgemm's fp16-weight, fp32-activation matrix product, or None where this torch lacks it.

    ``torch.fbgemm_linear_fp16_weight`` is marked deprecated (it warns once per process) but is
    the fastest way torch offers to it: ``torch.ops.quantized.linear_dynamic_fp16`` runs the same
    kernel with about twice the call overhead at decode sizes. fbgemm needs an x86 CPU with AVX2.
    """
    linear = getattr(torch, "fbgemm_linear_fp16_weight", None)
    pack = getattr(torch, "fbgemm_pack_gemm_matrix_fp16", None)
    if linear is None or pack is None or "fbgemm" not in torch.backends.quantized.supported_engines:
        return None
    return linear


class Projection(nn.Module):
    """``y = x @ weight + bias`` for ``x`` [N, in], with ``weight`` stored ``[in, out]``.

    The transpose of ``nn.Linear``'s layout (the loader transposes Hugging Face's tensors): with
    MKL on CPU, a product of a few rows against this layout takes about half the time of
    ``F.linear`` against the ``[out, in]`` one, and decoding is mostly such products.

    :meth:`pack_fp16` can add a second copy of the weight, packed in float16 for fbgemm, when
    float16 holds every value exactly (float16 checkpoints): same weights, products and sums
    still in float32, and on CPUs where MKL's float32 product of a few rows is slow (2-4x slower
    per row at 2-9 rows than at one, seen on AMD EPYC) it takes about half the time. Its rows are
    also computed independently of how many rows there are (MKL's are not). fbgemm's kernel runs
    on one thread, so calls of more than :data:`PACKED_MAX_ROWS` rows (prefills, large batches)
    stay on ``torch.mm`` when torch has more than one thread (measured with 2 threads: torch.mm
    is faster from about 100 rows on).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.has_bias = bias  # a plain attribute: cheaper to test than the parameter
        self.packed: Tensor | None = None  # fbgemm's float16 copy of the weight, when packed
        self._packed_bias: Tensor | None = None  # fbgemm wants a bias: the bias or zeros

    def pack_fp16(self) -> bool:
        """Use fbgemm's float16-weight kernel from now on, if it is lossless and available.

        Lossless: the weight is float32, on the CPU, and float16 represents every value exactly.
        Returns whether the weight was packed. The float32 weight stays (state dict, tied
        embeddings); the packed copy is half its size.
        """
        weight = self.weight.data
        if weight.dtype != torch.float32 or weight.device.type != "cpu":
            return False
        linear = fp16_weight_kernel()
        if linear is None or not torch.equal(weight.half().float(), weight):
            return False
        with warnings.catch_warnings():  # the deprecation warning, once per process
            warnings.simplefilter("ignore")
            packed = torch.fbgemm_pack_gemm_matrix_fp16(weight.t().contiguous())  # [out, in]
            bias = self.bias.data if self.bias is not None else weight.new_zeros(weight.shape[1])
            linear(weight.new_zeros(1, weight.shape[0]), packed, bias)
        self.packed, self._packed_bias = packed, bias
        return True

    def forward(self, x: Tensor) -> Tensor:  # [N, in] -> [N, out]
        if self.packed is not None and (
            x.shape[0] <= PACKED_MAX_ROWS or torch.get_num_threads() == 1
        ):
            return torch.fbgemm_linear_fp16_weight(x, self.packed, self._packed_bias)
        if self.has_bias:
            return torch.addmm(self.bias, x, self.weight)
        return torch.mm(x, self.weight)


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(gate x) * up x)``; gate_proj and up_proj are fused into ``w13`` (gate
    rows first) at load time, so one matrix product computes both."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.hidden = args.intermediate_size
        self.w13 = Projection(args.dim, 2 * args.intermediate_size, bias=args.mlp_bias)
        self.w2 = Projection(args.intermediate_size, args.dim, bias=args.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:  # [N, dim]
        gate_up = self.w13.forward(x)  # [N, 2 * hidden]
        act = F.silu(gate_up[:, : self.hidden])
        act.mul_(gate_up[:, self.hidden :])  # in place: act is a fresh tensor
        return self.w2.forward(act)


@dataclass(frozen=True)
class _Step:
    """What every layer of one forward shares, computed once in :meth:`Transformer.forward`.

    Hidden states travel token-major and flat, ``[N, dim]`` with N = B * T, so that every
    projection is one plain matrix product.
    """

    bsz: int
    seqlen: int
    cos: Tensor  # [N, 1, head_dim]
    sin_signed: Tensor  # [N, 1, head_dim], rotate-half sign folded in
    mask: Tensor | None  # [B, 1, groups * T, L] additive (0 / -inf); None = every key visible
    cache: KVCache | None
    plan: CachePlan | None


class Attention(nn.Module):
    """Grouped-query attention over the KV cache (or over the current tokens when no cache).

    GQA without copying keys and values: the ``groups`` query heads sharing a kv head are
    stacked along the time axis, so one attention call per kv head covers all of them.
    """

    def __init__(self, args: ModelArgs, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.head_dim = args.head_dim
        self.groups = args.n_heads // args.n_kv_heads
        q_size = args.n_heads * args.head_dim
        kv_size = args.n_kv_heads * args.head_dim
        self.wqkv = Projection(args.dim, q_size + 2 * kv_size, bias=args.qkv_bias)
        self.wo = Projection(q_size, args.dim, bias=args.o_bias)
        self.q_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None

    def forward(self, x: Tensor, step: _Step) -> Tensor:  # x: [N, dim] -> [N, dim]
        bsz, seqlen = step.bsz, step.seqlen
        n = bsz * seqlen
        heads, kv_heads, head_dim = self.n_heads, self.n_kv_heads, self.head_dim
        # Heads of q, k and v side by side: [N, H + 2 Hkv, D].
        qkv = self.wqkv.forward(x).view(n, heads + 2 * kv_heads, head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = apply_rope(self.q_norm.forward(qkv[:, :heads]), step.cos, step.sin_signed)
            k = apply_rope(self.k_norm.forward(qkv[:, heads:-kv_heads]), step.cos, step.sin_signed)
            kv = torch.cat([k, qkv[:, heads + kv_heads :]], dim=1)  # [N, 2 Hkv, D]
        else:  # queries and keys rotated together, in place: k and v stay side by side
            apply_rope(qkv[:, : heads + kv_heads], step.cos, step.sin_signed)
            q, kv = qkv[:, :heads], qkv[:, heads:]  # [N, H, D], [N, 2 Hkv, D]
        if step.cache is not None and step.plan is not None:
            step.cache.write_tokens(self.layer_id, step.plan, kv)
            keys, values = step.cache.read_planned(self.layer_id, step.plan)  # [B, Hkv, L, D]
        else:  # [B, Hkv, T, D]
            keys = kv[:, :kv_heads].view(bsz, seqlen, kv_heads, head_dim).transpose(1, 2)
            values = kv[:, kv_heads:].view(bsz, seqlen, kv_heads, head_dim).transpose(1, 2)
        groups = self.groups
        # [B, T, Hkv, G, D] -> [B, Hkv, G * T, D]: query head h = j * G + g reads kv head j.
        if seqlen == 1:
            q = q.view(bsz, kv_heads, groups, head_dim)
        else:
            q = q.reshape(bsz, seqlen, kv_heads, groups, head_dim).permute(0, 2, 3, 1, 4)
            q = q.reshape(bsz, kv_heads, groups * seqlen, head_dim)
        spread = step.plan.spread if step.plan is not None else None
        if spread is None:
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=step.mask)
        else:  # queries placed at their slots' rows of the range, the other rows dropped after
            wide = q.new_zeros(keys.shape[0], *q.shape[1:]).index_copy_(0, spread, q)
            y = F.scaled_dot_product_attention(wide, keys, values, attn_mask=step.mask)
            y = y.index_select(0, spread)
        if seqlen > 1:  # back to token-major
            y = y.view(bsz, kv_heads, groups, seqlen, head_dim).permute(0, 3, 1, 2, 4)
        return self.wo.forward(y.reshape(n, heads * head_dim))


class TransformerBlock(nn.Module):
    """Pre-norm block: ``h = x + attn(norm(x)); out = h + ffn(norm(h))``."""

    def __init__(self, args: ModelArgs, layer_id: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args, layer_id)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x: Tensor, step: _Step) -> Tensor:  # x: [N, dim]
        # Submodules' forward() is called directly: no hooks are used, and skipping
        # nn.Module.__call__ saves measurable time per token on CPU.
        h = x + self.attention.forward(self.attention_norm.forward(x), step)
        return h + self.feed_forward.forward(self.ffn_norm.forward(h))


def pack_rows(rows: Sequence[Sequence[int]], starts: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Ragged token rows -> padded ``tokens`` and ``positions`` ``[B, T]`` (int64, on the CPU).

    Row ``b`` holds ``rows[b]`` at positions ``starts[b], starts[b] + 1, ...``; padding is token
    0 at position -1. Built as Python lists and converted once: per-row tensor writes cost more
    than the forward itself for small models.
    """
    width = max(len(row) for row in rows)
    tokens = [[*row, *([0] * (width - len(row)))] for row in rows]
    positions = [
        [*range(start, start + len(row)), *([-1] * (width - len(row)))]
        for row, start in zip(rows, starts, strict=True)
    ]
    both = torch.tensor([tokens, positions], dtype=torch.long)  # one conversion: [2, B, T]
    return both[0], both[1]


class Transformer(nn.Module):
    """Decoder-only language model: embeddings, blocks, final norm, LM head.

    Call :meth:`setup_rope` (done by :func:`spectool.engine.load.load_model`) before the first
    forward; it fixes the longest sequence the model will see.
    """

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args, i) for i in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = Projection(args.dim, args.vocab_size, bias=False)  # weight [dim, V]
        if args.tie_word_embeddings:
            self.tie_embeddings()
        self.max_seq_len = 0
        # the layers in one C call (spectool.engine.native_step), set by enable_native()
        self.native: Any = None
        # [max_seq_len, 2, head_dim]: cos, and sin with rotate-half's sign ([-sin_1, sin_2])
        self.rope_cos_sin: Tensor | None
        self.register_buffer("rope_cos_sin", None, persistent=False)

    def tie_embeddings(self) -> None:
        """Make the embedding table a view of the LM head (``[V, dim]`` = ``[dim, V]``
        transposed): one copy of the matrix, stored the way the LM head reads it fastest.
        (``Module.to()`` would untie them; :func:`~spectool.engine.load.load_model` ties after
        moving.)"""
        self.tok_embeddings.weight = nn.Parameter(self.output.weight.t())

    def pack_fp16_weights(self) -> int:
        """Switch every projection whose weight float16 holds exactly to fbgemm's float16-weight
        kernel (:meth:`Projection.pack_fp16`); returns how many were packed."""
        return sum(m.pack_fp16() for m in self.modules() if isinstance(m, Projection))

    def enable_native(self) -> bool:
        """Run forwards with a KV cache through the C kernel from now on, where it fits this model
        and machine (:mod:`spectool.engine.native_step`); returns whether it does. Call after
        :meth:`setup_rope` (the kernel reads the rotary table)."""
        from spectool.engine.native_step import bind

        self.native = bind(self)
        return self.native is not None

    def embed(self, ids: Tensor) -> Tensor:
        """Embedding rows ``[N, dim]`` of token ids ``[N]``, a fresh tensor (from the C step's
        contiguous float16 copy when the table is tied to it: the same values, faster to gather
        than the transposed float32 view)."""
        if self.native is not None:
            return self.native.embed(ids)
        return self.tok_embeddings.weight.index_select(0, ids)

    def setup_rope(self, max_seq_len: int) -> None:
        """Precompute rotary tables for positions ``0 .. max_seq_len - 1`` on the weights' device."""
        cos, sin = rope_tables(self.args, max_seq_len)
        device = self.tok_embeddings.weight.device
        half = sin.shape[-1] // 2
        sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
        self.rope_cos_sin = torch.stack([cos, sin_signed], dim=1).to(device)
        self.max_seq_len = max_seq_len

    def new_cache(self, max_batch_size: int, max_seq_len: int) -> KVCache:
        """A KV cache shaped for this model, on its device and in its dtype."""
        weight = self.tok_embeddings.weight
        return KVCache(
            n_layers=self.args.n_layers,
            max_batch_size=max_batch_size,
            n_kv_heads=self.args.n_kv_heads,
            max_seq_len=max_seq_len,
            head_dim=self.args.head_dim,
            dtype=weight.dtype,
            device=weight.device,
        )

    def forward(
        self,
        tokens: Tensor,  # [B, T] int64
        positions: Tensor,  # [B, T] int64; -1 marks padding (not written, output is junk)
        cache: KVCache | None = None,
        slots: Tensor | None = None,  # [B] int64: the cache row of each batch row
        select: Tensor | None = None,  # [B, S] int64: only these time steps reach the LM head
        hidden_layers: Sequence[int] = (),
    ) -> Any:
        """Logits ``[B, T, V]`` (or ``[B, S, V]`` with ``select``).

        With a cache, each row's keys/values are written at its positions, then every query
        attends to cache entries ``0 .. its own position`` of its slot: what a row may see is set
        by positions alone, so entries past a slot's length (rolled-back drafts) are never read
        before being overwritten. Without a cache, tokens attend to earlier tokens of the call.

        ``hidden_layers``: decoder layers (0-based) whose output (the residual stream after the
        layer) is captured; then the result is ``(logits, hidden)`` with ``hidden``
        ``[B, T, len(hidden_layers) * dim]``, the layers' outputs side by side in the order
        given, every time step (``select`` only narrows the logits). Empty (the default): only
        the logits, and the layer loop is the plain one.
        """
        if self.rope_cos_sin is None:
            raise RuntimeError("call setup_rope() before forward()")
        bsz, seqlen = positions.shape
        if (
            self.native is not None
            and cache is not None
            and slots is not None
            and (bsz * seqlen <= PACKED_MAX_ROWS or torch.get_num_threads() == 1)
        ):
            self._check_hidden_layers(hidden_layers)
            return self.native.forward(tokens, positions, cache, slots, select, hidden_layers)
        weight = self.tok_embeddings.weight
        step = make_step(self.args, self.rope_cos_sin, positions, cache, slots, weight)
        x = self.embed(tokens.reshape(-1))  # [N, dim], N = B * T, token-major
        captured: list[Tensor] = []
        if hidden_layers:
            wanted = self._check_hidden_layers(hidden_layers)
            captured = [x] * len(hidden_layers)
            for i, layer in enumerate(self.layers):
                x = layer.forward(x, step)
                if i in wanted:
                    captured[wanted[i]] = x
        else:
            for layer in self.layers:
                x = layer.forward(x, step)
        x = x.view(bsz, seqlen, -1)  # [B, T, dim]
        if select is not None:
            x = torch.gather(x, 1, select[:, :, None].expand(-1, -1, x.shape[-1]))  # [B, S, dim]
        steps = x.shape[1]
        logits = self.output.forward(self.norm.forward(x).view(bsz * steps, -1))
        logits = logits.view(bsz, steps, -1)  # [B, T or S, V]
        if not hidden_layers:
            return logits
        return logits, torch.cat(captured, dim=-1).view(bsz, seqlen, -1)

    def _check_hidden_layers(self, hidden_layers: Sequence[int]) -> dict[int, int]:
        """``hidden_layers`` as layer -> index; ValueError unless distinct layers of the model."""
        wanted = {layer: i for i, layer in enumerate(hidden_layers)}
        if len(wanted) != len(hidden_layers) or not all(0 <= i < len(self.layers) for i in wanted):
            raise ValueError(
                f"hidden_layers {list(hidden_layers)} must be distinct layers of "
                f"0..{len(self.layers) - 1}"
            )
        return wanted


def make_step(
    args: ModelArgs,
    rope_cos_sin: Tensor,  # [max_seq_len, 2, head_dim]
    positions: Tensor,  # [B, T] int64; -1 marks padding
    cache: KVCache | None,
    slots: Tensor | None,
    like: Tensor,  # a weight: the dtype and device of the step's tensors
) -> _Step:
    """What every attention layer of one forward shares: rotary rows, mask, cache plan.

    Used by :class:`Transformer` and by proposers that run decoder layers of their own over a
    KV cache (an EAGLE-3 head's one layer).
    """
    if (cache is None) != (slots is None):
        raise ValueError("pass both cache and slots, or neither")
    bsz, seqlen = positions.shape
    host_positions = positions.tolist()  # the host needs these facts anyway: one small copy
    max_pos = max(max(row) for row in host_positions)
    min_pos = min(min(row) for row in host_positions)
    if max_pos >= rope_cos_sin.shape[0]:
        raise ValueError(f"position {max_pos} beyond max_seq_len {rope_cos_sin.shape[0]}")
    flat_pos = positions.reshape(-1)
    rope = rope_cos_sin[flat_pos.clamp(min=0) if min_pos < 0 else flat_pos]  # [N, 2, D]
    if rope.dtype != like.dtype:
        rope = rope.to(like.dtype)
    kv_len = max_pos + 1 if cache is not None else seqlen
    mask: Tensor | None = None
    # One query per row, all at the same position (plain decoding): every key is visible.
    if seqlen > 1 or (cache is not None and min_pos != max_pos):
        if cache is not None:
            key_pos = torch.arange(kv_len, device=positions.device)[None, :]  # [1, L]
            visible = key_pos[:, None, :] <= positions[:, :, None]  # [B, T, L]
        else:
            key_ok = (positions >= 0)[:, None, :]  # [B, 1, T]
            visible = (positions[:, None, :] <= positions[:, :, None]) & key_ok  # [B, T, T]
        # Padding queries see everything: their output is junk, but never NaN.
        visible = visible | (positions < 0)[:, :, None]
        groups = args.n_heads // args.n_kv_heads
        additive = torch.zeros(bsz, 1, seqlen, kv_len, dtype=like.dtype, device=like.device)
        additive.masked_fill_(~visible[:, None], float("-inf"))  # [B, 1, T, L]
        # Query rows are stacked group-major ([G, T]) by the attention: repeat per group.
        mask = additive[:, :, None].expand(bsz, 1, groups, seqlen, kv_len)
        mask = mask.reshape(bsz, 1, groups * seqlen, kv_len)
    plan = None
    if cache is not None and slots is not None:
        plan = cache.plan(slots, positions, kv_len, has_padding=min_pos < 0)
        if plan.spread is not None and mask is not None and plan.keys is not None:
            # Rows of the slot range outside the batch see every key (junk output, never NaN).
            wide = mask.new_zeros(plan.keys.shape[1], *mask.shape[1:])
            mask = wide.index_copy_(0, plan.spread, mask)
    return _Step(
        bsz=bsz,
        seqlen=seqlen,
        cos=rope[:, 0:1],
        sin_signed=rope[:, 1:2],
        mask=mask,
        cache=cache,
        plan=plan,
    )

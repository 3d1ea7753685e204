"""Attention, from one token's loop to batched multi-head attention with a KV cache.

The lecture builds self-attention in three steps, and this module keeps all three so the maths
stays visible beside the fast code: a loop over tokens (:func:`self_attention_loop`), the same
computation as matrix products (:func:`self_attention_matrix`), and batched scaled dot-product
attention over any leading dims (:func:`scaled_dot_product_attention`, which returns the weights).

Every module of the kit attends through one function, :func:`attend`: with ``need_weights=True``
it is :func:`scaled_dot_product_attention` (the maths as written, weights returned); without, it
is PyTorch's fused ``F.scaled_dot_product_attention`` under the same masking rules, which never
materialises the ``(T, S)`` weights. :func:`masked_attention` is lab 05's name for attention under
a mask that must be given. :class:`MultiHeadAttention` projects, splits heads, attends and merges;
the encoder, the decoder and the GPT all use it (the GPT's ``CausalSelfAttention`` is this class
with one fused input projection). For incremental decoding it stores the new keys and values in a
preallocated :class:`KVCache` and attends to the stored positions.

Conventions: rows are tokens (``Q = X @ W_q + b_q``, ``W_q`` of shape ``(D, Dk)``); scores are
scaled by ``1 / sqrt(Dk)``; masks are boolean with True = "may attend", broadcasting to
``(B, H, T, S)``; a fully masked query row gets zero weights and a zero output, never NaN.

Shape letters:
    B   batch
    T   query time (target length)
    S   key/value time (source length; ``S == T`` in self-attention)
    N   tokens of a single unbatched sequence
    D   model width (``d_model``)
    H   heads
    Dh  head width, ``D / H``
    Dk  query/key width, Dv value width (single-head functions)
    L   layers (of a KV cache)

Reference: Vaswani et al., "Attention Is All You Need", NeurIPS 2017, sections 3.2.1-3.2.2;
Pope et al., "Efficiently Scaling Transformer Inference", 2022 (KV caching).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab.graded import graded
from transformer_lab.masks import causal_mask, check_mask

__all__ = [
    "KVCache",
    "LayerKVCache",
    "MultiHeadAttention",
    "attend",
    "load_torch_weights",
    "masked_attention",
    "merge_heads",
    "scaled_dot_product_attention",
    "self_attention_loop",
    "self_attention_matrix",
    "softmax",
    "split_heads",
]


@graded("02_self_attention")
def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Numerically stable softmax, written out (no ``torch.softmax``).

    Subtracting the maximum before ``exp`` leaves the result unchanged and keeps ``exp`` from
    overflowing for large logits. A slice that is entirely ``-inf`` (nothing allowed) gives zeros
    rather than NaN.

    Args:
        x: any shape.
        dim: the axis that sums to one.

    Returns:
        Same shape as ``x``.
    """
    x_max = x.amax(dim=dim, keepdim=True)
    # An all -inf slice has max -inf; shifting by it would give -inf - -inf = NaN.
    x_max = torch.where(torch.isfinite(x_max), x_max, torch.zeros_like(x_max))
    e = torch.exp(x - x_max)
    total = e.sum(dim=dim, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def _project(X: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
    return X @ W if b is None else X @ W + b


@graded("02_self_attention")
def self_attention_loop(
    X: Tensor,
    W_q: Tensor,
    b_q: Tensor | None,
    W_k: Tensor,
    b_k: Tensor | None,
    W_v: Tensor,
    b_v: Tensor | None,
) -> Tensor:
    """Single-head self-attention with explicit Python loops over tokens.

    For each query token ``i``: ``q_i = x_i W_q + b_q``; for each key token ``j``:
    ``s_ij = q_i . k_j / sqrt(Dk)``; then ``a_i = softmax(s_i)`` and ``y_i = sum_j a_ij v_j``.
    Slow on purpose: it is the reference the matrix form must reproduce.

    Args:
        X: tokens in rows, ``(N, D)``.
        W_q: ``(D, Dk)``; b_q: ``(Dk,)`` or None.
        W_k: ``(D, Dk)``; b_k: ``(Dk,)`` or None.
        W_v: ``(D, Dv)``; b_v: ``(Dv,)`` or None.

    Returns:
        ``(N, Dv)``.
    """
    N = X.shape[0]
    d_k = W_q.shape[1]
    keys = [_project(X[j], W_k, b_k) for j in range(N)]
    values = [_project(X[j], W_v, b_v) for j in range(N)]
    rows = []
    for i in range(N):
        q_i = _project(X[i], W_q, b_q)  # (Dk,)
        scores = torch.stack([(q_i * keys[j]).sum() / math.sqrt(d_k) for j in range(N)])  # (N,)
        a_i = softmax(scores, dim=0)
        y_i = torch.zeros_like(values[0])
        for j in range(N):
            y_i = y_i + a_i[j] * values[j]
        rows.append(y_i)
    return torch.stack(rows)  # (N, Dv)


@graded("02_self_attention")
def self_attention_matrix(
    X: Tensor,
    W_q: Tensor,
    b_q: Tensor | None,
    W_k: Tensor,
    b_k: Tensor | None,
    W_v: Tensor,
    b_v: Tensor | None,
) -> Tensor:
    """Single-head self-attention as matrix products: ``softmax(Q K^T / sqrt(Dk)) V``.

    Args:
        X: ``(N, D)``; weights and biases as in :func:`self_attention_loop`.

    Returns:
        ``(N, Dv)``.
    """
    Q = _project(X, W_q, b_q)  # (N, Dk)
    K = _project(X, W_k, b_k)  # (N, Dk)
    V = _project(X, W_v, b_v)  # (N, Dv)
    A = softmax(Q @ K.T / math.sqrt(Q.shape[-1]), dim=-1)  # (N, N)
    return A @ V


@graded("02_self_attention")
def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Batched scaled dot-product attention that returns its weights.

    Masked scores are filled with the dtype's most negative finite value (not ``-inf``, which
    would make a fully masked row NaN), and the weights of masked keys are then set to exactly 0,
    so a fully masked row gives zero weights and a zero output, in float16 as well.

    Args:
        q: queries ``(..., T, Dk)``.
        k: keys ``(..., S, Dk)``.
        v: values ``(..., S, Dv)``.
        mask: bool, broadcasting to ``(..., T, S)``, True = may attend; None = all allowed.
        dropout_p: dropout on the weights before they average the values (training only; the
            returned weights are those before dropout).

    Returns:
        ``(out (..., T, Dv), weights (..., T, S))``.

    Raises:
        ValueError: if the widths of q and k differ, or the mask is invalid.
    """
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"query width {q.shape[-1]} != key width {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{k.shape[-2]} keys but {v.shape[-2]} values")
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, S)
    if mask is not None:
        check_mask(mask, scores.shape)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    if dropout_p > 0.0:
        return F.dropout(weights, p=dropout_p) @ v, weights
    return weights @ v, weights


@graded("05_masking")
def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention under a boolean mask that must be given (lab 05's name).

    The same computation as :func:`scaled_dot_product_attention` with a mask; a missing mask is
    an error here rather than "everything allowed".

    Args:
        q: queries ``(..., T, Dh)``.
        k: keys ``(..., S, Dh)``.
        v: values ``(..., S, Dv)``.
        mask: bool, broadcasting to ``(..., T, S)``, True = may attend.

    Returns:
        ``(out (..., T, Dv), weights (..., T, S))``; fully masked rows give zero weights and
        a zero output.

    Raises:
        ValueError: if ``mask`` is None, not boolean, or does not broadcast to ``(..., T, S)``.
    """
    if mask is None:
        raise ValueError("masked_attention needs a mask (True = may attend); got None")
    return scaled_dot_product_attention(q, k, v, mask)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    need_weights: bool = True,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention, the one entry point the kit's modules call.

    With ``need_weights=True`` this is :func:`scaled_dot_product_attention` (the weights are
    computed explicitly and returned); otherwise PyTorch's fused kernel computes the same output
    without ever holding the ``(T, S)`` weights, under the same masking rules. Either way the
    output is computed once, dropout included.

    Args:
        q: queries ``(..., T, Dh)``.
        k: keys ``(..., S, Dh)``.
        v: values ``(..., S, Dv)``.
        mask: bool broadcasting to ``(..., T, S)``, True = may attend; None = all allowed.
        need_weights: also return the weights ``(..., T, S)`` (before dropout).
        dropout_p: dropout on the attention weights (pass 0 in eval).
        is_causal: query ``t`` attends keys ``0..t`` without a mask being passed; the fused
            kernel then skips the masked half of the work. Needs ``mask=None`` and ``T == S``.

    Returns:
        ``(out (..., T, Dv), weights (..., T, S) or None)``.

    Raises:
        ValueError: on an invalid mask, or ``is_causal`` with a mask or with ``T != S``.
    """
    if is_causal:
        T, S = q.shape[-2], k.shape[-2]
        if mask is not None or T != S:
            got = None if mask is None else tuple(mask.shape)
            raise ValueError(
                f"is_causal=True needs mask=None and T == S; got mask {got}, T={T}, S={S}"
            )
    if need_weights:
        if is_causal:
            mask = causal_mask(q.shape[-2], device=q.device)
        return scaled_dot_product_attention(q, k, v, mask, dropout_p=dropout_p)
    if mask is None:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal)
        return out, None
    # Fused kernels may return NaN for a query that may attend nothing (torch < 2.5 does): such
    # rows see every key inside the kernel, so it never meets an empty row, and are zeroed after.
    check_mask(mask, (*q.shape[:-1], k.shape[-2]))
    row_ok = mask.any(dim=-1, keepdim=True)  # (..., T, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~row_ok, dropout_p=dropout_p)
    return out.masked_fill(~row_ok, 0.0), None


@graded("03_multi_head_attention")
def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """Split the model width into heads: ``(B, T, D) -> (B, H, T, D/H)``.

    Raises:
        ValueError: if ``D`` is not divisible by ``n_heads``.
    """
    B, T, D = x.shape
    if n_heads <= 0 or D % n_heads != 0:
        raise ValueError(f"d_model={D} is not divisible by n_heads={n_heads}")
    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)  # (B, H, T, Dh)


@graded("03_multi_head_attention")
def merge_heads(x: Tensor) -> Tensor:
    """Inverse of :func:`split_heads`: ``(B, H, T, Dh) -> (B, T, H*Dh)``."""
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * Dh)  # (B, T, D)


class LayerKVCache(NamedTuple):
    """One layer's share of a :class:`KVCache` for one call: its storage and where to write."""

    k: Tensor  # (B, H, n_ctx, Dh): the layer's stored keys (a view into the cache)
    v: Tensor  # (B, H, n_ctx, Dh): the layer's stored values
    positions: slice | Tensor  # where the call's T tokens go: a slice, or a (T,) device tensor

    def store(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new keys/values ``(B, H, T, Dh)`` at ``positions``.

        Returns:
            The keys and values to attend to. Positions as a slice (known on the CPU): the
            stored prefix ``(B, H, stop, Dh)``. As a tensor: all ``n_ctx`` slots (static shapes;
            the caller's mask hides the slots after each query's position).
        """
        self.k[:, :, self.positions] = k
        self.v[:, :, self.positions] = v
        if isinstance(self.positions, slice):
            return self.k[:, :, : self.positions.stop], self.v[:, :, : self.positions.stop]
        return self.k, self.v


class KVCache:
    """Keys and values of past positions for every layer, preallocated to the context length.

    Incremental decoding feeds only the new tokens; each layer stores their keys/values at their
    positions (:meth:`layer`, :meth:`LayerKVCache.store`) and its queries attend to the stored
    ones. Nothing is ever reallocated. A call can read the cache two ways:

    * positions known on the CPU (a slice, as in eager generation): attend to the stored
      prefix; a single new token needs no mask at all;
    * positions kept on the device (a tensor, in a compiled decode step): attend to all
      ``n_ctx`` slots under the mask ``visible[positions]``, which hides the slots after each
      query's position (unwritten ones included). No shape then depends on how much is stored,
      so a one-token step compiles once (on CUDA, into one CUDA graph).

    ``length`` counts the positions stored by calls that let the cache track positions (see
    ``GPT.forward``). A plain object, not a module: it is built on the model's device and dtype
    (``GPT.new_kv_cache``), and every attribute read stays a cheap one in per-token decoding.

    Args:
        n_layers: number of blocks ``L``.
        batch_size: ``B``.
        n_heads: ``H``.
        n_ctx: capacity in positions.
        head_dim: ``Dh``.
        dtype: dtype of the stored keys/values (the model's).
        device: device of the stored tensors.
    """

    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        n_heads: int,
        n_ctx: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (n_layers, batch_size, n_heads, n_ctx, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, H, n_ctx, Dh)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, H, n_ctx, Dh)
        # One view per layer, made once: a compiled step then writes into its own input tensors
        # in place (writing through a view taken inside the graph costs a copy of the layer).
        self.layer_k = [self.k[i] for i in range(n_layers)]  # L x (B, H, n_ctx, Dh)
        self.layer_v = [self.v[i] for i in range(n_layers)]  # L x (B, H, n_ctx, Dh)
        # Row p: the slots a query at position p may see, positions 0..p.
        self.visible = causal_mask(n_ctx, device=device)  # (n_ctx, n_ctx)
        self.length = 0

    @property
    def capacity(self) -> int:
        """Most positions the cache can hold."""
        return self.k.shape[3]

    @property
    def batch_size(self) -> int:
        """Batch size the cache was built for."""
        return self.k.shape[1]

    def layer(self, index: int, positions: slice | Tensor) -> LayerKVCache:
        """Layer ``index``'s storage, to receive the tokens at ``positions``.

        ``positions``: a slice ``start:end`` to attend to the prefix ``0..end-1`` afterwards, or
        a ``(T,)`` tensor to attend to all slots (see the class docstring).
        """
        return LayerKVCache(self.layer_k[index], self.layer_v[index], positions)

    def reset(self) -> None:
        """Forget everything stored (the memory is reused; stale slots stay masked)."""
        self.length = 0


@graded("03_multi_head_attention")
class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate query/key/value/output projections.

    ``out = out_proj(merge_heads(attend(split(q_proj(query)), split(k_proj(key)),
    split(v_proj(value)))))``. Each head sees its own ``Dh = D / H`` slice of the projections.

    Args:
        d_model: model width ``D``.
        n_heads: number of heads ``H``; must divide ``d_model``.
        bias: whether the four projections have biases.
        dropout: dropout on the attention weights (training only).
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model <= 0 or n_heads <= 0 or d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout} must lie in [0, 1)")
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = True,
        *,
        is_causal: bool = False,
        kv_cache: LayerKVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: ``(B, T, D)``.
            key: ``(B, S, D)``.
            value: ``(B, S, D)``.
            mask: bool broadcasting to ``(B, H, T, S)``, True = may attend (with a cache,
                ``S`` is the number of keys :meth:`LayerKVCache.store` returns).
            need_weights: return the per-head weights (explicit path); if False, use the
                fused kernel and return ``None`` for the weights.
            is_causal: apply the causal mask (query ``t`` sees keys ``0..t``) without building
                it; the fused path then uses the kernel's own causal mode, which skips the
                masked half of the work. Requires ``mask=None`` and ``T == S``.
            kv_cache: incremental decoding: the new keys/values are stored in this layer's
                cache and the queries attend to the keys/values it returns.

        Returns:
            ``(out (B, T, D), weights (B, H, T, S) or None)``. The weights are those before
            dropout.
        """
        if query.shape[-1] != self.d_model:
            raise ValueError(f"query width {query.shape[-1]} != d_model={self.d_model}")
        q, k, v = self.project(query, key, value)  # (B, H, T, Dh), (B, H, S, Dh), (B, H, S, Dh)
        if kv_cache is not None:
            k, v = kv_cache.store(k, v)  # (B, H, S, Dh) each: the stored positions
        out, weights = attend(
            q,
            k,
            v,
            mask,
            need_weights=need_weights,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal,
        )  # (B, H, T, Dh)
        return self.out_proj(merge_heads(out)), weights  # (B, T, D)

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The query, key and value projections, split into heads.

        Returns:
            ``q (B, H, T, Dh)``, ``k (B, H, S, Dh)``, ``v (B, H, S, Dh)``.
        """
        q = split_heads(self.q_proj(query), self.n_heads)  # (B, H, T, Dh)
        k = split_heads(self.k_proj(key), self.n_heads)  # (B, H, S, Dh)
        v = split_heads(self.v_proj(value), self.n_heads)  # (B, H, S, Dh)
        return q, k, v


@graded("03_multi_head_attention")
@torch.no_grad()
def load_torch_weights(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    """Copy the weights of ``torch.nn.MultiheadAttention`` into :class:`MultiHeadAttention`.

    Torch stacks the three input projections in ``in_proj_weight`` ``(3D, D)`` (rows: q, k, v),
    in ``nn.Linear``'s ``(out, in)`` layout, which is also the layout of our projections.

    Raises:
        ValueError: if widths, head counts or the presence of biases differ.
    """
    D = ours.d_model
    if theirs.embed_dim != D or theirs.num_heads != ours.n_heads:
        raise ValueError(
            f"torch module has embed_dim={theirs.embed_dim}, num_heads={theirs.num_heads}; "
            f"ours has d_model={D}, n_heads={ours.n_heads}"
        )
    their_bias = theirs.in_proj_bias is not None
    our_bias = ours.q_proj.bias is not None
    if their_bias != our_bias:
        raise ValueError(f"bias mismatch: torch module bias={their_bias}, ours bias={our_bias}")
    if theirs.in_proj_weight is not None:
        w_q, w_k, w_v = theirs.in_proj_weight.split(D, dim=0)  # each (D, D)
    else:  # separate kdim/vdim projections
        w_q, w_k, w_v = theirs.q_proj_weight, theirs.k_proj_weight, theirs.v_proj_weight
    for lin, w in ((ours.q_proj, w_q), (ours.k_proj, w_k), (ours.v_proj, w_v)):
        if lin.weight.shape != w.shape:
            raise ValueError(f"projection shape {tuple(w.shape)} != ours {tuple(lin.weight.shape)}")
        lin.weight.copy_(w)
    if their_bias:
        b_q, b_k, b_v = theirs.in_proj_bias.split(D)
        ours.q_proj.bias.copy_(b_q)
        ours.k_proj.bias.copy_(b_k)
        ours.v_proj.bias.copy_(b_v)
    ours.out_proj.weight.copy_(theirs.out_proj.weight)
    if ours.out_proj.bias is not None and theirs.out_proj.bias is not None:
        ours.out_proj.bias.copy_(theirs.out_proj.bias)

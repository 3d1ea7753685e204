"""Attention, from one token's loop to batched multi-head attention.

The lecture builds self-attention in three steps, and this module keeps all three so the maths
stays visible beside the fast code: a loop over tokens (:func:`self_attention_loop`), the same
computation as matrix products (:func:`self_attention_matrix`), and batched scaled dot-product
attention over any leading dims (:func:`scaled_dot_product_attention`). :class:`MultiHeadAttention`
projects, splits heads, attends and merges; with ``need_weights=False`` it takes the fused path
through ``torch.nn.functional.scaled_dot_product_attention``.

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

Reference: Vaswani et al., "Attention Is All You Need", NeurIPS 2017, sections 3.2.1-3.2.2.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab.graded import graded
from transformer_lab.masks import causal_mask, check_mask

__all__ = [
    "MultiHeadAttention",
    "fast_attention",
    "load_torch_weights",
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
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None
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
    return weights @ v, weights


def fast_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> Tensor:
    """Fused attention through ``F.scaled_dot_product_attention``, with our masking rules.

    Same result as :func:`scaled_dot_product_attention` (without the weights). Fully masked query
    rows are let through to all keys inside the kernel (so it never sees an empty row) and their
    output is zeroed afterwards, matching the explicit path instead of returning NaN.

    Args:
        q: ``(..., T, Dh)``; k: ``(..., S, Dh)``; v: ``(..., S, Dv)``.
        mask: bool broadcasting to ``(..., T, S)``, True = may attend.
        dropout_p: dropout on the attention weights (pass 0 in eval).
        is_causal: use the kernel's built-in causal mask (``mask`` must then be None).

    Returns:
        ``(..., T, Dv)``.
    """
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal)
    if is_causal:
        raise ValueError("pass either mask or is_causal=True, not both")
    scores_shape = (*q.shape[:-1], k.shape[-2])
    check_mask(mask, scores_shape)
    row_ok = mask.any(dim=-1, keepdim=True)  # (..., T, 1)
    safe_mask = mask | ~row_ok
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe_mask, dropout_p=dropout_p)
    return out.masked_fill(~row_ok, 0.0)


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


@graded("03_multi_head_attention")
class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate query/key/value/output projections.

    ``out = merge_heads(attention(split(q_proj(query)), split(k_proj(key)), split(v_proj(value))))``
    followed by ``out_proj``. Each head sees its own ``Dh = D / H`` slice of the projections.

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
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: ``(B, T, D)``.
            key: ``(B, S, D)``.
            value: ``(B, S, D)``.
            mask: bool broadcasting to ``(B, H, T, S)``, True = may attend.
            need_weights: return the per-head weights (explicit path); if False, use the
                fused kernel and return ``None`` for the weights.
            is_causal: apply the causal mask (query ``t`` sees keys ``0..t``) without building
                it; the fused path then uses the kernel's own causal mode, which skips the
                masked half of the work. Requires ``mask=None`` and ``T == S``.

        Returns:
            ``(out (B, T, D), weights (B, H, T, S) or None)``. The weights are those before
            dropout.
        """
        if query.shape[-1] != self.d_model:
            raise ValueError(f"query width {query.shape[-1]} != d_model={self.d_model}")
        if is_causal and (mask is not None or query.shape[1] != key.shape[1]):
            raise ValueError(
                f"is_causal=True needs mask=None and T == S; got mask "
                f"{None if mask is None else tuple(mask.shape)}, T={query.shape[1]}, "
                f"S={key.shape[1]}"
            )
        q = split_heads(self.q_proj(query), self.n_heads)  # (B, H, T, Dh)
        k = split_heads(self.k_proj(key), self.n_heads)  # (B, H, S, Dh)
        v = split_heads(self.v_proj(value), self.n_heads)  # (B, H, S, Dh)
        p = self.dropout if self.training else 0.0
        if need_weights:
            if is_causal:
                mask = causal_mask(query.shape[1], device=query.device)
            out, weights = scaled_dot_product_attention(q, k, v, mask)  # (B, H, T, Dh)
            if p > 0.0:
                out = F.dropout(weights, p=p, training=True) @ v
        else:
            out = fast_attention(q, k, v, mask, dropout_p=p, is_causal=is_causal)
            weights = None
        return self.out_proj(merge_heads(out)), weights  # (B, T, D)


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

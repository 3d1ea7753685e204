"""The float64 pieces of a transformer block the hidden checks of labs 04 and 06 build on.

Lab 04's encoder block and lab 06's decoder block are judged against oracles made of the same
three sub-layers, written out in float64 from the weights of the block under test: multi-head
attention (its masked softmax from :mod:`._attention`, so a query with no allowed key gets a
zero output), layer norm (centred values, biased variance) and the position-wise feed-forward
network. Each lab composes them into its own block (post- or pre-norm, with or without
cross-attention) and its catalogue of wrong blocks; the pieces are written once here, so that
the two labs cannot disagree on what a sub-layer computes.

Like every module of this folder, it is refused inside a ban (:mod:`transformer_lab.judge.bans`)
and left out of the student package.
"""

from __future__ import annotations

from torch import Tensor

from transformer_lab.grading.hidden._attention import attend64

__all__ = ["feed_forward64", "layer_norm64", "multi_head64"]

#: A linear layer's ``(weight (out, in), bias (out,))``.
Linear = tuple[Tensor, Tensor]


def layer_norm64(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """Layer norm over the last dimension in float64: centred values, biased variance."""
    x64 = x.detach().double()
    d = x64.shape[-1]
    centred = x64 - x64.sum(-1, keepdim=True) / d
    var = (centred * centred).sum(-1, keepdim=True) / d
    return centred / (var + eps).sqrt() * weight.double() + bias.double()


def feed_forward64(
    x: Tensor, first: Linear, second: Linear, hidden_mask: Tensor | None = None
) -> Tensor:
    """``relu(x W1^T + b1) W2^T + b2`` in float64; ``hidden_mask`` scales the hidden units
    (a scaled dropout mask, in training mode)."""
    hidden = (x.double() @ first[0].double().T + first[1].double()).clamp(min=0.0)  # (..., F)
    if hidden_mask is not None:
        hidden = hidden * hidden_mask
    return hidden @ second[0].double().T + second[1].double()  # (..., D)


def multi_head64(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    projections: tuple[Linear, Linear, Linear, Linear],
    n_heads: int,
    mask: Tensor | None,
) -> Tensor:
    """Multi-head attention in float64: ``query (B, T, D)`` attends to ``key``/``value``
    ``(B, S, D)`` through the ``(q, k, v, out)`` projections; ``mask`` (True = may attend)
    broadcasts to ``(B, H, T, S)``, and a query with no allowed key gets a zero output."""
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = ((w.double(), b.double()) for w, b in projections)
    B, T, D = query.shape
    S = key.shape[1]

    def heads(x: Tensor, w: Tensor, b: Tensor, length: int) -> Tensor:
        y = x.double() @ w.T + b  # (B, length, D)
        return y.reshape(B, length, n_heads, D // n_heads).transpose(1, 2)  # (B, H, length, Dh)

    q, k, v = heads(query, wq, bq, T), heads(key, wk, bk, S), heads(value, wv, bv, S)
    out, _ = attend64(q, k, v, None if mask is None else mask.bool())  # (B, H, T, Dh)
    return out.transpose(1, 2).reshape(B, T, D) @ wo.T + bo  # (B, T, D)

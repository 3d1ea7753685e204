"""The float64 pieces of a transformer block the hidden checks of labs 04 and 06 build on.

Lab 04's encoder block and lab 06's decoder block are judged against oracles made of the same
three sub-layers, written out in float64 from the weights of the block under test: multi-head
attention (its masked softmax from :mod:`._attention`, so a query with no allowed key gets a
zero output), layer norm (centred values, biased variance) and the position-wise feed-forward
network. Each lab composes them into its own block (post- or pre-norm, with or without
cross-attention) and its catalogue of wrong blocks; the pieces are written once here, so that
the two labs cannot disagree on what a sub-layer computes. The blocks' weights are named as
the kit's (``self_attn.q_proj.weight``, ``ff.linear1.bias``, ``norm1.weight``): both labs draw
them with :func:`random_weights` and read a layer with :func:`linear64` or an attention with
:func:`attention64`.

Like every module of this folder, it is refused inside a ban (:mod:`transformer_lab.judge.bans`)
and left out of the student package.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from transformer_lab.grading.hidden._attention import attend64

__all__ = [
    "attention64",
    "feed_forward64",
    "layer_norm64",
    "linear64",
    "multi_head64",
    "random_weights",
]

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


def attention64(
    w: Mapping[str, Tensor], name: str, query: Tensor, source: Tensor, n_heads: int, mask: Any
) -> Tensor:
    """:func:`multi_head64` of the attention ``name`` (``self_attn``, ``cross_attn``) of a
    block's weights ``w``: ``query`` attends to ``source`` (keys and values) under ``mask``."""
    projections = tuple(linear64(w, f"{name}.{p}_proj") for p in ("q", "k", "v", "out"))
    return multi_head64(query, source, source, projections, n_heads, mask)


def random_weights(
    d_model: int, d_ff: int, g: torch.Generator, *attentions: str, norms: bool = True
) -> dict[str, Tensor]:
    """Random float32 weights named as the kit's: of a ``FeedForward(d_model, d_ff)``, or of a
    block with these ``attentions`` (lab 06's decoder too), ``ff`` and a norm after each sub-layer
    whose gains and shifts are far from 1 and 0 (a swapped or unused norm shows; 1 and 0 with
    ``norms=False``)."""
    w: dict[str, Tensor] = {}
    prefix = "ff." if attentions else ""
    layers = {
        f"{a}.{n}_proj": (d_model, d_model) for a in attentions for n in ("q", "k", "v", "out")
    }
    layers |= {f"{prefix}linear1": (d_model, d_ff), f"{prefix}linear2": (d_ff, d_model)}
    for name, (n_in, n_out) in layers.items():
        w[f"{name}.weight"] = torch.randn(n_out, n_in, generator=g) / math.sqrt(n_in)
        w[f"{name}.bias"] = 0.2 * torch.randn(n_out, generator=g)
    for i in range(1, len(attentions) + 2) if attentions else ():
        w[f"norm{i}.weight"] = 1.0 + 0.5 * torch.randn(d_model, generator=g) * norms
        w[f"norm{i}.bias"] = 0.5 * torch.randn(d_model, generator=g) * norms
    return w


def linear64(w: Mapping[str, Tensor], name: str) -> tuple[Tensor, Tensor]:
    """The layer ``name``'s ``(weight, bias)`` in a block's weights ``w``, in float64."""
    return w[f"{name}.weight"].double(), w[f"{name}.bias"].double()

"""The attention the hidden checks of several labs judge against, written once.

Labs 02 (scaled dot-product attention), 03 (multi-head attention), 05 (masked attention) and 08
(causal self-attention through a KV cache) all compare a student's attention weights with the
same reference: a float64 softmax of the scores over the keys a bool mask allows (True = may
attend), where a query that may attend no key gets zero weights and a zero output, the kit's
contract. Their mistake catalogues name the same ways of misusing a mask: softmax of ``-inf``
(empty rows NaN), a large finite fill that nothing zeroes (empty rows uniform), a fill that is
not negative enough, the mask applied after the softmax, and the mask ignored, inverted or given
an extra axis. One module computes them, so that the labs cannot drift apart in what they call
right or name wrong.

Like every module of this folder, it is refused inside a ban (:mod:`transformer_lab.judge.bans`)
and left out of the student package.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["FILLS", "MASK_USES", "attend64", "mask_as_used", "masked_weights"]

#: What :func:`masked_weights` does with the keys the mask hides (besides a plain number, which
#: replaces their scores): ``"zero"`` the contract, the others typical mistakes.
FILLS = ("zero", "nan", "uniform", "after")
#: The ways :func:`mask_as_used` applies a mask: ``"right"`` as given, the others mistakes.
MASK_USES = ("right", "ignored", "inverted", "unsqueezed")

#: The score a ``"uniform"`` fill gives the hidden keys: finite, so a row that allows no key
#: becomes uniform, yet far enough below any real score that ``exp`` of it is exactly 0 in
#: float64 wherever a row allows a key (those rows equal the contract's).
_UNIFORM_FILL = -1e300


def masked_weights(
    scores: Tensor, allowed: Tensor | None, fill: str | float = "zero", axis: int = -1
) -> Tensor:
    """Float64 softmax of ``scores`` over ``axis``, restricted to the keys ``allowed`` allows.

    Args:
        scores: the scaled scores, ``(..., T, S)``.
        allowed: bool, True = may attend, broadcasting to ``scores``; None: every key.
        fill: what becomes of the hidden keys.

            * ``"zero"``, the contract: the softmax runs over the allowed keys only (stable,
              the maximum subtracted), the others get exactly 0 and a row (a line along
              ``axis``) with no allowed key is all zeros, never NaN;
            * ``"nan"``: scores set to ``-inf`` before the softmax, so empty rows are NaN;
            * ``"uniform"``: a large finite fill and nothing zeroed, so empty rows are uniform;
            * ``"after"``: the softmax of the raw scores multiplied by the mask afterwards, not
              renormalised;
            * a number: the hidden scores set to it before the softmax (a fill of 0, or one
              that is not negative enough, such as -1e4).
        axis: the axis the softmax normalises (the keys' axis, -1, unless the mistake is
            another one).

    Returns:
        The weights, float64, of ``scores``' shape.

    Raises:
        ValueError: an unknown ``fill``.
        RuntimeError: ``allowed`` does not broadcast to ``scores``.
    """
    if isinstance(fill, str) and fill not in FILLS:
        raise ValueError(f"unknown fill {fill!r}: expected one of {FILLS} or a number")
    s = scores.double()
    if allowed is None:
        return torch.softmax(s, axis)
    allowed = torch.broadcast_to(allowed.to(torch.bool), s.shape)
    if fill == "zero":
        top = s.masked_fill(~allowed, -math.inf).amax(axis, keepdim=True)  # -inf: empty row
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        e = torch.where(allowed, torch.exp(s - top), torch.zeros_like(s))  # exactly 0 if hidden
        total = e.sum(axis, keepdim=True)
        return e / torch.where(total > 0, total, torch.ones_like(total))  # empty rows: 0 / 1
    if fill == "after":
        return torch.softmax(s, axis) * allowed
    value = {"nan": -math.inf, "uniform": _UNIFORM_FILL}[fill] if isinstance(fill, str) else fill
    return torch.softmax(s.masked_fill(~allowed, value), axis)


def mask_as_used(mask: Tensor | None, shape: Sequence[int], use: str = "right") -> Tensor | None:
    """The bool mask of ``shape`` (``(B, H, T, S)``) that attention applies, used as ``use`` says.

    ``use`` is one of :data:`MASK_USES`: ``"right"`` (the mask broadcast as given; all True
    when ``mask`` is None), ``"ignored"`` (all True), ``"inverted"`` (True and False swapped) or
    ``"unsqueezed"`` (an extra axis inserted after the batch, as when a ``(B, 1, T, S)`` mask is
    unsqueezed once more). Returns None when the mask so used cannot broadcast to ``shape``:
    that mistake cannot happen on this input. An unknown ``use`` raises ValueError.
    """
    if use not in MASK_USES:
        raise ValueError(f"unknown use of a mask {use!r}: expected one of {MASK_USES}")
    if mask is None or use == "ignored":
        return torch.ones(tuple(shape), dtype=torch.bool)
    m = mask.cpu().to(torch.bool)
    if use == "inverted":
        m = ~m
    elif use == "unsqueezed":
        m = m.unsqueeze(1)
    try:
        return torch.broadcast_to(m, tuple(shape))
    except RuntimeError:
        return None


def attend64(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    allowed: Tensor | None,
    *,
    scale: float | None = None,
    fill: str | float = "zero",
    axis: int = -1,
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention in float64: ``(out (..., T, Dv), weights (..., T, S))``.

    ``weights = masked_weights(q @ k^T * scale, allowed, fill, axis)`` with ``scale`` defaulting
    to ``1/sqrt(d_k)``, and ``out = weights @ v``: the reference of the masked attention
    (``fill="zero"``) and, with the other arguments, its typical mistakes.
    """
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q.double() @ k.double().transpose(-2, -1) * s  # (..., T, S)
    w = masked_weights(scores, allowed, fill, axis)
    return w @ v.double(), w  # (..., T, Dv), (..., T, S)

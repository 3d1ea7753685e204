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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from transformer_lab.grading.hidden import fixture_entry

__all__ = [
    "FILLS",
    "HINTS",
    "MASK_USES",
    "MERGES",
    "MISTAKES",
    "SPLITS",
    "attend64",
    "attend_as",
    "attention_mistakes",
    "distinct_mistakes",
    "heads_merged_as",
    "heads_split_as",
    "lowest_allowed_score",
    "mask_as_used",
    "masked_weights",
    "pair_entries",
]

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


def attend_as(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
    axis: int = -1,
    swap: bool = False,
    reshape_k: bool = False,
    reverse_k: bool = False,
    transpose_weights: bool = False,
    fill: str | float = "zero",
    zeroed: bool = False,
) -> tuple[Tensor, Tensor] | None:
    """:func:`attend64` with one typical variation switched on; None where it cannot happen.

    ``swap`` exchanges queries and keys; ``reshape_k`` multiplies by ``k.reshape(..., d_k, S)``
    instead of the transpose, ``reverse_k`` by ``k.T`` (every axis reversed, batch axes
    included); ``transpose_weights`` applies ``weights^T`` to the values; ``fill`` and ``axis``
    are :func:`masked_weights`'; ``zeroed`` multiplies the weights by the mask afterwards (not
    renormalised). None when the variation does not fit these shapes (a ``k.T`` that does not
    multiply, a mask that does not broadcast).
    """
    q, k, v = q.double(), k.double(), v.double()
    if swap:
        q, k = k, q
    if q.shape[-1] != k.shape[-1]:
        return None
    s = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    if reverse_k:
        kt = k.permute(*reversed(range(k.dim())))  # what k.T does: every axis reversed
    elif reshape_k:
        kt = k.reshape(*k.shape[:-2], k.shape[-1], k.shape[-2])  # (..., Dk, S), scrambled
    else:
        kt = k.transpose(-2, -1)  # (..., Dk, S)
    try:
        scores = q @ kt * s  # (..., T, S)
        w = masked_weights(scores, mask, fill, axis)
        if zeroed and mask is not None:
            w = w * torch.broadcast_to(mask.bool(), w.shape)
    except RuntimeError:  # shapes that do not multiply, a mask that does not broadcast
        return None
    if transpose_weights:
        w = w.transpose(-2, -1)
    if w.shape[-1] != v.shape[-2]:
        return None
    return w @ v, w  # (..., T, Dv), (..., T, S)


Variant = Callable[[Tensor, Tensor, Tensor, "Tensor | None"], "tuple[Tensor, Tensor] | None"]


def _masked(**options: object) -> Variant:
    """A mistake of the mask's use: :func:`attend_as` with ``options``; None without a mask."""
    return lambda q, k, v, m: None if m is None else attend_as(q, k, v, m, **options)  # type: ignore[arg-type]


def _low_fill(zeroed: bool) -> Variant:
    """A fill of -1e4, tried only where some allowed score is lower still (elsewhere it looks
    like the mistakes that leave an empty row uniform)."""

    def variant(q: Tensor, k: Tensor, v: Tensor, m: Tensor | None) -> Any:
        if m is None or lowest_allowed_score(q, k, m) >= -1e4:
            return None
        return attend_as(q, k, v, m, fill=-1e4, zeroed=zeroed)

    return variant


#: The catalogue of typical wrong (masked) attentions, by id, each as a function of the inputs
#: ``(q, k, v, mask)`` returning the ``(out, weights)`` it gives (float64), or None where the
#: mistake cannot happen on them.
MISTAKES: dict[str, Variant] = {
    "fill_1e4": _low_fill(zeroed=False),
    "fill_1e4_zeroed": _low_fill(zeroed=True),
    "mask_after": _masked(fill="after"),
    "fill_zero": _masked(fill=0.0),
    "fill_zero_zeroed": _masked(fill=0.0, zeroed=True),
    "fill_uniform": _masked(fill="uniform"),
    "mask_inverted": lambda q, k, v, m: None if m is None else attend_as(q, k, v, ~m.bool()),
    "mask_ignored": lambda q, k, v, m: None if m is None else attend_as(q, k, v, None),
    "no_scale": lambda q, k, v, m: attend_as(q, k, v, m, scale=1.0),
    "scale_d_k": lambda q, k, v, m: attend_as(q, k, v, m, scale=1.0 / q.shape[-1]),
    "softmax_queries": lambda q, k, v, m: attend_as(q, k, v, m, axis=-2),
    "qk_swapped": lambda q, k, v, m: attend_as(q, k, v, m, swap=True),
    "k_reshaped": lambda q, k, v, m: attend_as(q, k, v, m, reshape_k=True),
    "k_reversed": lambda q, k, v, m: attend_as(q, k, v, m, reverse_k=True) if k.dim() > 2 else None,
}

_LOW_FILL = (
    "Your fill value is not negative enough: real scores here go below -1e4, so the masked "
    "keys outrank them. Use the dtype's own minimum, torch.finfo(scores.dtype).min."
)
_FILL_ZERO = (
    "Your masked scores are set to 0 instead of a very negative number: exp(0) is not small, "
    "so masked keys still get weight. Fill with torch.finfo(scores.dtype).min."
)

#: What each mistake of :data:`MISTAKES` is called (labs 02 and 05), in the order the judge
#: tries them.
HINTS = {
    "fill_1e4": _LOW_FILL,
    "fill_1e4_zeroed": _LOW_FILL + " (Zeroing the masked weights afterwards cannot repair that.)",
    "mask_after": "It matches applying the mask after the softmax (weights * mask): the masked "
    "keys, which score highest here, took most of the weight before it was zeroed, so the rows "
    "no longer sum to one. Dividing by the row sums again is no cure: where the masked keys "
    "score far higher, the other exponentials underflow and the row becomes 0/0. Mask the "
    "scores before the softmax.",
    "fill_zero": _FILL_ZERO,
    "fill_zero_zeroed": _FILL_ZERO + " (Zeroing the masked weights afterwards does not bring "
    "the rest back to a sum of one.)",
    "fill_uniform": "Rows where the mask allows no key get uniform weights 1/S (every score was "
    "filled with the same number): such rows must get zero weights and a zero output. Zero "
    "the weights of masked keys after the softmax, e.g. weights.masked_fill(~mask, 0).",
    "mask_inverted": "It matches attention with the mask inverted: True means *may attend*, so "
    "hide the keys where the mask is False: scores.masked_fill(~mask, ...).",
    "mask_ignored": "It matches attention without the mask: the mask is ignored, so the masked "
    "keys (which score highest here) take most of the weight. Set the scores where mask is "
    "False to torch.finfo(scores.dtype).min before the softmax.",
    "no_scale": "It matches attention without scaling: divide the scores q @ k^T by "
    "sqrt(d_k), d_k = q.shape[-1].",
    "scale_d_k": "It matches scores divided by d_k: the scale is 1/sqrt(d_k), the square root.",
    "softmax_queries": "It matches a softmax over the queries' axis (dim=-2): each query's "
    "weights over the keys must sum to 1, so take the softmax over the last axis.",
    "qk_swapped": "It matches scores k @ q^T: queries and keys are swapped. The scores are "
    "q @ k.transpose(-2, -1), one row per query.",
    "k_reshaped": "It matches q @ k.reshape(..., d_k, S): reshape does not transpose, it only "
    "reinterprets the memory. Use k.transpose(-2, -1).",
    "k_reversed": "It matches q @ k.T on a batch: .T reverses every axis, the batch axes "
    "included. Transpose only the last two: k.transpose(-2, -1).",
}


def attention_mistakes(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, hints: Mapping[str, str] = HINTS
) -> dict[str, tuple[Tensor, Tensor]]:
    """Hint -> ``(out, weights)`` of the typical mistakes ``hints`` names (id -> its words, in
    the order a judge tries them), on these inputs.

    A mistake is left out where it cannot happen, where its weights do not have the right
    shape (the judge stops at the shape first) or where it gives the right answer on these
    inputs (to 1e-6: it would name nothing; NaN weights are never right).
    """
    want_out, want_w = attend64(q, k, v, mask)
    kept: dict[str, tuple[Tensor, Tensor]] = {}
    for key, hint in hints.items():
        pair = MISTAKES[key](q, k, v, mask)
        if pair is None or pair[1].shape != want_w.shape or pair[0].shape != want_out.shape:
            continue
        out, w = pair
        if torch.allclose(w, want_w, atol=1e-6) and torch.allclose(out, want_out, atol=1e-6):
            continue  # harmless on these inputs
        kept[hint] = pair
    return kept


def lowest_allowed_score(q: Tensor, k: Tensor, mask: Tensor) -> float:
    """The lowest scaled score ``q . k / sqrt(d_k)`` among the keys ``mask`` allows (0 if none):
    below -1e4, a fill of -1e4 is no longer "very negative"."""
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, S)
    allowed = torch.broadcast_to(mask.to(torch.bool), scores.shape)
    return float(scores.masked_fill(~allowed, math.inf).min()) if bool(allowed.any()) else 0.0


def _same(a: Tensor, b: Tensor, tol: float) -> bool:
    """Equal shapes and values: exactly for bool and integer tensors, to ``tol`` for floats."""
    if a.shape != b.shape:
        return False
    if a.is_floating_point() or b.is_floating_point():
        return bool(torch.allclose(a.double(), b.double(), atol=tol, rtol=tol))
    return bool(torch.equal(a, b))


def distinct_mistakes(
    want: Tensor,
    mistakes: Mapping[str, Tensor | None] | Iterable[tuple[str, Tensor | None]],
    tol: float = 1e-9,
) -> dict[str, Tensor]:
    """``{hint: output}`` of the mistakes that can happen (not None) and differ from ``want``
    and from every mistake before them (by more than ``tol``, absolute and relative): the
    others would name nothing, or name it twice."""
    pairs = mistakes.items() if isinstance(mistakes, Mapping) else mistakes
    kept: dict[str, Tensor] = {}
    for hint, wrong in pairs:
        if wrong is None or any(_same(wrong, t, tol) for t in (want, *kept.values())):
            continue
        kept[hint] = wrong
    return kept


def pair_entries(
    key: str, want: tuple[Tensor, Tensor], mistakes: Mapping[str, tuple[Tensor, Tensor]]
) -> dict[str, dict[str, Any]]:
    """The fixture entries of a worked example of attention, ``"<key> -> output"`` and
    ``"<key> -> weights"``: the expected ``want = (out, weights)`` and the mistakes' pairs, in
    the catalogue's order (the order the visible side tries them)."""
    return {
        f"{key} -> {name}": fixture_entry(want[i], {h: pair[i] for h, pair in mistakes.items()})
        for i, name in enumerate(("output", "weights"))
    }


#: How :func:`heads_split_as` cuts the width into heads: ``"right"`` (head h holds the features
#: ``h*Dh:(h+1)*Dh``), the others typical mistakes.
SPLITS = ("right", "no_transpose", "interleaved")
#: How :func:`heads_merged_as` puts them back: ``"right"`` (head 0's features first), or a mistake.
MERGES = ("right", "no_transpose", "interleaved", "wrong_axes")


def heads_split_as(x: Tensor, n_heads: int, how: str = "right") -> Tensor:
    """``(B, T, D) -> (B, H, T, Dh)``, the heads of labs 03 and 08, cut as ``how`` says.

    ``"right"`` is written with explicit slices, unlike the reshape-and-transpose a solution
    uses; ``"no_transpose"`` is ``reshape(B, H, T, Dh)`` straight away (it cuts across
    tokens), ``"interleaved"`` gives head h every H-th feature (``reshape(B, T, Dh, H)``).
    """
    B, T, D = x.shape
    dh = D // n_heads
    if how == "no_transpose":
        return x.reshape(B, n_heads, T, dh)
    if how == "interleaved":
        return x.reshape(B, T, dh, n_heads).permute(0, 3, 1, 2)
    if how != "right":
        raise ValueError(f"unknown split {how!r}: expected one of {SPLITS}")
    return torch.stack([x[:, :, h * dh : (h + 1) * dh] for h in range(n_heads)], dim=1)


def heads_merged_as(x: Tensor, how: str = "right") -> Tensor:
    """``(B, H, T, Dh) -> (B, T, H*Dh)``, the heads side by side, merged as ``how`` says.

    ``"right"`` concatenates head 0's features first (explicit slices); ``"no_transpose"`` is
    ``reshape(B, T, D)`` straight away (it mixes positions), ``"interleaved"`` orders the
    features Dh-major, ``"wrong_axes"`` transposes the last two axes instead of 1 and 2.
    """
    B, H, T, dh = x.shape
    if how == "no_transpose":
        return x.reshape(B, T, H * dh)
    if how == "interleaved":
        return x.permute(0, 2, 3, 1).reshape(B, T, H * dh)
    if how == "wrong_axes":
        return x.transpose(2, 3).reshape(B, T, H * dh)
    if how != "right":
        raise ValueError(f"unknown merge {how!r}: expected one of {MERGES}")
    return torch.cat([x[:, h] for h in range(H)], dim=-1)

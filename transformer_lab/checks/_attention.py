"""One judge of (masked) attention, for every lab whose student writes it.

Lab 02's ``scaled_dot_product_attention`` and lab 05's ``masked_attention`` return the same pair
``(out (..., T, d_v), weights (..., T, S))`` under the same contract (a bool mask, True = may
attend, broadcasting to the scores; a query the mask leaves no key gets zero weights and a zero
output, never NaN). Both labs used to judge it with their own code; this module judges it once:
calling the student's function under the lab's ban (:func:`call_attention`), tracing a NaN to a
softmax without the max subtraction (:func:`overflow_probe`) or to the fill of an empty row, and
comparing with the expected pair while naming the first typical mistake the answer reproduces
(:func:`judge_attention`), and asking for finite gradients through a row the mask empties
(:func:`expect_finite_gradients`). The expected pair and the mistakes come from the caller:
stored values on the visible side (``fixtures/labNN.json``), the shared oracle and catalogue on
the hidden side (:mod:`transformer_lab.grading.hidden._attention`). No oracle lives here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from transformer_lab.checks._common import (
    EMPTY_ROW_NO_MAX,
    NO_MAX_SUBTRACTION,
    call_forbidding,
    close,
    compare,
    expect_shape,
    expect_true,
    note_mistake,
    raised_on,
    ran_on,
    softmax_overflow_probe,
    stored,
)

#: An attention's ``(out (..., T, d_v), weights (..., T, S))``.
Pair = tuple[Tensor, Tensor]

__all__ = [
    "HALF_FILL",
    "call_attention",
    "dtype_name",
    "expect_finite_gradients",
    "judge_attention",
    "overflow_probe",
    "stored_pair",
    "tolerance",
]

#: A fill value the scores' dtype cannot hold (``masked_fill(~mask, -1e9)`` on float16 raises).
HALF_FILL = (
    "A fill value such as -1e9 does not exist in float16 (its range ends at -65504), so "
    "masked_fill refuses it and other ops turn it into -inf. Fill with the most negative "
    "number of the scores' own dtype, torch.finfo(scores.dtype).min."
)
_HALF_DTYPE = (
    "In {dtype}, keep the dtype of q throughout: a mask or constant built as a new float32 "
    "tensor (e.g. (~mask) * -1e9, torch.tensor(...)) promotes the scores to float32."
)
_BATCH_HINT = (
    "Leading axes are batch (and head) axes: transpose only the last two axes of k, "
    "k.transpose(-2, -1) (k.T reverses every axis), let matmul (@) broadcast over the rest, "
    "and let the mask broadcast against the scores (..., T, S) as it is."
)
_HINT = (
    "weights = softmax(q @ k.transpose(-2, -1) / sqrt(d_k)) over the last axis, with the scores "
    "where mask is False set to torch.finfo(scores.dtype).min first and fully masked rows set "
    "to 0; out = weights @ v."
)
_EMPTY_ROW_NAN = (
    "(the softmax of a row of -inf is 0/0; -1e9 becomes -inf in float16, whose range ends at "
    "-65504). Those rows must get zero weights and a zero output: fill masked scores with "
    "torch.finfo(scores.dtype).min and zero the weights of masked keys after the softmax."
)
_NAN_ROWS = (
    "(Your NaN rows are the rows that mistake leaves without a key: a softmax of a row of -inf "
    "is 0/0.)"
)


def dtype_name(dtype: torch.dtype) -> str:
    """``"float16"`` for ``torch.float16``: how messages name a dtype."""
    return str(dtype).replace("torch.", "")


def tolerance(dtype: torch.dtype, scale: float = 0.0) -> float:
    """How far a correct result may be from the float64 answer, for inputs of ``dtype``.

    A softmax (or attention) computed in ``dtype`` rounds its largest logit, or the logsumexp
    of a row, to the dtype's precision: an error of up to about ``eps * |logit| / 2`` in the
    exponent, hence a relative error of that size in every weight (measured: at most
    ``0.65 * eps * (1 + |logit|)`` for max-subtracting, logsumexp and upcasting softmaxes in
    float32, float16 and bfloat16). ``scale`` is the size of the largest logit (or a bound on
    the scores); the tolerance is ``3 * eps * (1 + scale)``, never less than 1e-4: 3.6e-3 for
    float32 at logits of 1e4, 0.018 for float16 at scores of 5.
    """
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return max(1e-4, 3.0 * eps * (1.0 + scale))


def _error_hint(message: str, q: Tensor) -> str:
    """What to add to the message of an exception the student's attention raised."""
    if "overflow" in message or "cannot be converted" in message:
        return HALF_FILL
    if q.dtype in (torch.float16, torch.bfloat16) and "type" in message:
        return _HALF_DTYPE.format(dtype=dtype_name(q.dtype))
    return _BATCH_HINT if q.dim() > 2 else ""


def call_attention(
    fn: Callable[..., Any],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    what: str,
    *,
    ban: Any,
) -> tuple[Any, Any]:
    """The student's ``fn(q, k, v[, mask])`` under ``ban``, unpacked into ``(out, weights)``.

    Raises:
        AssertionError: a refused call; an exception, with what most likely caused it (a fill
            that overflows half precision, a float32 constant, ``k.T`` on a batch); anything
            but a pair.
    """
    args: tuple[Any, ...] = (q, k, v) if mask is None else (q, k, v, mask)
    try:
        result = call_forbidding(fn, args, {}, ban=ban, what=what)
    except AssertionError as exc:
        message = str(exc)
        if f"{what} raised " not in message:
            raise  # a refused call, or a message of the student's own
        raise AssertionError(f"{message} {_error_hint(message, q)}".rstrip()) from None
    if not isinstance(result, tuple | list) or len(result) != 2:
        got = "None (did you forget to `return out, weights`?)" if result is None else result
        raise AssertionError(
            f"{what} should return a pair (out, weights), got {type(got).__name__}: "
            "`return out, weights`."
        )
    return result[0], result[1]


def overflow_probe(
    fn: Callable[..., Any], q: Tensor, v: Tensor, *, masked: bool, ban: Any, name: str
) -> Callable[[], str | None]:
    """A probe of the student's softmax (:func:`~transformer_lab.checks._common.
    softmax_overflow_probe`) run on ``fn``, the student's attention called ``name``, when a
    judge meets a NaN: it says whether the softmax lacks the max subtraction."""

    def weights_of(pq: Tensor, pk: Tensor, pv: Tensor, pmask: Tensor | None) -> Any:
        return call_attention(fn, pq, pk, pv, pmask, f"{name} on a probe", ban=ban)[1]

    return lambda: softmax_overflow_probe(weights_of, q, v, masked=masked)


def _noted(hint: str) -> str:
    """``hint``, recorded as the mistake named (a hidden cell's message says it)."""
    note_mistake(hint)
    return hint


def _empties_rows_of(g: Tensor, wrong: Tensor, tol: float) -> bool:
    """``g`` is NaN in whole rows where ``wrong`` weighs nothing, and ``wrong`` elsewhere."""
    if g.dim() == 0 or bool(torch.isnan(wrong).any()):
        return False
    rows = torch.isnan(g).any(-1)  # (..., T)
    if not bool(rows.any()) or not bool(torch.isnan(g[rows]).all()):
        return False
    if bool(wrong[rows].abs().amax() > tol):
        return False
    return bool(torch.allclose(g[~rows], wrong[~rows], atol=tol, rtol=tol))


def _named(
    got: Tensor, mistakes: Mapping[str, Tensor], tol: float, fallback: str, *, nan: bool = False
) -> str:
    """The hint of the first mistake ``got`` reproduces (NaN where it has NaN, if ``nan``)."""
    g = got.detach().double()
    for hint, wrong in mistakes.items():
        if wrong.shape != g.shape:
            continue
        if nan:
            same = torch.isnan(g) == torch.isnan(wrong)
            keep = ~torch.isnan(g)
            if bool(same.all()) and bool(torch.allclose(g[keep], wrong[keep], atol=tol, rtol=tol)):
                return _noted(hint)
        elif close(g, wrong, atol=tol, rtol=tol):
            return _noted(hint)
    if nan:  # NaN exactly in the rows a mistake leaves without a key, that mistake elsewhere
        for hint, wrong in mistakes.items():
            if wrong.shape == g.shape and _empties_rows_of(g, wrong.double(), tol):
                return f"{_noted(hint)} {_NAN_ROWS}"
    return fallback


def _tolerance_of(q: Tensor, k: Tensor) -> float:
    """:func:`tolerance` at the size of the scores: rounding a score ``q_t . k_s`` costs up to
    ``eps * sum_i |q_ti k_si| / sqrt(d_k)``, which also bounds ``|score|``."""
    qa, ka = q.detach().double().abs(), k.detach().double().abs()
    bound = qa @ ka.transpose(-2, -1)  # (..., T, S)
    scale = float(bound.amax()) / math.sqrt(q.shape[-1]) if bound.numel() else 0.0
    return tolerance(q.dtype, scale)


def _expect_pair(
    got: tuple[Any, Any], want: tuple[Tensor, Tensor], what: str, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """The student's ``(out, weights)`` as tensors of the expected shapes and of ``dtype``."""
    out, w = got
    want_out, want_w = want
    if isinstance(w, Tensor) and w.dim() > want_w.dim():
        raise AssertionError(
            f"the weights of {what} have shape {tuple(w.shape)}, expected "
            f"{tuple(want_w.shape)}: the mask already broadcasts against the scores "
            "(..., T, S) as it is given. Use it without adding axes (no unsqueeze)."
        )
    w = expect_shape(w, tuple(want_w.shape), f"the weights of {what}")
    out = expect_shape(out, tuple(want_out.shape), f"the output of {what}")
    for name, t in (("weights", w), ("output", out)):
        expect_true(
            t.dtype == dtype,
            f"the {name} of {what} have dtype {dtype_name(t.dtype)} for {dtype_name(dtype)} "
            f"inputs: keep the dtype of q. A mask or constant built as a new float32 tensor "
            "(e.g. (~mask) * -1e9 or torch.tensor(...)) promotes the scores; use "
            "scores.masked_fill(~mask, torch.finfo(scores.dtype).min).",
        )
    return out, w


def _judge_nan(
    w: Tensor,
    o: Tensor,
    empty: Tensor,
    w_mistakes: Mapping[str, Tensor],
    what: str,
    tol: float,
    probe: Callable[[], str | None] | None,
) -> None:
    """Fail on a NaN in the weights or the output, with its most likely cause: a softmax
    without the max subtraction (when ``probe`` shows it), the fill of the rows the mask
    empties, or the first typical mistake with NaN in the same places."""
    wd, od = w.detach().double(), o.detach().double()
    nan_rows = torch.isnan(wd).any(-1) | torch.isnan(od).any(-1)  # (..., T)
    if not bool(nan_rows.any()):
        return
    only_empty = bool(empty.any()) and bool((nan_rows <= empty).all())
    overflow = probe() if probe is not None else None
    if overflow is not None:
        where = "in the rows the mask empties " if only_empty else ""
        note_mistake(NO_MAX_SUBTRACTION)
        raise AssertionError(
            f"the weights of {what} contain NaN {where}{ran_on(w)}. {overflow} "
            f"{NO_MAX_SUBTRACTION}" + (f" {EMPTY_ROW_NO_MAX}" if only_empty else "")
        )
    if only_empty:
        raise AssertionError(
            f"the weights of {what} are NaN in the rows where the mask allows no key "
            + _EMPTY_ROW_NAN
        )
    fallback = (
        "does the softmax overflow? Subtract the row maximum (your own softmax does) before "
        "exponentiating."
        if probe is None
        else "your softmax handles large scores (a probe with scores that overflow exp gave "
        "finite weights), so the NaN comes from the scores or the mask: a -inf added to a "
        "score that is inf, 0 * inf, or a mask in another dtype."
    )
    raise AssertionError(
        f"the weights of {what} contain NaN: " + _named(w, w_mistakes, tol, fallback, nan=True)
    )


def _judge_rows(
    w: Tensor,
    allowed: Tensor | None,
    empty: Tensor,
    w_mistakes: Mapping[str, Tensor],
    what: str,
    tol: float,
) -> None:
    """Fail on weight given to keys the mask forbids (empty rows included) or a row whose
    weights do not sum to 1, naming the first typical mistake the weights reproduce."""
    wd = w.detach().double()
    if allowed is not None:
        leaked = wd.abs().masked_fill(allowed, 0.0)  # weights where the mask says False
        if bool((leaked > 1e-6).any()):
            row = tuple(int(i) for i in (leaked > 1e-6).any(-1).nonzero()[0])
            fallback = (
                "Rows where the mask allows no key must get zero weights (and a zero output), "
                "not uniform weights 1/S: zero them after the softmax, e.g. weights * mask."
                if bool(empty[row])
                else "A masked key (mask False) must get weight exactly 0: set its score to "
                "torch.finfo(scores.dtype).min before the softmax."
            )
            raise AssertionError(
                f"row {row} of the weights of {what} gives weight to keys the mask forbids. "
                + _named(w, w_mistakes, tol, fallback)
            )
    sums = wd.sum(-1)
    bad = ((sums - 1).abs() > max(1e-3, 2 * tol)) & ~empty
    if bool(bad.any()):
        row = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"row {row} of the weights of {what} sums to {float(sums[row]):.3g}, expected 1. "
            + _named(
                w,
                w_mistakes,
                tol,
                "The weights of each query must sum to 1 over the keys (softmax over the last "
                "axis).",
            )
        )


def judge_attention(
    got: tuple[Any, Any],
    want: tuple[Tensor, Tensor],
    mistakes: Mapping[str, tuple[Tensor, Tensor]],
    what: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    *,
    tol: float | None = None,
    probe: Callable[[], str | None] | None = None,
) -> tuple[Tensor, Tensor]:
    """Compare a student's ``(out, weights)`` with the expected pair; name the mistake.

    In order: shapes (a mask given an extra axis), dtype (that of ``q``), NaN (a softmax
    without the max subtraction, the rows the mask empties, or a mistake with NaN there),
    masked keys with weight, rows that do not sum to 1, then the values of the weights and of
    the output, each time naming the first typical mistake the answer reproduces.

    Args:
        got: the student's ``(out, weights)``.
        want: the expected ``(out (..., T, d_v), weights (..., T, S))`` in float64.
        mistakes: hint -> ``(out, weights)`` that typical mistake returns, in the order they
            are tried.
        what: the call, for messages.
        q: the queries it was called with (for the dtype and the size of the scores).
        k: the keys.
        v: the values (for the size of the output).
        mask: the mask it was called with (or None).
        tol: absolute and relative tolerance; None: :func:`tolerance` at the size of the
            scores.
        probe: given, a NaN is traced to its cause by probing the student's softmax
            (:func:`overflow_probe`).

    Returns:
        The student's ``(out, weights)``.
    """
    want_out, want_w = want
    out, w = _expect_pair(got, want, what, q.dtype)
    tol = _tolerance_of(q, k) if tol is None else tol
    w_mistakes = {h: pair[1] for h, pair in mistakes.items()}
    out_mistakes = {h: pair[0] for h, pair in mistakes.items()}
    allowed = None if mask is None else torch.broadcast_to(mask.cpu().bool(), want_w.shape)
    empty = (
        ~allowed.any(-1) if allowed is not None else torch.zeros(want_w.shape[:-1], dtype=bool)
    )  # (..., T): the rows with nothing to attend
    _judge_nan(w, out, empty, w_mistakes, what, tol, probe)
    _judge_rows(w, allowed, empty, w_mistakes, what, tol)
    compare(
        w,
        want_w,
        what=f"the weights of {what}",
        candidates=[(m, h) for h, m in w_mistakes.items()],
        hint=_HINT,
        atol=tol,
        rtol=tol,
    )
    v_size = max(1.0, float(v.detach().double().abs().max())) if v.numel() else 1.0
    compare(
        out,
        want_out,
        what=f"the output of {what}",
        candidates=[(m, h) for h, m in out_mistakes.items()],
        hint="The weights are right but the output is not: out = weights @ v (the values, "
        "not the keys).",
        atol=tol * v_size,
        rtol=tol,
    )
    return out, w


_BACKWARD_HINT = (
    "An in-place operation (scores /= ..., w.div_(...), w[...] = 0) on a tensor autograd saved "
    "for the backward pass breaks it: write it out of place (scores = scores / ...)."
)


def expect_finite_gradients(
    call: Callable[[Tensor, Tensor, Tensor], tuple[Any, Any]],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    what: str,
) -> None:
    """Gradients through the student's attention reach ``q``, ``k`` and ``v`` and are finite,
    also through a row the mask empties (it would poison training with NaN).

    Args:
        call: runs the student's attention on ``(q, k, v)`` (its mask bound) and returns
            ``(out, weights)``, e.g. a :func:`call_attention`.
        q: the queries; k, v: the keys and values (leaf tensors, copied here to require grad).
        what: the call, for messages.

    Raises:
        AssertionError: an output that does not depend on the inputs, a backward pass that
            raises (an in-place operation), a gradient that is missing or not finite.
    """
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, w = call(qg, kg, vg)
    out = expect_shape(out, (*q.shape[:-1], v.shape[-1]), f"the output of {what}")
    expect_true(
        out.requires_grad,
        f"the output of {what} does not depend differentiably on q, k and v: avoid .detach(), "
        ".item() or tensors rebuilt from Python numbers inside the computation.",
    )
    loss = out.pow(2).sum()
    if isinstance(w, Tensor) and w.requires_grad:
        loss = loss + w.pow(2).sum()
    try:
        loss.backward()
    except Exception as exc:  # the student's forward broke autograd
        failure = AssertionError(
            f"the backward pass of {what} raised {type(exc).__name__}: {exc}. {_BACKWARD_HINT}"
        )
        raise raised_on(failure, "a backward pass (q, k and v require grad)") from exc
    for name, t in (("q", qg), ("k", kg), ("v", vg)):
        expect_true(
            t.grad is not None and bool(torch.isfinite(t.grad).all()),
            f"the gradient of {what} with respect to {name} is "
            f"{'missing' if t.grad is None else 'not finite (NaN or inf)'}: a row with nothing "
            "to attend must not poison training (a row of -inf scores gives NaN in the "
            "softmax's backward pass even when its output is replaced afterwards). Fill masked "
            "scores with torch.finfo(scores.dtype).min (not -inf, not mask.log()) and zero the "
            "weights of masked keys after the softmax.",
        )


def stored_pair(lab: str, key: str) -> tuple[tuple[Tensor, Tensor], dict[str, Pair]]:
    """The stored ``(out, weights)`` of ``lab``'s worked example ``key`` (``"<key> -> output"``
    and ``"<key> -> weights"``, written by the lab's hidden module) and the typical mistakes'
    pairs, in the catalogue's order (the order :func:`judge_attention` tries them)."""
    out, out_mistakes = stored(lab, f"{key} -> output")
    w, w_mistakes = stored(lab, f"{key} -> weights")
    return (out, w), {h: (out_mistakes[h], w_mistakes[h]) for h in w_mistakes}

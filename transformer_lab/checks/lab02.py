"""Visible checks of lab 02 (self-attention): softmax, the loop and matrix forms, batched attention.

The notebook's visible test cells call the ``check_*`` functions here on the student's
``softmax``, ``self_attention_loop``, ``self_attention_matrix`` and
``scaled_dot_product_attention``. They run worked examples whose expected results are stored in
``fixtures/lab02.json`` (written from the hidden checks' oracle when the instructor builds the
labs), together with what the typical mistakes return on the same inputs: the softmax over the
wrong axis or without subtracting the maximum, no ``keepdim``, scores not scaled or scaled by
``d_k``, queries and keys swapped, a reshaped instead of transposed key matrix, a mask ignored,
inverted or applied after the softmax, fully masked rows that come out NaN or uniform... A wrong
answer is compared with those and the message names the mistake it reproduces. No oracle lives
here: the student package holds only the stored examples and the comparisons.

The mask examples are built so that the masked keys have the **largest** raw scores (a mask that
is ignored, or applied after the softmax, moves most of the weight), include rows where the mask
allows no key (zero weights, never NaN), use ``T != S`` and values unlike the keys, and run in
float16 as well (where a fill of ``-1e9`` overflows). Attention weights with NaN are traced to
their cause by probing the student's function (:func:`_softmax_overflows`): if it also gives
NaN on scores that are large but finite in the dtype (16 in float16), every key allowed, its
softmax lacks the max subtraction (exp overflows, or exp(finfo.min) = 0 makes 0/0 in a row the
mask empties) and the message says so; only otherwise is a NaN in such a row blamed on the fill.

Tolerances follow the arithmetic of the input's dtype (:func:`tolerance`): a correct float32
softmax written as ``exp(x - logsumexp(x))`` passes at logits of 1e4, where rounding the
logsumexp alone moves the result by about 5e-4.

The structural checks of the loop and matrix forms (:func:`count_operations`) record every torch
operation the student's function runs: ``self_attention_loop`` must do work per token and never
build the ``N x N`` score table in one operation; ``self_attention_matrix`` must run the same
operations whatever ``N`` is.

While the student's function runs, torch's softmax and attention families, ``nn.MultiheadAttention``
and the kit's own attention functions are refused (:class:`~transformer_lab.judge.bans.Ban`).

Reference: Prince, *Understanding Deep Learning*, sections 12.2 (dot-product self-attention,
12.2.4 matrix form) and 12.3.2 (scaled dot-product attention); Vaswani et al., "Attention Is All
You Need", NeurIPS 2017, section 3.2.1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from transformer_lab.checks import spec
from transformer_lab.checks._common import (
    EMPTY_ROW_NO_MAX,
    NO_MAX_SUBTRACTION,
    OpLog,
    call_forbidding,
    call_student,
    close,
    compare,
    expect_shape,
    expect_true,
    forbidden,
    note_mistake,
    ran_on,
    softmax_overflow_probe,
    stored,
)
from transformer_lab.judge.wire import Reference

__all__ = [
    "BAN",
    "SOFTMAX_EXAMPLES",
    "check_scaled_dot_product_attention",
    "check_scaled_dot_product_attention_mask",
    "check_self_attention_loop",
    "check_self_attention_loop_uses_loops",
    "check_self_attention_matrix",
    "check_self_attention_matrix_no_loops",
    "check_softmax",
    "count_operations",
    "example",
    "tolerance",
]

#: The lab's spec (``specs/lab02.toml``): its bans and shared tolerances.
SPEC = spec.load("02_self_attention")
BAN = SPEC.ban("attention")

_LAB = "lab02"


def run(
    fn: Callable[..., Any],
    *args: Any,
    what: str,
    on_error: str = "",
    in_place: str | None = None,
    **kwargs: Any,
) -> Any:
    """Call the student's ``fn(*args, **kwargs)`` under the lab's ban.

    ``on_error`` is appended to the message when the student's code raises an exception;
    ``in_place``, if given, is the message of a write into an argument tensor.
    """
    return call_forbidding(
        fn, args, kwargs, ban=BAN, what=what, on_error=on_error, in_place=in_place
    )


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


def stored_example(key: str) -> tuple[Tensor, dict[str, Tensor]]:
    """A stored expected value and the typical mistakes' outputs, in the catalogue's order.

    The fixture keeps that order in a ``"NN|"`` prefix of each hint (JSON sorts the keys).
    """
    want, mistakes = stored(_LAB, key)
    return want, {hint.partition("|")[2]: t for hint, t in sorted(mistakes.items())}


def example(key: str, *names: str) -> tuple[Tensor, ...]:
    """The stored inputs of worked example ``key`` (float32; masks as bool)."""
    out = []
    for name in names:
        t, _ = stored(_LAB, f"{key}: {name}")
        out.append(t.bool() if name == "mask" else t.float())
    return tuple(out)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# --------------------------------------------------------------------------------------
# softmax
# --------------------------------------------------------------------------------------

SOFTMAX_HINT = (
    "softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m) along `dim`, with m the maximum along "
    "`dim` (keepdim=True so it broadcasts)."
)
_KEEPDIM = (
    "Did a max or a sum over `dim` drop that axis? Use keepdim=True (x.amax(dim, keepdim=True), "
    "e.sum(dim, keepdim=True)) so the result broadcasts against x."
)

#: The visible softmax examples: name -> (input, dim or None for the default).
SOFTMAX_EXAMPLES: dict[str, tuple[Tensor, int | None]] = {
    "softmax(torch.tensor([1., 2., 3.]))": (torch.tensor([1.0, 2.0, 3.0]), None),
    "softmax(x) for x of shape (3, 4)": (
        torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0], [-1.0, 5.0, 2.0, 2.0]]),
        None,
    ),
    "softmax(x, dim=0) for x of shape (3, 4)": (
        torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0], [-1.0, 5.0, 2.0, 2.0]]),
        0,
    ),
    "softmax(x) for a square x of shape (3, 3)": (
        torch.tensor([[0.5, -1.0, 2.0], [3.0, 0.0, 1.0], [-2.0, 4.0, 0.5]]),
        None,
    ),
    "softmax of the large logits [[1000, 1001, 1002], [-1000, -1001, -1002]]": (
        torch.tensor([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1002.0]]),
        None,
    ),
    "softmax of logits near 1e4: [[10000, 10001, 10003], [-10000, -10002, -10001]]": (
        torch.tensor([[10000.0, 10001.0, 10003.0], [-10000.0, -10002.0, -10001.0]]),
        None,
    ),
}


_SOFTMAX_IN_PLACE = (
    "changed its input tensor in place (e.g. `x -= x.max(...)`): compute on a new tensor, "
    "`x - x.max(...)`, so the caller's logits stay untouched."
)


def call_softmax(fn: Callable[..., Tensor], x: Tensor, dim: int | None, what: str) -> Tensor:
    """The student's ``softmax(x[, dim=dim])`` under the ban: a float tensor of ``x``'s shape.

    Raises:
        AssertionError: ``x`` changed in place, a wrong shape or dtype, or an exception.
    """
    kwargs = {} if dim is None else {"dim": dim}
    got = run(fn, x, what=what, on_error=_KEEPDIM, in_place=_SOFTMAX_IN_PLACE, **kwargs)
    if tuple(getattr(got, "shape", ())) != tuple(x.shape) and isinstance(got, Tensor):
        raise AssertionError(
            f"{what} has shape {tuple(got.shape)}, expected {tuple(x.shape)} (the shape of x). "
            + _KEEPDIM
        )
    got = expect_shape(got, tuple(x.shape), what)
    expect_true(
        got.is_floating_point(), f"{what} returned dtype {got.dtype}; softmax gives floats."
    )
    expect_true(
        got.dtype == x.dtype,
        f"{what} returned {_dtype_name(got.dtype)} for a {_dtype_name(x.dtype)} input: keep the "
        "input's dtype (compute with x itself, not with a new float32 tensor).",
    )
    return got


def judge_softmax(
    got: Tensor, want: Tensor, mistakes: Mapping[str, Tensor], what: str, x: Tensor
) -> Tensor:
    """Compare a student's softmax with the expected one; name the mistake it reproduces."""
    finite = x[torch.isfinite(x)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    tol = tolerance(x.dtype, scale)
    return compare(
        got,
        want,
        what=what,
        candidates=list((w, h) for h, w in mistakes.items()),
        hint=SOFTMAX_HINT,
        atol=tol,
        rtol=tol,
    )


def check_softmax(fn: Callable[..., Tensor]) -> None:
    """Worked examples: a vector, a table along each axis, a square table, large logits."""
    for what, (x, dim) in SOFTMAX_EXAMPLES.items():
        want, mistakes = stored_example(what)
        judge_softmax(call_softmax(fn, x, dim, what), want, mistakes, what, x)


# --------------------------------------------------------------------------------------
# self-attention on one sequence: loop and matrix forms
# --------------------------------------------------------------------------------------

SA_ARGS = ("X", "W_q", "b_q", "W_k", "b_k", "W_v", "b_v")
SA_HINT = (
    "Compute Q = X W_q + b_q, K = X W_k + b_k, V = X W_v + b_v; for each query n, weights "
    "softmax over m of q_n . k_m / sqrt(d_k); output row n = sum_m weight[n, m] v_m."
)

#: The visible self-attention examples (stored inputs, expected outputs and mistakes).
SA_EXAMPLES = {
    "a single token (N=1, D=6, d_k=4, d_v=3)": (1, 3),
    "the worked example (N=5, D=6, d_k=4, d_v=3)": (5, 3),
}


def call_self_attention(fn: Callable[..., Tensor], args: tuple[Tensor, ...], what: str) -> Tensor:
    """The student's self-attention on ``args`` under the ban; inputs must stay unchanged."""
    return run(
        fn, *args, what=what, in_place="changed one of its inputs in place: work on new tensors."
    )


def judge_self_attention(
    got: Any,
    want: Tensor,
    mistakes: Mapping[str, Tensor],
    what: str,
    *,
    tol: float = 1e-4,
) -> Tensor:
    """Compare a student's ``(N, d_v)`` output with the expected one; name the mistake."""
    n, d_v = want.shape
    if tuple(getattr(got, "shape", ())) == (d_v, n) and n != d_v:
        raise AssertionError(
            f"{what} has shape ({d_v}, {n}), expected ({n}, {d_v}): one row per token. Did you "
            "compute in the book's column convention and forget to transpose back?"
        )
    got = expect_shape(got, (n, d_v), what)
    hint = SA_HINT
    if n == 1:
        hint = (
            "With one token its weight on itself is 1, so the output is its value "
            "v = x W_v + b_v. Check the value projection and its bias."
        )
    return compare(
        got,
        want,
        what=what,
        candidates=list((w, h) for h, w in mistakes.items()),
        hint=hint,
        atol=tol,
        rtol=tol,
    )


def _check_self_attention_values(fn: Callable[..., Tensor], name: str) -> None:
    for label in SA_EXAMPLES:
        args = example(f"self_attention {label}", *SA_ARGS)
        what = f"{name} on {label}"
        want, mistakes = stored_example(f"self_attention on {label}")
        judge_self_attention(call_self_attention(fn, args, what), want, mistakes, what)


def check_self_attention_loop(fn: Callable[..., Tensor]) -> None:
    """Worked examples: one token (its output is its own value), then N=5, D=6, d_k=4, d_v=3."""
    _check_self_attention_values(fn, "self_attention_loop")


def check_self_attention_matrix(fn: Callable[..., Tensor]) -> None:
    """Worked examples: one token (its output is its own value), then N=5, D=6, d_k=4, d_v=3."""
    _check_self_attention_values(fn, "self_attention_matrix")


# --------------------------------------------------------------------------------------
# loops or no loops: counting the tensor operations a function performs
# --------------------------------------------------------------------------------------

# Operations that build, gather or copy tensors without computing scores; the loop form may use
# them on N x N tensors (e.g. filling a preallocated table, or stacking rows).
_STRUCTURAL = frozenset(
    {
        "zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like", "full_like",
        "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "tensor", "as_tensor",
        "stack", "cat", "concat", "concatenate", "vstack", "hstack", "row_stack",
        "__getitem__", "__setitem__", "clone", "detach", "to", "contiguous", "copy_", "fill_",
        "zero_", "__get__", "size", "dim", "float", "double", "type", "cpu", "requires_grad_",
    }
)  # fmt: skip


def count_operations(fn: Callable[..., Any], *args: Any) -> list[tuple[str, list[tuple[int, ...]]]]:
    """Run ``fn(*args)`` and list the torch operations it performed.

    Args:
        fn: any function of tensors.
        *args: its arguments.

    Returns:
        One ``(operation name, output shapes)`` pair per torch operation, in call order.
    """
    log = OpLog()
    with log:
        fn(*args)
    return log.ops


def _student_ops(
    fn: Callable[..., Tensor], n: int, name: str
) -> list[tuple[str, list[tuple[int, ...]]]]:
    g = torch.Generator().manual_seed(n)
    # X (N, 5), W_q and W_k (5, 3), their biases (3,), W_v (5, 2), b_v (2,): any values will do.
    args = [torch.randn(size, generator=g) for size in ((n, 5), (5, 3), 3, (5, 3), 3, (5, 2), 2)]
    what = f"{name} with N={n} tokens"
    if isinstance(fn, Reference):  # judged: the operations are counted where the code runs
        with forbidden(BAN):
            return call_student(fn.traced, *args, what=what)[1]
    log = OpLog()
    with forbidden(BAN), log:
        call_student(fn, *args, what=what)
    return log.ops


def check_self_attention_loop_uses_loops(fn: Callable[..., Tensor]) -> None:
    """The loop form works one query at a time.

    Rule (stated in the notebook): the number of tensor operations grows with the number of
    tokens, and no arithmetic operation produces the whole ``N x N`` score table at once.
    """
    small, large = (
        _student_ops(fn, 4, "self_attention_loop"),
        _student_ops(fn, 8, "self_attention_loop"),
    )
    if len(large) - len(small) < 4:
        raise AssertionError(
            f"self_attention_loop performs {len(small)} tensor operations for N=4 tokens and "
            f"{len(large)} for N=8: the work does not grow with the number of tokens, so it is "
            "vectorised. Write a Python loop over the queries (for n in range(N): ...) and "
            "compute each query's scores, weights and output inside it."
        )
    for op, shapes in large:
        if op in _STRUCTURAL:
            continue
        for shape in shapes:
            if len(shape) >= 2 and ((8, 8) in (shape[:2], shape[-2:])):
                raise AssertionError(
                    f"self_attention_loop computes a tensor of shape {shape} with `{op}` for "
                    "N=8 tokens: that is the whole table of scores or weights at once (the "
                    "matrix form). In the loop form, compute the scores of one query at a "
                    "time, q_n . k_m for every m, inside the loop over n."
                )


def check_self_attention_matrix_no_loops(fn: Callable[..., Tensor]) -> None:
    """The matrix form performs the same operations whatever ``N`` is."""
    small, large = (
        _student_ops(fn, 4, "self_attention_matrix"),
        _student_ops(fn, 8, "self_attention_matrix"),
    )
    if len(small) != len(large):
        raise AssertionError(
            f"self_attention_matrix performs {len(small)} tensor operations for N=4 tokens but "
            f"{len(large)} for N=8: it loops over tokens. Write it with matrix products over "
            "all tokens at once (Q @ K.T, softmax over the last axis, then @ V), no Python loop."
        )


# --------------------------------------------------------------------------------------
# batched scaled dot-product attention with a mask
# --------------------------------------------------------------------------------------

SDPA_HINT = (
    "weights = softmax(q @ k.transpose(-2, -1) / sqrt(d_k)) over the last axis, with the scores "
    "where mask is False set to torch.finfo(scores.dtype).min first and fully masked rows set "
    "to 0; out = weights @ v."
)
_BATCH_HINT = (
    "Leading axes are batch axes: transpose only the last two axes of k, k.transpose(-2, -1) "
    "(k.T reverses every axis), and let matmul (@) broadcast over the rest."
)
_HALF_DTYPE = (
    "In {dtype}, keep the dtype of q throughout: a mask or constant built as a new float32 "
    "tensor (e.g. (~mask) * -1e9, torch.tensor(...)) promotes the scores to float32."
)
_HALF_FILL = (
    "In float16 the most negative finite number is -65504, so a fill value such as -1e9 (or "
    "float32's finfo.min) overflows: fill with torch.finfo(scores.dtype).min, the most negative "
    "number of the scores' own dtype."
)


def _unpack(result: Any, what: str) -> tuple[Any, Any]:
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        got = type(result).__name__
        raise AssertionError(
            f"{what} should return a pair (out, weights), got {got}: `return out, weights`."
        )
    return result[0], result[1]


def call_attention(
    fn: Callable[..., Any], q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, what: str
) -> tuple[Tensor, Tensor]:
    """The student's ``scaled_dot_product_attention(q, k, v[, mask])`` under the ban."""
    args: tuple[Any, ...] = (q, k, v) if mask is None else (q, k, v, mask)
    try:
        result = run(fn, *args, what=what)
    except AssertionError as exc:
        message = str(exc)
        if f"{what} raised " not in message:
            raise  # a refused call, or a message of the student's own
        if "without overflow" in message:
            hint = _HALF_FILL
        elif q.dtype in (torch.float16, torch.bfloat16) and "type" in message:
            hint = _HALF_DTYPE.format(dtype=_dtype_name(q.dtype))
        else:
            hint = _BATCH_HINT if q.dim() > 2 else ""
        raise AssertionError(f"{message} {hint}".rstrip()) from None
    return _unpack(result, what)


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


def _noted(hint: str) -> str:
    """``hint``, recorded as the mistake named (a hidden cell's message says it)."""
    note_mistake(hint)
    return hint


_NAN_ROWS = (
    "(Your NaN rows are the rows that mistake leaves without a key: a softmax of a row of -inf "
    "is 0/0.)"
)


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


def _softmax_overflows(
    fn: Callable[..., Any], q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None
) -> str | None:
    """:func:`~transformer_lab.checks._common.softmax_overflow_probe` of the student's
    attention (every key allowed when it takes a mask)."""
    what = "scaled_dot_product_attention on a probe with large scores"

    def weights_of(pq: Tensor, pk: Tensor, pv: Tensor, pmask: Tensor | None) -> Any:
        return call_attention(fn, pq, pk, pv, pmask, what)[1]

    return softmax_overflow_probe(weights_of, q, v, masked=mask is not None)


def judge_attention(
    got: tuple[Tensor, Tensor],
    want: tuple[Tensor, Tensor],
    mistakes: Mapping[str, tuple[Tensor, Tensor]],
    what: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    *,
    fn: Callable[..., Any] | None = None,
) -> None:
    """Compare a student's ``(out, weights)`` with the expected pair; name the mistake.

    In order: shapes, dtype (that of ``q``), NaN (in the rows the mask empties, or anywhere),
    masked keys with weight, rows that do not sum to 1, then the values of the weights and of
    the output, each time naming the typical mistake the answer reproduces.

    Args:
        got: the student's ``(out, weights)``.
        want: the expected ``(out (..., T, d_v), weights (..., T, S))`` in float64.
        mistakes: hint -> ``(out, weights)`` that typical mistake returns.
        what: the call, for messages.
        q: the queries it was called with (for the dtype and the size of the scores).
        k: the keys.
        v: the values.
        mask: the mask it was called with (or None).
        fn: the student's function; given, a NaN is traced to its cause by probing it (a
            softmax without the max subtraction, rather than the fill of an empty row).
    """
    out, w = got
    want_out, want_w = want
    w_mistakes = {h: pair[1] for h, pair in mistakes.items()}
    out_mistakes = {h: pair[0] for h, pair in mistakes.items()}
    w = expect_shape(w, tuple(want_w.shape), f"the weights of {what}")
    out = expect_shape(out, tuple(want_out.shape), f"the output of {what}")
    dtype = q.dtype
    for name, t in (("weights", w), ("output", out)):
        expect_true(
            t.dtype == dtype,
            f"the {name} of {what} have dtype {_dtype_name(t.dtype)} for {_dtype_name(dtype)} "
            f"inputs: keep the dtype of q. A mask or constant built as a new float32 tensor "
            "(e.g. (~mask) * -1e9 or torch.tensor(...)) promotes the scores; use "
            "scores.masked_fill(~mask, torch.finfo(scores.dtype).min).",
        )
    # Rounding a score q_t . k_s costs up to eps * sum_i |q_ti k_si| / sqrt(d_k): that sum sets
    # the scale of the tolerance (it bounds |score| too).
    qa, ka = q.detach().double().abs(), k.detach().double().abs()
    bound = qa @ ka.transpose(-2, -1)  # (..., T, S)
    scale = float(bound.amax()) / math.sqrt(q.shape[-1]) if bound.numel() else 0.0
    tol = tolerance(dtype, scale)
    v_size = max(1.0, float(v.detach().double().abs().max())) if v.numel() else 1.0

    full = torch.broadcast_to(mask, want_w.shape) if mask is not None else None
    empty = (~full).all(-1) if full is not None else torch.zeros(want_w.shape[:-1], dtype=bool)
    wd = w.detach().double()
    if bool(torch.isnan(wd).any()):
        nan_rows = torch.isnan(wd).any(-1)
        overflow = _softmax_overflows(fn, q, k, v, mask) if fn is not None else None
        if overflow is not None:
            where = (
                "in the rows the mask empties "
                if bool(empty.any()) and bool((nan_rows <= empty).all())
                else ""
            )
            note_mistake(NO_MAX_SUBTRACTION)
            raise AssertionError(
                f"the weights of {what} contain NaN {where}{ran_on(w)}. {overflow} "
                f"{NO_MAX_SUBTRACTION}" + (f" {EMPTY_ROW_NO_MAX}" if where else "")
            )
        if bool(empty.any()) and bool((nan_rows <= empty).all()):
            half = (
                " In float16 a fill such as -1e9 is already -inf (the largest float16 is 65504)."
                if dtype == torch.float16
                else ""
            )
            raise AssertionError(
                f"the weights of {what} are NaN in the rows where the mask allows no key "
                "(the softmax of a row of -inf is 0/0)." + half + " Those rows must get zero "
                "weights and a zero output: fill masked scores with "
                "torch.finfo(scores.dtype).min and multiply the weights by the mask after the "
                "softmax."
            )
        raise AssertionError(
            f"the weights of {what} contain NaN: "
            + _named(
                w,
                w_mistakes,
                tol,
                "does the softmax overflow? Subtract the row maximum (your own softmax does) "
                "before exponentiating."
                if fn is None
                else "your softmax handles large scores (a probe with scores that overflow "
                "exp gave finite weights), so the NaN comes from the scores or the mask: a "
                "-inf added to a score that is inf, 0 * inf, or a mask in another dtype.",
                nan=True,
            )
        )
    if full is not None:
        leaked = wd.abs().masked_fill(full, 0.0)  # weights where the mask says False
        if bool((leaked > 1e-6).any()):
            row = tuple(int(i) for i in (leaked > 1e-6).any(-1).nonzero()[0])
            if bool(empty[row]):
                fallback = (
                    "Rows where the mask allows no key must get zero weights (and a zero "
                    "output), not equal weights 1/S: zero them after the softmax, e.g. "
                    "weights * mask."
                )
            else:
                fallback = (
                    "A masked key (mask False) must get weight exactly 0: set its score to "
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
    compare(
        w,
        want_w,
        what=f"the weights of {what}",
        candidates=list((m, h) for h, m in w_mistakes.items()),
        hint=SDPA_HINT,
        atol=tol,
        rtol=tol,
    )
    compare(
        out,
        want_out,
        what=f"the output of {what}",
        candidates=list((m, h) for h, m in out_mistakes.items()),
        hint="The weights are right but the output is not: out = weights @ v.",
        atol=tol * v_size,
        rtol=tol,
    )


def stored_attention(key: str) -> tuple[tuple[Tensor, Tensor], dict[str, tuple[Tensor, Tensor]]]:
    """The stored ``(out, weights)`` of an example and the mistakes' ``(out, weights)``."""
    out, out_mistakes = stored_example(f"{key} -> output")
    w, w_mistakes = stored_example(f"{key} -> weights")
    return (out, w), {h: (out_mistakes[h], w_mistakes[h]) for h in w_mistakes}


#: The visible attention examples: name -> (dtype, with a mask?).
SDPA_EXAMPLES = {
    "scaled_dot_product_attention(q, k, v) with T=S=4, d_k=3, d_v=5": (torch.float32, False),
    "scaled_dot_product_attention on q (2, 3, 2, 4), k (2, 3, 5, 4), v (2, 3, 5, 6)": (
        torch.float32,
        False,
    ),
}
SDPA_MASK_EXAMPLES = {
    "scaled_dot_product_attention with a causal (4, 4) mask whose future keys score highest": (
        torch.float32,
        True,
    ),
    "scaled_dot_product_attention with a (2, 3, 5) mask (T=3, S=5) with rows that allow no key": (
        torch.float32,
        True,
    ),
    "the same (2, 3, 5) mask in float16": (torch.float16, True),
}


def _check_attention_examples(fn: Callable[..., Any], examples: Mapping[str, Any]) -> None:
    for what, (dtype, masked) in examples.items():
        names = ("q", "k", "v", "mask") if masked else ("q", "k", "v")
        inputs = example(what, *names)
        q, k, v = (t.to(dtype) for t in inputs[:3])
        mask = inputs[3] if masked else None
        want, mistakes = stored_attention(what)
        got = call_attention(fn, q, k, v, mask, what)
        judge_attention(got, want, mistakes, what, q, k, v, mask, fn=fn)


def check_scaled_dot_product_attention(fn: Callable[..., Any]) -> None:
    """Without a mask: T = S = 4, then batched (2, 3, ...) with 2 queries and 5 keys."""
    _check_attention_examples(fn, SDPA_EXAMPLES)


def check_scaled_dot_product_attention_mask(fn: Callable[..., Any]) -> None:
    """Boolean masks whose masked keys score highest; rows with no key; T != S; float16."""
    _check_attention_examples(fn, SDPA_MASK_EXAMPLES)

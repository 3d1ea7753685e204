"""Visible checks of lab 02 (self-attention): softmax, the loop and matrix forms, batched attention.

The ``check_*`` functions run the student's functions on worked examples whose expected results
and typical mistakes' outputs are stored in ``fixtures/lab02.json`` (written from the hidden
checks' oracles): a wrong answer is compared with those and the message names the mistake it
reproduces. The masked examples give the masked keys the largest raw scores, include rows the
mask empties and run in float16 too; the shared attention judge
(:mod:`transformer_lab.checks._attention`) judges them. Tolerances follow the input's dtype
(:func:`tolerance`). The loop form must do work per token without building the ``N x N`` score
table at once; the matrix form must run the same operations whatever ``N`` is. Torch's softmax
and attention and the kit's own are refused while the student's code runs (:data:`BAN`).

Reference: Prince, *Understanding Deep Learning*, sections 12.2 and 12.3.2; Vaswani et al.,
"Attention Is All You Need", NeurIPS 2017, section 3.2.1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from transformer_lab.checks import _attention, spec
from transformer_lab.checks._attention import dtype_name, tolerance
from transformer_lab.checks._common import (
    OpLog,
    call_forbidding,
    call_student,
    compare,
    expect_shape,
    expect_true,
    forbidden,
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
    "example",
    "tolerance",
]

#: The lab's spec (``specs/lab02.toml``): its bans and shared tolerances.
SPEC = spec.load("02_self_attention")
BAN = SPEC.ban("attention")

_LAB = "lab02"


def example(key: str, *names: str) -> tuple[Tensor, ...]:
    """The stored inputs of worked example ``key`` (float32; masks as bool)."""
    out = []
    for name in names:
        t, _ = stored(_LAB, f"{key}: {name}")
        out.append(t.bool() if name == "mask" else t.float())
    return tuple(out)


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
    """The student's ``softmax(x[, dim=dim])`` under the ban: a tensor of ``x``'s shape and
    dtype (else an AssertionError, as for an exception or ``x`` changed in place)."""
    kwargs = {} if dim is None else {"dim": dim}
    got = call_forbidding(
        fn, (x,), kwargs, ban=BAN, what=what, on_error=_KEEPDIM, in_place=_SOFTMAX_IN_PLACE
    )
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
        f"{what} returned {dtype_name(got.dtype)} for a {dtype_name(x.dtype)} input: keep the "
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
        want, mistakes = stored(_LAB, what)
        judge_softmax(call_softmax(fn, x, dim, what), want, mistakes, what, x)


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
    in_place = "changed one of its inputs in place: work on new tensors."
    return call_forbidding(fn, args, {}, ban=BAN, what=what, in_place=in_place)


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
    return compare(
        got,
        want,
        what=what,
        candidates=list((w, h) for h, w in mistakes.items()),
        hint=SA_HINT,
        atol=tol,
        rtol=tol,
    )


def _check_self_attention_values(fn: Callable[..., Tensor], name: str) -> None:
    for label in SA_EXAMPLES:
        args = example(f"self_attention {label}", *SA_ARGS)
        what = f"{name} on {label}"
        want, mistakes = stored(_LAB, f"self_attention on {label}")
        judge_self_attention(call_self_attention(fn, args, what), want, mistakes, what)


def check_self_attention_loop(fn: Callable[..., Tensor]) -> None:
    """Worked examples: one token (its output is its own value), then N=5, D=6, d_k=4, d_v=3."""
    _check_self_attention_values(fn, "self_attention_loop")


def check_self_attention_matrix(fn: Callable[..., Tensor]) -> None:
    """Worked examples: one token (its output is its own value), then N=5, D=6, d_k=4, d_v=3."""
    _check_self_attention_values(fn, "self_attention_matrix")


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
    small, large = (_student_ops(fn, n, "self_attention_loop") for n in (4, 8))
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
    small, large = (_student_ops(fn, n, "self_attention_matrix") for n in (4, 8))
    if len(small) != len(large):
        raise AssertionError(
            f"self_attention_matrix performs {len(small)} tensor operations for N=4 tokens but "
            f"{len(large)} for N=8: it loops over tokens. Write it with matrix products over "
            "all tokens at once (Q @ K.T, softmax over the last axis, then @ V), no Python loop."
        )


def expect_attention(
    fn: Callable[..., Any],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    what: str,
    want: tuple[Tensor, Tensor],
    mistakes: Mapping[str, tuple[Tensor, Tensor]],
) -> None:
    """The student's ``scaled_dot_product_attention(q, k, v[, mask])`` must return ``want``:
    the shared call and judge (:mod:`transformer_lab.checks._attention`), a NaN traced to its
    cause by probing ``fn``."""
    got = _attention.call_attention(fn, q, k, v, mask, what, ban=BAN)
    probe = _attention.overflow_probe(
        fn, q, v, masked=mask is not None, ban=BAN, name="scaled_dot_product_attention"
    )
    _attention.judge_attention(got, want, mistakes, what, q, k, v, mask, probe=probe)


#: The visible attention examples (a float16 one says so; a masked one has a mask).
SDPA_EXAMPLES = (
    "scaled_dot_product_attention(q, k, v) with T=S=4, d_k=3, d_v=5",
    "scaled_dot_product_attention on q (2, 3, 2, 4), k (2, 3, 5, 4), v (2, 3, 5, 6)",
)
SDPA_MASK_EXAMPLES = (
    "scaled_dot_product_attention with a causal (4, 4) mask whose future keys score highest",
    "scaled_dot_product_attention with a (2, 3, 5) mask (T=3, S=5) with rows that allow no key",
    "scaled_dot_product_attention with the same (2, 3, 5) mask in float16",
)


def _check_attention_examples(fn: Callable[..., Any], examples: tuple[str, ...]) -> None:
    for what in examples:
        q, k, v = (t.to(example_dtype(what)) for t in example(what, "q", "k", "v"))
        mask = example(what, "mask")[0] if "mask" in what else None
        expect_attention(fn, q, k, v, mask, what, *_attention.stored_pair(_LAB, what))


def example_dtype(what: str) -> torch.dtype:
    """The dtype an attention example runs in."""
    return torch.float16 if "float16" in what else torch.float32


def check_scaled_dot_product_attention(fn: Callable[..., Any]) -> None:
    """Without a mask: T = S = 4, then batched (2, 3, ...) with 2 queries and 5 keys."""
    _check_attention_examples(fn, SDPA_EXAMPLES)


def check_scaled_dot_product_attention_mask(fn: Callable[..., Any]) -> None:
    """Boolean masks whose masked keys score highest; rows with no key; T != S; float16."""
    _check_attention_examples(fn, SDPA_MASK_EXAMPLES)

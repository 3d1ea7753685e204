"""Self-checks for lab 02, self-attention.

The notebook's test cells call these functions on the student's ``softmax``,
``self_attention_loop``, ``self_attention_matrix`` and ``scaled_dot_product_attention``.
Visible checks (``check_<name>``) run small worked examples; hidden checks
(``hidden_check_<name>``) draw seeded random sizes and inputs and compare against an oracle
built from PyTorch's own ``torch.softmax`` in double precision, plus edge cases (large logits,
one token, fully masked rows, gradients). When an answer is wrong the check recomputes the
typical wrong answers (no scaling, scaling by ``d_k``, softmax over the wrong axis, queries and
keys swapped, a reshaped instead of transposed key matrix, an inverted or ignored mask, ...) and
names the one the student's output reproduces.

Every check runs the student's code under :func:`~transformer_lab.checks._common.forbidden`:
torch's softmax family, ``F.scaled_dot_product_attention``, torch's multi-head attention and the
kit's own ``transformer_lab.attention`` functions refuse to run.

How loops are checked (the notebook states this rule): the checks record every tensor operation
a function performs with a ``TorchFunctionMode``. ``self_attention_loop`` must do work per token
(its number of operations grows with the number of tokens ``N``) and no single arithmetic
operation in it may produce the whole ``N x N`` table of scores or weights at once;
``self_attention_matrix`` must perform the same number of operations whatever ``N`` is.

Reference: Prince, *Understanding Deep Learning*, sections 12.2 (dot-product self-attention) and
12.3 (matrix form, scaled dot products); Vaswani et al., "Attention Is All You Need" (2017),
section 3.2.1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from transformer_lab.checks._common import (
    Ban,
    call_forbidding,
    call_student,
    close,
    compare,
    expect_close,
    expect_shape,
    forbidden,
    generator,
    randint,
)

__all__ = [
    "check_scaled_dot_product_attention",
    "check_scaled_dot_product_attention_mask",
    "check_self_attention_loop",
    "check_self_attention_loop_uses_loops",
    "check_self_attention_matrix",
    "check_self_attention_matrix_no_loops",
    "check_softmax",
    "count_operations",
    "hidden_check_scaled_dot_product_attention",
    "hidden_check_scaled_dot_product_attention_mask",
    "hidden_check_self_attention_loop",
    "hidden_check_self_attention_matrix",
    "hidden_check_softmax",
    "hidden_check_softmax_stability",
]

# A correct float32 answer differs from the float64 oracle by ~1e-6; every mistake by far more.
_ATOL = 1e-4
_RTOL = 1e-4

_REASON = "this lab asks for your own softmax and attention"
_BAN = Ban(
    ops=("softmax", "attention"),
    functions=(
        "torch.nn.MultiheadAttention",
        "transformer_lab.attention.softmax",
        "transformer_lab.attention.scaled_dot_product_attention",
        "transformer_lab.attention.self_attention_loop",
        "transformer_lab.attention.self_attention_matrix",
        "transformer_lab.attention.MultiHeadAttention",
    ),
    reason=_REASON,
)
# --------------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------------


def _run(fn: Callable[..., Any], *args: Any, what: str, on_error: str = "", **kwargs: Any) -> Any:
    """Call the student's ``fn`` with every shortcut disabled.

    ``on_error`` is appended to the message when the student's code raises an exception.
    """
    return call_forbidding(fn, args, kwargs, ban=_BAN, what=what, on_error=on_error)


# --------------------------------------------------------------------------------------------------
# softmax
# --------------------------------------------------------------------------------------------------

_SOFTMAX_HINT = (
    "softmax(x)_i = exp(x_i - m) / sum_j exp(x_j - m) along `dim`, with m the maximum along `dim` "
    "(keepdim=True so it broadcasts)."
)


def _softmax_candidates(x: Tensor, dim: int) -> list[tuple[Tensor | None, str]]:
    """Outputs of typical wrong softmaxes on ``x``, each with what to fix."""
    xd = x.double()
    out: list[tuple[Tensor | None, str]] = []
    for other in range(xd.dim()):
        if other % xd.dim() != dim % xd.dim():
            out.append(
                (
                    torch.softmax(xd, other),
                    f"It matches a softmax over dim={other} instead of dim={dim}: normalise "
                    "along the `dim` argument (use it in max, exp-sum and keepdim=True).",
                )
            )
    e = torch.exp(xd - xd.amax(dim, keepdim=True))
    out.append(
        (
            e / e.sum(),
            "It matches dividing by the sum over the whole tensor: sum along `dim` only "
            "(x.sum(dim, keepdim=True)).",
        )
    )
    out.append((torch.exp(xd), "It matches exp(x) without dividing by the sum along `dim`."))
    out.append(
        (
            xd / xd.sum(dim, keepdim=True),
            "It matches x / sum(x): exponentiate first, then normalise.",
        )
    )
    unstable = torch.exp(xd.float()).double()
    out.append(
        (
            unstable / unstable.sum(dim, keepdim=True),
            "It overflows or underflows on large logits: exp(1000) is inf in float32. Subtract "
            "the maximum along `dim` before exponentiating; softmax does not change when the "
            "same constant is subtracted from every input.",
        )
    )
    glob = torch.exp(xd.float() - xd.float().max()).double()
    out.append(
        (
            glob / glob.sum(dim, keepdim=True),
            "It subtracts the maximum of the whole tensor: rows far below that maximum "
            "underflow to 0/0. Subtract the maximum along `dim` (x.max(dim, keepdim=True)).",
        )
    )
    return out


def _expect_softmax(fn: Callable[..., Tensor], x: Tensor, dim: int | None, what: str) -> Tensor:
    """Compare ``fn(x, dim=dim)`` (or ``fn(x)`` when ``dim`` is None) with torch's softmax."""
    d = -1 if dim is None else dim
    expected = torch.softmax(x.double(), d)
    before = x.clone()
    kwargs = {} if dim is None else {"dim": dim}
    actual = _run(fn, x, what=what, **kwargs)
    if not torch.equal(x, before):
        raise AssertionError(
            f"{what} changed its input tensor in place (e.g. `x -= x.max(...)`): compute on a "
            "new tensor, `x - x.max(...)`, so the caller's logits stay untouched."
        )
    t = expect_shape(actual, tuple(x.shape), what)
    if not t.is_floating_point():
        raise AssertionError(f"{what} returned dtype {t.dtype}; softmax gives floats.")
    return compare(t, expected, what=what, candidates=_softmax_candidates(x, d), hint=_SOFTMAX_HINT)


def check_softmax(fn: Callable[..., Tensor]) -> None:
    """Visible check of ``softmax(x, dim=-1)``: a worked example, ``dim`` and large logits."""
    x = torch.tensor([1.0, 2.0, 3.0])
    _expect_softmax(fn, x, None, "softmax(torch.tensor([1., 2., 3.]))")

    x2 = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0], [-1.0, 5.0, 2.0, 2.0]])
    _expect_softmax(fn, x2, None, "softmax(x) for x of shape (3, 4)")
    _expect_softmax(fn, x2, 0, "softmax(x, dim=0) for x of shape (3, 4)")

    big = torch.tensor([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1002.0]])
    _expect_softmax(fn, big, None, "softmax of the large logits [[1000, 1001, 1002], [-1000, ...]]")


def hidden_check_softmax(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Hidden check: random shapes, ``dim`` values and scales against torch's softmax."""
    g = generator(seed)
    for trial, (shape, dim) in enumerate(
        [((7,), -1), ((3, 5), 0), ((2, 3, 4), 1), ((4, 1, 6), -1), ((2, 5, 3), -2)]
    ):
        scale = 0.2 + 5.0 * float(torch.rand(1, generator=g))
        x = torch.randn(*shape, generator=g) * scale
        if trial == 4:
            x = x.double()
        _expect_softmax(fn, x, dim, f"softmax(x, dim={dim}) for x of shape {shape}")


def hidden_check_softmax_stability(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Hidden check: huge logits, rows on very different scales, ``-inf`` entries."""
    g = generator(seed)
    x = torch.randn(4, 6, generator=g) * 3 + torch.tensor([[5e3], [-5e3], [0.0], [80.0]])
    _expect_softmax(fn, x, -1, "softmax of rows offset by +5000, -5000, 0 and 80")
    cols = torch.randn(5, 3, generator=g) + torch.tensor([1e4, -1e4, 90.0])
    _expect_softmax(fn, cols, 0, "softmax(x, dim=0) of columns offset by +1e4, -1e4 and 90")
    masked = torch.randn(3, 5, generator=g)
    masked[0, 1] = masked[2, 0] = masked[2, 4] = float("-inf")
    _expect_softmax(fn, masked, -1, "softmax of logits with some -inf entries (masked keys)")


# --------------------------------------------------------------------------------------------------
# self-attention on one sequence: loop and matrix forms
# --------------------------------------------------------------------------------------------------


def _inputs(
    n: int, d: int, dk: int, dv: int, g: torch.Generator
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``X (N, D)`` and the weights ``W_q (D, Dk)``, ``b_q (Dk,)``, ... of one attention layer."""
    X = torch.randn(n, d, generator=g)
    W_q = torch.randn(d, dk, generator=g)
    b_q = torch.randn(dk, generator=g)
    W_k = torch.randn(d, dk, generator=g)
    b_k = torch.randn(dk, generator=g)
    W_v = torch.randn(d, dv, generator=g)
    b_v = torch.randn(dv, generator=g)
    return X, W_q, b_q, W_k, b_k, W_v, b_v


def _attend(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    *,
    scale: float,
    axis: int = -1,
    swap: bool = False,
    reshape_k: bool = False,
    transpose_weights: bool = False,
) -> Tensor | None:
    """Attention of rows ``Q (N, Dk)`` over ``K``, ``V`` with one typical variation switched on."""
    if swap:
        Q, K = K, Q
    Kt = K.reshape(K.shape[-1], K.shape[-2]) if reshape_k else K.transpose(-2, -1)
    A = torch.softmax(Q @ Kt * scale, axis)  # (N, N)
    if transpose_weights:
        A = A.transpose(-2, -1)
    if A.shape[-1] != V.shape[-2]:
        return None
    return A @ V  # (N, Dv)


def _sa_candidates(
    X: Tensor, W_q: Tensor, b_q: Tensor, W_k: Tensor, b_k: Tensor, W_v: Tensor, b_v: Tensor
) -> list[tuple[Tensor | None, str]]:
    """Outputs of typical wrong self-attentions on these inputs, each with what to fix."""
    X, W_q, b_q, W_k, b_k, W_v, b_v = (t.double() for t in (X, W_q, b_q, W_k, b_k, W_v, b_v))
    Q, K, V = X @ W_q + b_q, X @ W_k + b_k, X @ W_v + b_v
    dk, d = W_q.shape[1], X.shape[1]
    s = 1 / math.sqrt(dk)
    out: list[tuple[Tensor | None, str]] = [
        (
            _attend(Q, K, V, scale=1.0),
            "It matches attention without scaling: divide the scores by sqrt(d_k), "
            "d_k = W_q.shape[1].",
        ),
        (
            _attend(Q, K, V, scale=1 / dk),
            "It matches scores divided by d_k: the scale is 1/sqrt(d_k), the square root.",
        ),
        (
            _attend(Q, K, V, scale=1 / math.sqrt(d)) if d != dk else None,
            "It matches scores divided by sqrt(D), the input width: scale by sqrt(d_k), the "
            "width of the queries and keys (W_q.shape[1]).",
        ),
        (
            _attend(Q, K, V, scale=s, axis=0),
            "It matches a softmax over the queries' axis: for each query, the weights over all "
            "keys must sum to 1 (softmax along the keys' axis, the last one of Q K^T).",
        ),
        (
            _attend(Q, K, V, scale=s, swap=True),
            "It matches scores K Q^T: queries and keys are swapped. Score[n, m] = q_n . k_m, "
            "i.e. Q @ K.T.",
        ),
        (
            _attend(Q, K, V, scale=s, reshape_k=True),
            "It matches Q @ K.reshape(D_k, N): reshape does not transpose, it only reinterprets "
            "the memory. Use K.T (or K.transpose(0, 1)).",
        ),
        (
            _attend(Q, K, V, scale=s, transpose_weights=True),
            "It matches A^T V: row n of the output is sum_m a[n, m] v_m, i.e. A @ V with the "
            "weights of query n in row n of A.",
        ),
        (
            _attend(X @ W_q, X @ W_k, X @ W_v, scale=s),
            "It matches attention without the biases: Q = X W_q + b_q, and the same for K, V.",
        ),
        (
            _attend(Q, K, X @ W_v, scale=s),
            "It matches attention without the value bias: V = X W_v + b_v.",
        ),
        (
            _attend(X @ W_q, K, V, scale=s),
            "It matches attention without the query bias: Q = X W_q + b_q.",
        ),
        (
            _attend(Q, K, X, scale=s) if X.shape[1] == W_v.shape[1] else None,
            "It matches weights applied to X: attend over the values V = X W_v + b_v.",
        ),
    ]
    return out


_SA_HINT = (
    "Compute Q = X W_q + b_q, K = X W_k + b_k, V = X W_v + b_v; for each query n, weights "
    "softmax over m of q_n . k_m / sqrt(d_k); output row n = sum_m weight[n, m] v_m."
)


def _expect_self_attention(fn: Callable[..., Tensor], args: Sequence[Tensor], what: str) -> Tensor:
    X, W_q, b_q, W_k, b_k, W_v, b_v = args
    expected = _attend(
        *(X.double() @ W.double() + b.double() for W, b in ((W_q, b_q), (W_k, b_k), (W_v, b_v))),
        scale=1 / math.sqrt(W_q.shape[1]),
    )
    assert expected is not None
    before = [a.clone() for a in args]
    actual = _run(fn, *args, what=what)
    if not all(torch.equal(a, b) for a, b in zip(args, before, strict=True)):
        raise AssertionError(f"{what} changed one of its inputs in place: work on new tensors.")
    return compare(actual, expected, what=what, candidates=_sa_candidates(*args), hint=_SA_HINT)


def _worked_example() -> tuple[Tensor, ...]:
    """N=5 tokens of width D=6, queries/keys of width d_k=4, values of width d_v=3."""
    return _inputs(5, 6, 4, 3, generator(2))


def check_self_attention_loop(fn: Callable[..., Tensor]) -> None:
    """Visible check of ``self_attention_loop``: one token, then a worked example."""
    _check_self_attention_values(fn, "self_attention_loop")


def check_self_attention_matrix(fn: Callable[..., Tensor]) -> None:
    """Visible check of ``self_attention_matrix``: one token, then a worked example."""
    _check_self_attention_values(fn, "self_attention_matrix")


def _check_self_attention_values(fn: Callable[..., Tensor], name: str) -> None:
    # One token attends only to itself: the output is its own value vector.
    one = _inputs(1, 6, 4, 3, generator(1))
    X, _, _, _, _, W_v, b_v = one
    got = _run(fn, *one, what=f"{name} on a single token")
    expect_shape(got, (1, 3), f"{name} on a single token (N=1, D=6, d_v=3)")
    expect_close(
        got,
        X @ W_v + b_v,
        f"{name} on a single token",
        hint="With one token its weight on itself is 1, so the output is its value "
        "v = x W_v + b_v. Check the value projection and its bias.",
        atol=_ATOL,
        rtol=_RTOL,
    )
    args = _worked_example()
    out = _run(fn, *args, what=f"{name}(X, ...)")
    expect_shape(out, (5, 3), f"{name}(X, ...) with N=5 tokens and d_v=3")
    _expect_self_attention(fn, args, f"{name}(X, ...) on the worked example (N=5, D=6, d_k=4)")


def _hidden_self_attention(fn: Callable[..., Tensor], name: str, seed: int) -> None:
    g = generator(seed)
    for _ in range(4):
        n, d, dk, dv = (randint(2, 9, g), randint(2, 8, g), randint(1, 8, g), randint(1, 8, g))
        args = _inputs(n, d, dk, dv, g)
        _expect_self_attention(fn, args, f"{name} with N={n}, D={d}, d_k={dk}, d_v={dv}")
    # Larger queries and keys: the 1/sqrt(d_k) scale matters a lot here.
    args = _inputs(6, 5, 16, 4, g)
    args = (args[0] * 2, *args[1:])
    _expect_self_attention(fn, args, f"{name} with d_k=16 and large scores")


def hidden_check_self_attention_loop(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Hidden check: random sizes and weights against the oracle."""
    _hidden_self_attention(fn, "self_attention_loop", seed)


def hidden_check_self_attention_matrix(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Hidden check: random sizes and weights against the oracle."""
    _hidden_self_attention(fn, "self_attention_matrix", seed)


# --------------------------------------------------------------------------------------------------
# loops or no loops: counting the tensor operations a function performs
# --------------------------------------------------------------------------------------------------

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


class _OpLog(TorchFunctionMode):
    """Records the name and output shapes of every torch operation run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, list[tuple[int, ...]]]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        shapes = [tuple(o.shape) for o in outs if isinstance(o, Tensor)]
        self.ops.append((getattr(func, "__name__", repr(func)), shapes))
        return out


def count_operations(fn: Callable[..., Any], *args: Any) -> list[tuple[str, list[tuple[int, ...]]]]:
    """Run ``fn(*args)`` and list the torch operations it performed.

    Args:
        fn: any function of tensors.
        *args: its arguments.

    Returns:
        One ``(operation name, output shapes)`` pair per torch operation, in call order.
    """
    log = _OpLog()
    with log:
        fn(*args)
    return log.ops


def _student_ops(
    fn: Callable[..., Tensor], n: int, name: str
) -> list[tuple[str, list[tuple[int, ...]]]]:
    args = _inputs(n, 5, 3, 2, generator(n))
    log = _OpLog()
    with forbidden(_BAN), log:
        call_student(fn, *args, what=f"{name} with N={n} tokens")
    return log.ops


def check_self_attention_loop_uses_loops(fn: Callable[..., Tensor]) -> None:
    """Visible check: the loop form works one query at a time.

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
    """Visible check: the matrix form performs the same operations whatever ``N`` is."""
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


# --------------------------------------------------------------------------------------------------
# batched scaled dot-product attention with a mask
# --------------------------------------------------------------------------------------------------


def _sdpa(
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
    fill: str = "zero",
) -> tuple[Tensor, Tensor] | None:
    """Reference attention in float64 with one typical variation switched on.

    ``fill`` says what a fully masked row becomes: ``"zero"`` (the contract), ``"nan"``
    (softmax of all ``-inf``), ``"uniform"`` (a large finite fill) or ``"after"`` (weights
    multiplied by the mask after the softmax, without renormalising).
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
    except RuntimeError:
        return None
    if mask is not None:
        try:
            mask = torch.broadcast_to(mask, scores.shape)
        except RuntimeError:
            return None
        if fill == "after":
            w = torch.softmax(scores, axis) * mask
        elif fill == "uniform":
            w = torch.softmax(scores.masked_fill(~mask, -1e9), axis)
        else:
            w = torch.softmax(scores.masked_fill(~mask, float("-inf")), axis)
            if fill == "zero":
                w = torch.nan_to_num(w, nan=0.0)
    else:
        w = torch.softmax(scores, axis)
    if w.shape[-1] != v.shape[-2]:
        return None
    return w @ v, w


def _sdpa_candidates(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None
) -> list[tuple[tuple[Tensor, Tensor] | None, str]]:
    d = q.shape[-1]
    out: list[tuple[tuple[Tensor, Tensor] | None, str]] = [
        (
            _sdpa(q, k, v, mask, scale=1.0),
            "It matches attention without scaling: divide the scores by sqrt(d_k), "
            "d_k = q.shape[-1].",
        ),
        (
            _sdpa(q, k, v, mask, scale=1 / d),
            "It matches scores divided by d_k: the scale is 1/sqrt(d_k), the square root.",
        ),
        (
            _sdpa(q, k, v, mask, axis=-2),
            "It matches a softmax over the queries' axis (dim=-2): each query's weights over "
            "the keys must sum to 1, so take the softmax over the last axis.",
        ),
        (
            _sdpa(q, k, v, mask, swap=True),
            "It matches scores k @ q^T: queries and keys are swapped. The scores are "
            "q @ k.transpose(-2, -1), one row per query.",
        ),
        (
            _sdpa(q, k, v, mask, reshape_k=True),
            "It matches q @ k.reshape(..., d_k, S): reshape does not transpose. Use "
            "k.transpose(-2, -1) (k.T would reverse every axis, batch included).",
        ),
        (
            _sdpa(q, k, v, mask, reverse_k=True) if k.dim() > 2 else None,
            "It matches q @ k.T on a batch: .T reverses every axis, the batch axes included. "
            "Transpose only the last two: k.transpose(-2, -1).",
        ),
    ]
    if mask is not None:
        out += [
            (
                _sdpa(q, k, v, None),
                "It matches attention without the mask: the mask is ignored. Set the scores "
                "where mask is False to -inf (or a very negative number) before the softmax.",
            ),
            (
                _sdpa(q, k, v, ~mask),
                "It matches attention with the mask inverted: True means 'may attend', so "
                "block the positions where mask is False (scores.masked_fill(~mask, ...)).",
            ),
            (
                _sdpa(q, k, v, mask, fill="nan"),
                "Rows where the mask allows no key give NaN (softmax of all -inf is 0/0): "
                "such rows must get zero weights, e.g. fill with torch.finfo(scores.dtype).min "
                "and multiply the weights by the mask after the softmax.",
            ),
            (
                _sdpa(q, k, v, mask, fill="uniform"),
                "Rows where the mask allows no key give equal weights 1/S: such rows must get "
                "zero weights (and a zero output). Zero them after the softmax, e.g. "
                "weights * mask.",
            ),
            (
                _sdpa(q, k, v, mask, fill="after"),
                "It matches multiplying the softmax by the mask afterwards: the remaining "
                "weights no longer sum to 1. Mask the scores before the softmax.",
            ),
        ]
    return out


_SDPA_HINT = (
    "weights = softmax(q @ k.transpose(-2, -1) / sqrt(d_k)) over the last axis, with the scores "
    "where mask is False set to -inf (or finfo.min) first and fully masked rows set to 0; "
    "out = weights @ v."
)


_BATCH_HINT = (
    "Leading axes are batch axes: transpose only the last two axes of k, k.transpose(-2, -1) "
    "(k.T reverses every axis), and let matmul (@) broadcast over the rest."
)


def _unpack(result: Any, what: str) -> tuple[Tensor, Tensor]:
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        got = type(result).__name__
        raise AssertionError(
            f"{what} should return a pair (out, weights), got {got}: `return out, weights`."
        )
    return result[0], result[1]


def _expect_sdpa(
    fn: Callable[..., Any],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    what: str,
) -> tuple[Tensor, Tensor]:
    ref = _sdpa(q, k, v, mask)
    assert ref is not None
    out_exp, w_exp = ref
    args: tuple[Any, ...] = (q, k, v) if mask is None else (q, k, v, mask)
    out, w = _unpack(_run(fn, *args, what=what, on_error=_BATCH_HINT if q.dim() > 2 else ""), what)
    cands = _sdpa_candidates(q, k, v, mask)
    w = expect_shape(w, tuple(w_exp.shape), f"the weights of {what}")
    out = expect_shape(out, tuple(out_exp.shape), f"the output of {what}")
    wd = w.detach().double()
    if bool(torch.isnan(wd).any()):
        nan_rows = torch.isnan(wd).any(-1)
        empty = (~torch.broadcast_to(mask, w_exp.shape)).all(-1) if mask is not None else None
        if empty is not None and bool(empty.any()) and bool((nan_rows <= empty).all()):
            raise AssertionError(
                f"the weights of {what} are NaN in the rows where the mask allows no key "
                "(softmax of all -inf is 0/0). Those rows must get zero weights and a zero "
                "output: e.g. fill masked scores with torch.finfo(scores.dtype).min and multiply "
                "the weights by the mask after the softmax."
            )
        raise AssertionError(
            f"the weights of {what} contain NaN: does the softmax overflow? Subtract the "
            "row maximum (your own softmax does) before exponentiating."
        )
    full_rows = (
        torch.broadcast_to(mask, w_exp.shape).any(-1) if mask is not None else torch.ones(1).bool()
    )
    sums = wd.sum(-1)
    bad = (sums - 1).abs() > 1e-3
    if mask is not None:
        bad = bad & full_rows
    if bool(bad.any()):
        row = tuple(int(i) for i in bad.nonzero()[0])
        named = next(
            (h for c, h in cands if c is not None and close(w, c[1])),
            "the weights of each query must sum to 1 over the keys (softmax over the last axis).",
        )
        raise AssertionError(
            f"row {row} of the weights of {what} sums to {float(sums[row]):.3g}, expected 1. "
            + named
        )
    compare(
        w,
        w_exp,
        what=f"the weights of {what}",
        candidates=[(None if c is None else c[1], h) for c, h in cands],
        hint=_SDPA_HINT,
    )
    compare(
        out,
        out_exp,
        what=f"the output of {what}",
        candidates=[(None if c is None else c[0], h) for c, h in cands],
        hint="The weights are right but the output is not: out = weights @ v.",
    )
    return out, w


def check_scaled_dot_product_attention(fn: Callable[..., Any]) -> None:
    """Visible check of ``scaled_dot_product_attention(q, k, v)`` without a mask."""
    g = generator(3)
    q, k, v = (torch.randn(4, 3, generator=g) * 2 for _ in range(3))
    v = torch.randn(4, 5, generator=g)
    _expect_sdpa(fn, q, k, v, None, "scaled_dot_product_attention(q, k, v) with T=S=4, d_k=3")
    # Batched, and with as many keys as queries differing: any leading dims are batch dims.
    q = torch.randn(2, 3, 2, 4, generator=g)
    k = torch.randn(2, 3, 5, 4, generator=g)
    v = torch.randn(2, 3, 5, 6, generator=g)
    _expect_sdpa(
        fn, q, k, v, None, "scaled_dot_product_attention on q (2, 3, 2, 4), k (2, 3, 5, 4)"
    )


def check_scaled_dot_product_attention_mask(fn: Callable[..., Any]) -> None:
    """Visible check of the boolean mask: a causal mask and a fully masked row."""
    g = generator(4)
    q, k, v = (torch.randn(2, 4, 3, generator=g) * 2 for _ in range(3))
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    _expect_sdpa(fn, q, k, v, causal, "scaled_dot_product_attention with a causal (4, 4) mask")
    mask = torch.tensor(
        [
            [[True, False, True, True], [False, False, False, False], [True, True, True, False]],
            [[True, True, True, True], [False, True, False, False], [False, False, False, False]],
        ]
    )  # (B=2, T=3, S=4)
    q = torch.randn(2, 3, 3, generator=g)
    _expect_sdpa(
        fn, q, k, v, mask, "scaled_dot_product_attention with a (2, 3, 4) mask with empty rows"
    )


def hidden_check_scaled_dot_product_attention(fn: Callable[..., Any], seed: int = 0) -> None:
    """Hidden check: random leading dims, ``T != S``, ``d_v != d_k``, large logits."""
    g = generator(seed)
    for lead in [(), (3,), (2, 2), (1, 3, 2)]:
        t, s, dk, dv = (randint(1, 6, g), randint(1, 7, g), randint(1, 9, g), randint(1, 5, g))
        q = torch.randn(*lead, t, dk, generator=g) * 2
        k = torch.randn(*lead, s, dk, generator=g) * 2
        v = torch.randn(*lead, s, dv, generator=g)
        shapes = f"q {(*lead, t, dk)}, k {(*lead, s, dk)}, v {(*lead, s, dv)}"
        _expect_sdpa(fn, q, k, v, None, f"scaled_dot_product_attention on {shapes}")
    # Scores in the thousands: a softmax without the max-subtraction overflows.
    q = torch.randn(2, 5, 8, generator=g) * 30
    k = torch.randn(2, 5, 8, generator=g) * 30
    v = torch.randn(2, 5, 3, generator=g)
    _expect_sdpa(fn, q, k, v, None, "scaled_dot_product_attention with scores in the thousands")


def hidden_check_scaled_dot_product_attention_mask(fn: Callable[..., Any], seed: int = 0) -> None:
    """Hidden check: random masks of several broadcast shapes, empty rows, finite gradients."""
    g = generator(seed)
    b, h, t, s, dk, dv = 2, 3, 5, 6, 4, 3
    q = torch.randn(b, h, t, dk, generator=g) * 2
    k = torch.randn(b, h, s, dk, generator=g) * 2
    v = torch.randn(b, h, s, dv, generator=g)
    full = torch.rand(b, h, t, s, generator=g) < 0.6
    full[0, 1, 2] = False  # an empty row
    full[1, 0, 0] = True
    lengths = torch.tensor([4, 2])
    masks = {
        "a random (B, H, T, S) mask": full,
        "a (T, S) causal-like mask shared by the batch": torch.ones(t, s, dtype=torch.bool).tril(),
        "a (B, 1, 1, S) key padding mask": (torch.arange(s) < lengths[:, None])[:, None, None, :],
        "a (B, 1, T, S) mask with empty rows": torch.rand(b, 1, t, s, generator=g) < 0.3,
    }
    for label, mask in masks.items():
        _expect_sdpa(fn, q, k, v, mask, f"scaled_dot_product_attention with {label}")

    # Gradients: an empty row must not poison the gradients with NaN (it would during training).
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    what = "scaled_dot_product_attention with an empty mask row (backward pass)"
    out, _ = _unpack(_run(fn, qg, kg, vg, full, what=what), what)
    out = expect_shape(out, (b, h, t, dv), f"the output of {what}")
    if not out.requires_grad:
        raise AssertionError(
            f"the output of {what} does not depend differentiably on q, k, v: avoid .detach(), "
            ".item() or building new tensors from Python numbers in the computation."
        )
    out.pow(2).sum().backward()
    for name, x in (("q", qg), ("k", kg), ("v", vg)):
        if x.grad is None or not bool(torch.isfinite(x.grad).all()):
            raise AssertionError(
                f"the gradient with respect to {name} of {what} contains NaN or is missing: "
                "a row of -inf scores gives NaN in the softmax's backward pass even when you "
                "replace its output afterwards. Fill masked scores with a large finite negative "
                "number (torch.finfo(scores.dtype).min) and zero empty rows after the softmax."
            )

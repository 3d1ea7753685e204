"""Lab 02 checks against a catalogue of typical mistakes and of correct variants (no nbgrader).

For every graded function: correct implementations written in different styles (loops,
vectorised, einsum, the book's column convention, logsumexp, float32 inside and the input's
dtype outside, ``-inf`` fills with empty rows handled) pass every check, visible and hidden;
each typical wrong implementation fails the checks it should, with a message that names the
mistake; a function that calls PyTorch's or the kit's version earns nothing. The visible checks
live in ``transformer_lab/checks/lab02.py``, the hidden ones in
``transformer_lab/grading/hidden/lab02.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from judge_support import zeroing_attention

from transformer_lab.checks import lab02
from transformer_lab.checks._common import OpLog
from transformer_lab.grading.hidden import lab02 as hidden02

# --------------------------------------------------------------------------------------------------
# correct implementations, in several styles
# --------------------------------------------------------------------------------------------------


def softmax(x, dim=-1):
    z = x - x.max(dim, keepdim=True).values
    e = torch.exp(z)
    return e / e.sum(dim, keepdim=True)


def softmax_logsumexp(x, dim=-1):
    return torch.exp(x - torch.logsumexp(x, dim, keepdim=True))


def softmax_amax(x, dim=-1):
    e = (x - torch.amax(x, dim=dim, keepdim=True)).exp()
    return e / torch.sum(e, dim=dim, keepdim=True)


def softmax_float32_inside(x, dim=-1):
    """Computes in float32 (or float64) and returns the input's dtype."""
    wide = x.float() if x.element_size() < 4 else x
    e = torch.exp(wide - wide.amax(dim, keepdim=True))
    return (e / e.sum(dim, keepdim=True)).to(x.dtype)


def softmax_reciprocal(x, dim=-1):
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e * e.sum(dim, keepdim=True).reciprocal()


def _qkv(X, W_q, b_q, W_k, b_k, W_v, b_v):
    return X @ W_q + b_q, X @ W_k + b_k, X @ W_v + b_v


def sa_loop(X, W_q, b_q, W_k, b_k, W_v, b_v):
    """The book's form: one query at a time, keys and values per token."""
    N = X.shape[0]
    keys = [X[m] @ W_k + b_k for m in range(N)]
    values = [X[m] @ W_v + b_v for m in range(N)]
    outs = []
    for n in range(N):
        q = X[n] @ W_q + b_q
        s = torch.stack([q @ keys[m] for m in range(N)]) / math.sqrt(W_q.shape[1])
        a = softmax(s)
        outs.append(sum(a[m] * values[m] for m in range(N)))
    return torch.stack(outs)


def sa_loop_table(X, W_q, b_q, W_k, b_k, W_v, b_v):
    """Loops that fill a preallocated score table entry by entry, then normalise row by row."""
    Q, K, V = _qkv(X, W_q, b_q, W_k, b_k, W_v, b_v)
    N = X.shape[0]
    scores = torch.zeros(N, N)
    for n in range(N):
        for m in range(N):
            scores[n, m] = torch.dot(Q[n], K[m]) / math.sqrt(K.shape[1])
    out = torch.zeros(N, V.shape[1])
    for n in range(N):
        out[n] = softmax_logsumexp(scores[n]) @ V
    return out


def sa_matrix(X, W_q, b_q, W_k, b_k, W_v, b_v):
    Q, K, V = _qkv(X, W_q, b_q, W_k, b_k, W_v, b_v)
    return softmax(Q @ K.T / math.sqrt(W_q.shape[1])) @ V


def sa_matrix_einsum(X, W_q, b_q, W_k, b_k, W_v, b_v):
    Q = torch.einsum("nd,dk->nk", X, W_q) + b_q
    K = torch.einsum("nd,dk->nk", X, W_k) + b_k
    V = torch.einsum("nd,dv->nv", X, W_v) + b_v
    A = softmax_logsumexp(torch.einsum("nk,mk->nm", Q, K) * W_q.shape[1] ** -0.5)
    return torch.einsum("nm,mv->nv", A, V)


def sa_matrix_columns(X, W_q, b_q, W_k, b_k, W_v, b_v):
    """The book's column convention (D x N), transposed back at the end."""
    Xc = X.T  # (D, N)
    Q = W_q.T @ Xc + b_q[:, None]  # (Dk, N)
    K = W_k.T @ Xc + b_k[:, None]
    V = W_v.T @ Xc + b_v[:, None]  # (Dv, N)
    A = softmax(K.T @ Q / math.sqrt(Q.shape[0]), dim=0)  # (N keys, N queries), columns sum to 1
    return (V @ A).T


def sdpa(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    w = softmax(scores)
    if mask is not None:
        w = w * mask
    return w @ v, w


def sdpa_where(q, k, v, mask=None):
    """-inf fill, empty rows neutralised before the softmax and zeroed after it."""
    scores = torch.matmul(q, k.mT) * q.size(-1) ** -0.5
    if mask is None:
        w = softmax_amax(scores)
        return w @ v, w
    mask = torch.broadcast_to(mask, scores.shape)
    empty = ~mask.any(-1, keepdim=True)
    scores = scores.masked_fill(~mask, float("-inf")).masked_fill(empty, 0.0)
    w = torch.where(empty, torch.zeros_like(scores), softmax(scores))
    return torch.einsum("...ts,...sv->...tv", w, v), w


def sdpa_float32_inside(q, k, v, mask=None):
    """Computes in float32 whatever the inputs, returns their dtype (mixed precision style)."""
    dtype = q.dtype
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    q, k, v = q.to(wide), k.to(wide), v.to(wide)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = torch.where(mask, scores, torch.finfo(wide).min)
    w = softmax_logsumexp(scores)
    if mask is not None:
        w = w.masked_fill(~mask, 0.0)
    return (w @ v).to(dtype), w.to(dtype)


def sdpa_lse_half_fill(q, k, v, mask=None):
    """logsumexp softmax; the fill is the dtype's own minimum, written with torch.where."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])
    if mask is not None:
        low = torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype)
        scores = torch.where(mask, scores, low)
    w = softmax_logsumexp(scores)
    if mask is not None:
        w = torch.where(mask, w, torch.zeros((), dtype=w.dtype))
    return w @ v, w


# --------------------------------------------------------------------------------------------------
# typical mistakes
# --------------------------------------------------------------------------------------------------


def sm_no_max(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum(dim, keepdim=True)


def sm_ignores_dim(x, dim=-1):
    return softmax(x, -1)


def sm_always_dim0(x, dim=-1):
    return softmax(x, 0)


def sm_global_max(x, dim=-1):
    e = torch.exp(x - x.max())
    return e / e.sum(dim, keepdim=True)


def sm_global_sum(x, dim=-1):
    e = torch.exp(x - x.max(dim, keepdim=True).values)
    return e / e.sum()


def sm_in_place(x, dim=-1):
    x -= x.max(dim, keepdim=True).values
    e = torch.exp(x)
    return e / e.sum(dim, keepdim=True)


def sm_no_keepdim(x, dim=-1):
    e = torch.exp(x - x.max(dim).values)
    return e / e.sum(dim)


def sm_sum_no_keepdim(x, dim=-1):
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / e.sum(dim)


def sm_max_no_keepdim(x, dim=-1):
    e = torch.exp(x - x.amax(dim))
    return e / e.sum(dim, keepdim=True)


def sm_exp_only(x, dim=-1):
    return torch.exp(x - x.amax(dim, keepdim=True))


def sm_upcast(x, dim=-1):
    """Right values, but float16 comes back as float32."""
    return softmax(x.float() if x.element_size() < 4 else x, dim)


def sm_torch(x, dim=-1):
    return torch.softmax(x, dim)


def sm_functional(x, dim=-1):
    return F.softmax(x, dim=dim)


def sm_method(x, dim=-1):
    return x.softmax(dim)


def sm_log_softmax(x, dim=-1):
    return F.log_softmax(x, dim).exp()


def sm_package(x, dim=-1):
    from transformer_lab.attention import softmax as pkg_softmax

    return pkg_softmax(x, dim)


def sm_sparse(x, dim=-1):
    return torch.sparse.softmax(x.to_sparse(), dim).to_dense()


def _variant_matrix(
    *, scale="sqrt", axis=-1, swap=False, reshape_k=False, bias=True, tw=False
) -> Callable:
    def fn(X, W_q, b_q, W_k, b_k, W_v, b_v):
        if bias:
            Q, K, V = _qkv(X, W_q, b_q, W_k, b_k, W_v, b_v)
        else:
            Q, K, V = X @ W_q, X @ W_k, X @ W_v
        if swap:
            Q, K = K, Q
        dk = W_q.shape[1]
        s = {"sqrt": 1 / math.sqrt(dk), "none": 1.0, "d": 1 / dk, "D": 1 / math.sqrt(X.shape[1])}
        Kt = K.reshape(K.shape[1], K.shape[0]) if reshape_k else K.T
        A = softmax(Q @ Kt * s[scale], dim=axis)
        return (A.T if tw else A) @ V

    return fn


def _variant_loop(*, scale="sqrt", bias=True, value_bias=True, swap=False, own_value=False):
    """A genuine loop form (one query at a time) that carries one typical mistake."""

    def fn(X, W_q, b_q, W_k, b_k, W_v, b_v):
        N, dk = X.shape[0], W_q.shape[1]
        s = {"sqrt": 1 / math.sqrt(dk), "none": 1.0, "d": 1 / dk, "D": 1 / math.sqrt(X.shape[1])}
        qs = [X[n] @ W_q + (b_q if bias else 0) for n in range(N)]
        ks = [X[m] @ W_k + (b_k if bias else 0) for m in range(N)]
        vs = [X[m] @ W_v + (b_v if bias and value_bias else 0) for m in range(N)]
        if swap:
            qs, ks = ks, qs
        rows = []
        for n in range(N):
            scores = torch.stack([qs[n] @ ks[m] * s[scale] for m in range(N)])  # (N,)
            a = softmax(scores)
            # own_value: the weights multiply the query's own value instead of v_m.
            rows.append(sum(a[m] * (vs[n] if own_value else vs[m]) for m in range(N)))
        return torch.stack(rows)

    return fn


def sa_loop_fake(X, W_q, b_q, W_k, b_k, W_v, b_v):
    """Vectorised, with a decorative loop that does nothing."""
    for _ in range(X.shape[0]):
        pass
    return sa_matrix(X, W_q, b_q, W_k, b_k, W_v, b_v)


def sa_loop_rows_of_full(X, W_q, b_q, W_k, b_k, W_v, b_v):
    """Loops over the output rows, but all scores come from one matrix product."""
    Q, K, V = _qkv(X, W_q, b_q, W_k, b_k, W_v, b_v)
    A = softmax(Q @ K.T / math.sqrt(K.shape[1]))
    return torch.stack([A[n] @ V for n in range(X.shape[0])])


def sa_loop_broadcast(X, W_q, b_q, W_k, b_k, W_v, b_v):
    """Scores by broadcasting (N, 1, Dk) * (1, N, Dk), then a loop over the rows."""
    Q, K, V = _qkv(X, W_q, b_q, W_k, b_k, W_v, b_v)
    S = (Q[:, None, :] * K[None, :, :]).sum(-1) / math.sqrt(K.shape[1])
    return torch.stack([softmax(S[n]) @ V for n in range(X.shape[0])])


def sa_loop_sdpa(X, W_q, b_q, W_k, b_k, W_v, b_v):
    Q, K, V = _qkv(X, W_q, b_q, W_k, b_k, W_v, b_v)
    rows = [F.scaled_dot_product_attention(Q[n : n + 1], K, V)[0] for n in range(X.shape[0])]
    return torch.stack(rows)


def sa_loop_kit(X, W_q, b_q, W_k, b_k, W_v, b_v):
    from transformer_lab.attention import self_attention_loop

    return self_attention_loop(X, W_q, b_q, W_k, b_k, W_v, b_v)


def sa_matrix_kit(X, W_q, b_q, W_k, b_k, W_v, b_v):
    from transformer_lab import attention

    return attention.self_attention_matrix(X, W_q, b_q, W_k, b_k, W_v, b_v)


def sa_matrix_torch_softmax(X, W_q, b_q, W_k, b_k, W_v, b_v):
    Q, K, V = _qkv(X, W_q, b_q, W_k, b_k, W_v, b_v)
    return torch.softmax(Q @ K.T / math.sqrt(K.shape[1]), -1) @ V


def sa_matrix_columns_not_transposed_back(X, W_q, b_q, W_k, b_k, W_v, b_v):
    return sa_matrix_columns(X, W_q, b_q, W_k, b_k, W_v, b_v).T


def sa_matrix_mha(X, W_q, b_q, W_k, b_k, W_v, b_v):
    Q, K, V = _qkv(X, W_q, b_q, W_k, b_k, W_v, b_v)
    mha = torch.nn.MultiheadAttention(1, 1)
    return mha(Q, K, V)[0]


def _variant_sdpa(*, scale="sqrt", axis=-1, swap=False, kT=False, mask_mode="ok") -> Callable:
    def fn(q, k, v, mask=None):
        if swap:
            q, k = k, q
        d = q.shape[-1]
        s = {"sqrt": 1 / math.sqrt(d), "none": 1.0, "d": 1 / d}[scale]
        scores = (q @ (k.T if kT else k.transpose(-2, -1))) * s
        if mask is None or mask_mode == "ignore":
            w = softmax(scores, dim=axis)
            return w @ v, w
        m = ~mask if mask_mode == "invert" else mask
        if mask_mode == "nan":
            w = softmax(scores.masked_fill(~m, float("-inf")), dim=axis)
        elif mask_mode == "uniform":
            w = softmax(scores.masked_fill(~m, -1e9), dim=axis)
        elif mask_mode == "after":
            w = softmax(scores, dim=axis) * m
        elif mask_mode == "fill_1e9":
            # Correct in float32 and bfloat16; in float16 -1e9 does not fit (masked_fill raises).
            w = softmax(scores.masked_fill(~m, -1e9), dim=axis) * m
        elif mask_mode == "where_1e9":
            # torch.where casts -1e9 to float16 silently: -inf, so empty rows become NaN.
            w = softmax(torch.where(m, scores, -1e9), dim=axis) * m
        elif mask_mode == "additive":
            # A float32 additive mask promotes float16 / bfloat16 scores to float32.
            w = softmax(scores + (~m) * -1e9, dim=axis) * m
        elif mask_mode == "nan_grad":
            # An additive -inf mask: the forward pass is repaired, the backward pass is not.
            bias = torch.zeros(m.shape, dtype=scores.dtype).masked_fill(~m, float("-inf"))
            w = torch.nan_to_num(softmax(scores + bias, dim=axis), nan=0.0)
        else:
            w = softmax(scores.masked_fill(~m, torch.finfo(scores.dtype).min), dim=axis) * m
        return w @ v, w

    return fn


def sdpa_inverted_minus_inf(q, k, v, mask=None):
    """Wrong: the mask inverted (True hides a key), filled with -inf: NaN wherever the real
    mask allows every key (the inverted one then allows none), finite weights elsewhere."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    w = softmax(scores, dim=-1)
    return w @ v, w


def sdpa_in_place_divide(q, k, v, mask=None):
    """Wrong: normalises the weights in place (exp, then w /= sum): exp's output, which its
    backward pass needs, is changed, so a backward pass raises."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    w = (scores - scores.amax(-1, keepdim=True)).exp()
    w /= w.sum(-1, keepdim=True)
    if mask is not None:
        w = w * mask
    return w @ v, w


def sdpa_torch(q, k, v, mask=None):
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    if mask is not None:
        w = w.masked_fill(~mask, 0)
        w = w / w.sum(-1, keepdim=True).clamp_min(1e-30)
    return w @ v, w


def sdpa_fused(q, k, v, mask=None):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    w = softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))
    return out, w


def sdpa_kit(q, k, v, mask=None):
    from transformer_lab.attention import scaled_dot_product_attention

    return scaled_dot_product_attention(q, k, v, mask)


def sdpa_kit_masked(q, k, v, mask=None):
    from transformer_lab.masks import masked_attention

    if mask is None:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool)
    return masked_attention(q, k, v, mask)


def sdpa_out_only(q, k, v, mask=None):
    return sdpa(q, k, v, mask)[0]


def sdpa_softmax_no_max(q, k, v, mask=None):
    """The dtype's own minimum as the fill (right), but a softmax without the max subtraction:
    a row the mask empties is exp(finfo.min) = 0 everywhere, 0 / 0 = NaN; large scores
    overflow (in float16 from 11)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    w = sm_no_max(scores)
    if mask is not None:
        w = w * mask
    return w @ v, w


def sdpa_half_overflow(q, k, v, mask=None):
    """Right in float32 and float64; in half precision the softmax skips the max subtraction
    (a "fast path"), so exp overflows there."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    w = sm_no_max(scores) if scores.element_size() < 4 else softmax(scores)
    if mask is not None:
        w = w * mask
    return w @ v, w


def sdpa_upcast(q, k, v, mask=None):
    """Right values, but half-precision inputs come back as float32."""
    wide = torch.float64 if q.dtype == torch.float64 else torch.float32
    return sdpa(q.to(wide), k.to(wide), v.to(wide), mask)


# --------------------------------------------------------------------------------------------------
# the tables: which checks a function passes, which it fails and with what words
# --------------------------------------------------------------------------------------------------

SOFTMAX_CHECKS = [
    lab02.check_softmax,
    lambda f: hidden02.hidden_check_softmax(f, seed=2101),
    lambda f: hidden02.hidden_check_softmax_stability(f, seed=2102),
]
LOOP_CHECKS = [
    lab02.check_self_attention_loop,
    lab02.check_self_attention_loop_uses_loops,
    lambda f: hidden02.hidden_check_self_attention_loop(f, seed=2201),
]
MATRIX_CHECKS = [
    lab02.check_self_attention_matrix,
    lab02.check_self_attention_matrix_no_loops,
    lambda f: hidden02.hidden_check_self_attention_matrix(f, seed=2301),
]
SDPA_CHECKS = [
    lab02.check_scaled_dot_product_attention,
    lab02.check_scaled_dot_product_attention_mask,
    lambda f: hidden02.hidden_check_scaled_dot_product_attention(f, seed=2401),
    lambda f: hidden02.hidden_check_scaled_dot_product_attention_mask(f, seed=2402),
]
ALL_CHECKS = (SOFTMAX_CHECKS, LOOP_CHECKS, MATRIX_CHECKS, SDPA_CHECKS)


@pytest.mark.parametrize(
    ("fn", "checks"),
    [
        (softmax, SOFTMAX_CHECKS),
        (softmax_logsumexp, SOFTMAX_CHECKS),
        (softmax_amax, SOFTMAX_CHECKS),
        (softmax_float32_inside, SOFTMAX_CHECKS),
        (softmax_reciprocal, SOFTMAX_CHECKS),
        (sa_loop, LOOP_CHECKS),
        (sa_loop_table, LOOP_CHECKS),
        (sa_matrix, MATRIX_CHECKS),
        (sa_matrix_einsum, MATRIX_CHECKS),
        (sa_matrix_columns, MATRIX_CHECKS),
        (sdpa, SDPA_CHECKS),
        (sdpa_where, SDPA_CHECKS),
        (sdpa_float32_inside, SDPA_CHECKS),
        (sdpa_lse_half_fill, SDPA_CHECKS),
    ],
    ids=lambda v: getattr(v, "__name__", "checks"),
)
def test_correct_implementations_pass(fn: Callable, checks: list[Callable]) -> None:
    for check in checks:
        check(fn)


def test_a_logsumexp_softmax_passes_at_offsets_of_1e4() -> None:
    """Rounding logsumexp(x) at 1e4 moves a float32 result by ~5e-4: that is not a mistake."""
    x = torch.tensor([[1e4, 1e4 + 1, 1e4 + 3], [-1e4, -1e4 - 2, -1e4 - 1]])
    error = (softmax_logsumexp(x).double() - torch.softmax(x.double(), -1)).abs().max()
    assert error > 1e-5  # the old tolerance (1e-4 absolute and relative) was near the edge
    assert error < lab02.tolerance(torch.float32, 1e4)
    lab02.check_softmax(softmax_logsumexp)
    hidden02.hidden_check_softmax_stability(softmax_logsumexp, seed=7)


S_VIS, S_VAL, S_STAB = SOFTMAX_CHECKS
L_VIS, L_LOOPS, L_HID = LOOP_CHECKS
M_VIS, M_NOLOOP, M_HID = MATRIX_CHECKS
A_VIS, A_MASK, A_HID, A_HID_MASK = SDPA_CHECKS

# (wrong implementation, the checks that must fail, words the message must contain)
MISTAKES = [
    # softmax
    (sm_no_max, [S_VIS, S_STAB], "Subtract the maximum"),
    (sm_ignores_dim, [S_VIS, S_VAL, S_STAB], "instead of dim=0"),
    (sm_always_dim0, [S_VIS, S_VAL, S_STAB], "instead of dim="),
    (sm_global_max, [S_VIS, S_STAB], "maximum of the whole tensor"),
    (sm_global_sum, [S_VIS, S_VAL, S_STAB], "sum along `dim` only"),
    (sm_in_place, [S_VIS, S_VAL, S_STAB], "in place"),
    (sm_no_keepdim, [S_VIS, S_VAL, S_STAB], "keepdim=True"),
    (sm_sum_no_keepdim, [S_VIS, S_VAL, S_STAB], "keepdim=True"),
    (sm_max_no_keepdim, [S_VIS, S_VAL, S_STAB], "keepdim=True"),
    (sm_exp_only, [S_VIS, S_VAL, S_STAB], "without dividing by the sum"),
    (sm_upcast, [S_STAB], "keep the input's dtype"),
    (sm_torch, [S_VIS, S_VAL, S_STAB], "torch.softmax"),
    (sm_functional, [S_VIS, S_VAL, S_STAB], "does not allow"),
    (sm_method, [S_VIS, S_VAL, S_STAB], "torch.Tensor.softmax"),
    (sm_log_softmax, [S_VIS, S_VAL, S_STAB], "log_softmax"),
    (sm_package, [S_VIS, S_VAL, S_STAB], "transformer_lab.attention.softmax"),
    (sm_sparse, [S_VIS, S_VAL, S_STAB], "_sparse_softmax"),
    # self_attention_loop
    (_variant_loop(scale="none"), [L_VIS, L_HID], "without scaling"),
    (_variant_loop(scale="d"), [L_VIS, L_HID], "divided by d_k"),
    (_variant_loop(scale="D"), [L_VIS, L_HID], "sqrt(D), the input width"),
    (_variant_loop(bias=False), [L_VIS, L_HID], "bias"),
    (_variant_loop(value_bias=False), [L_VIS, L_HID], "without the value bias"),
    (_variant_loop(swap=True), [L_VIS, L_HID], "swapped"),
    (_variant_loop(own_value=True), [L_VIS, L_HID], "its own value vector"),
    (sa_loop_fake, [L_LOOPS], "does not grow with the number of tokens"),
    (sa_loop_rows_of_full, [L_LOOPS], "whole table of scores"),
    (sa_loop_broadcast, [L_LOOPS], "whole table of scores"),
    (sa_loop_sdpa, [L_VIS, L_LOOPS, L_HID], "scaled_dot_product_attention"),
    (sa_loop_kit, [L_VIS, L_LOOPS, L_HID], "transformer_lab.attention.self_attention_loop"),
    # self_attention_matrix
    (sa_loop, [M_NOLOOP], "it loops over tokens"),
    (_variant_matrix(scale="none"), [M_VIS, M_HID], "without scaling"),
    (_variant_matrix(scale="d"), [M_VIS, M_HID], "divided by d_k"),
    (_variant_matrix(bias=False), [M_VIS, M_HID], "bias"),
    (_variant_matrix(swap=True), [M_VIS, M_HID], "swapped"),
    (_variant_matrix(reshape_k=True), [M_VIS, M_HID], "reshape does not transpose"),
    (_variant_matrix(axis=0), [M_VIS, M_HID], "queries' axis"),
    (_variant_matrix(tw=True), [M_VIS, M_HID], "A^T V"),
    (sa_matrix_columns_not_transposed_back, [M_VIS, M_HID], "transpose back"),
    (sa_matrix_torch_softmax, [M_VIS, M_NOLOOP, M_HID], "torch.softmax"),
    (sa_matrix_mha, [M_VIS, M_NOLOOP, M_HID], "does not allow"),
    (sa_matrix_kit, [M_VIS, M_NOLOOP, M_HID], "transformer_lab.attention.self_attention_matrix"),
    # scaled_dot_product_attention
    (_variant_sdpa(scale="none"), [A_VIS, A_MASK, A_HID, A_HID_MASK], "without scaling"),
    (_variant_sdpa(scale="d"), [A_VIS, A_MASK, A_HID, A_HID_MASK], "divided by d_k"),
    (_variant_sdpa(axis=-2), [A_VIS, A_MASK, A_HID, A_HID_MASK], "queries' axis"),
    (_variant_sdpa(swap=True), [A_VIS, A_MASK, A_HID, A_HID_MASK], "swapped"),
    (_variant_sdpa(kT=True), [A_VIS, A_MASK, A_HID, A_HID_MASK], "k.T"),
    (_variant_sdpa(mask_mode="invert"), [A_MASK, A_HID_MASK], "mask inverted"),
    (sdpa_inverted_minus_inf, [A_MASK, A_HID_MASK], "mask inverted"),
    (sdpa_in_place_divide, [A_HID_MASK], "It raised on a backward pass"),
    (_variant_sdpa(mask_mode="ignore"), [A_MASK, A_HID_MASK], "mask is ignored"),
    (_variant_sdpa(mask_mode="nan"), [A_MASK, A_HID_MASK], "NaN"),
    (_variant_sdpa(mask_mode="uniform"), [A_MASK, A_HID_MASK], "uniform weights 1/S"),
    (_variant_sdpa(mask_mode="after"), [A_MASK, A_HID_MASK], "mask after the softmax"),
    (_variant_sdpa(mask_mode="fill_1e9"), [A_MASK, A_HID_MASK], "-1e9"),
    (_variant_sdpa(mask_mode="where_1e9"), [A_MASK, A_HID_MASK], "float16"),
    (_variant_sdpa(mask_mode="additive"), [A_MASK, A_HID_MASK], "keep the dtype of q"),
    (_variant_sdpa(mask_mode="nan_grad"), [A_HID_MASK], "gradient"),
    (sdpa_upcast, [A_MASK, A_HID, A_HID_MASK], "keep the dtype of q"),
    (sdpa_softmax_no_max, [A_MASK, A_HID, A_HID_MASK], "Your softmax overflows"),
    (sdpa_half_overflow, [A_MASK, A_HID_MASK], "Your softmax overflows"),
    (sdpa_torch, [A_VIS, A_MASK, A_HID, A_HID_MASK], "torch.softmax"),
    (sdpa_fused, [A_VIS, A_MASK, A_HID, A_HID_MASK], "scaled_dot_product_attention"),
    (sdpa_kit, [A_VIS, A_MASK, A_HID, A_HID_MASK], "does not allow"),
    (sdpa_kit_masked, [A_VIS, A_MASK, A_HID, A_HID_MASK], "masked_attention"),
    (sdpa_out_only, [A_VIS, A_MASK, A_HID, A_HID_MASK], "pair (out, weights)"),
]


def _id(case: tuple) -> str:
    fn, _checks, words = case
    return f"{getattr(fn, '__name__', 'variant')}-{words[:24]}"


def _outcome(check: Callable, fn: Callable) -> str:
    try:
        check(fn)
    except AssertionError as exc:
        return str(exc)
    return ""


@pytest.mark.filterwarnings("ignore:The use of `x.T`")
@pytest.mark.parametrize("case", MISTAKES, ids=[_id(c) for c in MISTAKES])
def test_mistake_fails_the_right_checks_with_a_message_that_names_it(case: tuple) -> None:
    fn, failing, words = case
    checks = next(group for group in ALL_CHECKS if failing[0] in group)
    for check in checks:
        message = _outcome(check, fn)
        if check in failing:
            assert message, f"{check} passed"
            assert words.lower() in message.lower(), message
        else:
            assert message == "", message


@pytest.mark.parametrize("checks", ALL_CHECKS, ids=["softmax", "loop", "matrix", "sdpa"])
def test_not_implemented_says_so(checks: list[Callable]) -> None:
    def not_implemented(*args, **kwargs):
        raise NotImplementedError()

    for check in checks:
        assert "not implemented yet" in _outcome(check, not_implemented)


def test_mask_mistakes_say_what_went_wrong() -> None:
    """The masked keys out-score the allowed ones, so each mask mistake is named precisely."""
    after = _outcome(A_MASK, _variant_sdpa(mask_mode="after"))
    assert "sums to" in after and "score highest" in after
    ignored = _outcome(A_MASK, _variant_sdpa(mask_mode="ignore"))
    assert "keys the mask forbids" in ignored and "take most of the weight" in ignored
    overflow = _outcome(A_MASK, _variant_sdpa(mask_mode="fill_1e9"))
    assert "float16" in overflow and "finfo(scores.dtype).min" in overflow
    nan = _outcome(A_HID_MASK, _variant_sdpa(mask_mode="where_1e9"))
    assert "NaN" in nan and "-1e9 becomes -inf in float16" in nan


def test_masked_keys_score_highest_in_every_masked_example() -> None:
    """The adversarial inputs: every forbidden score beats every allowed score of its row."""
    for what in lab02.SDPA_MASK_EXAMPLES:
        q, k, _, mask = lab02.example(what, "q", "k", "v", "mask")
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        mask = torch.broadcast_to(mask, scores.shape)
        allowed = scores.masked_fill(~mask, float("-inf")).amax(-1)
        forbidden = scores.masked_fill(mask, float("inf")).amin(-1)
        has_both = mask.any(-1) & (~mask).any(-1)
        assert bool((forbidden[has_both] > allowed[has_both] + 1.0).all()), what
        assert bool((~mask).all(-1).any()) or "causal" in what  # rows that allow no key


def test_structure_only_mistakes_keep_the_value_points() -> None:
    """A loop form that vectorises (or a matrix form that loops) is still numerically right."""
    for fn in (sa_loop_fake, sa_loop_rows_of_full, sa_loop_broadcast):
        lab02.check_self_attention_loop(fn)
        hidden02.hidden_check_self_attention_loop(fn, seed=2201)
    lab02.check_self_attention_matrix(sa_loop)
    hidden02.hidden_check_self_attention_matrix(sa_loop, seed=2301)


def test_mask_mistakes_keep_the_unmasked_points() -> None:
    for mode in (
        "invert",
        "ignore",
        "nan",
        "uniform",
        "after",
        "fill_1e9",
        "where_1e9",
        "nan_grad",
    ):
        fn = _variant_sdpa(mask_mode=mode)
        lab02.check_scaled_dot_product_attention(fn)
        hidden02.hidden_check_scaled_dot_product_attention(fn, seed=2401)


def test_the_operation_log_sees_loops() -> None:
    X = torch.randn(6, 4)
    W = torch.randn(4, 3)
    with OpLog() as log:
        [X[i] @ W for i in range(X.shape[0])]
    assert sum(name == "matmul" for name, _ in log.ops) == 6


def test_forbidden_is_lifted_after_a_check() -> None:
    with pytest.raises(AssertionError, match=r"torch\.softmax, which this exercise does not allow"):
        lab02.check_softmax(sm_torch)
    x = torch.randn(3, 4)
    torch.testing.assert_close(torch.softmax(x, -1), softmax(x))
    torch.testing.assert_close(F.softmax(x, dim=0), softmax(x, 0))


def test_visible_checks_hold_no_oracle() -> None:
    """The student package's checks compare with stored examples; the hidden module computes."""
    import inspect

    source = inspect.getsource(lab02)
    for needle in ("torch.softmax(", "F.softmax(", "log_softmax(", "oracle_", "_attend("):
        assert needle not in source, needle


def test_stored_examples_are_what_the_hidden_checks_compute() -> None:
    from transformer_lab.grading.fixtures import check_fixtures

    assert check_fixtures(Path(__file__).resolve().parents[1], ["02_self_attention"]) == []


def test_the_kits_own_attention_passes_every_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks' oracle and the kit's implementation agree (with the kit's names unbanned)."""
    from transformer_lab import attention as kit

    torch_only = tuple(n for n in lab02.BAN.functions if not n.startswith("transformer_lab."))
    monkeypatch.setattr(lab02, "BAN", dataclasses.replace(lab02.BAN, functions=torch_only))
    for fn, checks in zip(
        (
            kit.softmax,
            kit.self_attention_loop,
            kit.self_attention_matrix,
            kit.scaled_dot_product_attention,
        ),
        ALL_CHECKS,
        strict=True,
    ):
        for check in checks:
            check(fn)


def test_zeroing_the_inputs_cannot_make_the_oracle_agree() -> None:
    """The expected value is computed after the call, on the inputs as the check made them."""
    with pytest.raises(AssertionError, match="weights of scaled_dot_product_attention"):
        hidden02.hidden_check_scaled_dot_product_attention(zeroing_attention, seed=3)

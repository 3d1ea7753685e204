"""The lab 02 checks against a catalogue of typical mistakes (no nbgrader, fast).

For every graded function: correct implementations written in different styles pass every
check, and each typical wrong implementation fails the check it should with a message that
names the mistake. The checks live in ``transformer_lab/checks/lab02.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from transformer_lab.checks import lab02

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
        out[n] = softmax(scores[n]) @ V
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


def sm_torch(x, dim=-1):
    return torch.softmax(x, dim)


def sm_functional(x, dim=-1):
    return F.softmax(x, dim=dim)


def sm_method(x, dim=-1):
    return x.softmax(dim)


def sm_package(x, dim=-1):
    from transformer_lab.attention import softmax as pkg_softmax

    return pkg_softmax(x, dim)


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


def _variant_loop(**kw) -> Callable:
    """A loop form that is right in structure but carries the mistake of ``_variant_matrix``."""
    matrix = _variant_matrix(**kw)

    def fn(X, W_q, b_q, W_k, b_k, W_v, b_v):
        full = matrix(X, W_q, b_q, W_k, b_k, W_v, b_v)
        rows = [full[n] + 0 * X[n].sum() for n in range(X.shape[0])]  # per-token work
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


def sa_matrix_torch_softmax(X, W_q, b_q, W_k, b_k, W_v, b_v):
    Q, K, V = _qkv(X, W_q, b_q, W_k, b_k, W_v, b_v)
    return torch.softmax(Q @ K.T / math.sqrt(K.shape[1]), -1) @ V


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
        elif mask_mode == "nan_grad":
            # An additive -inf mask: the forward pass is repaired, the backward pass is not.
            bias = torch.zeros(m.shape).masked_fill(~m, float("-inf"))
            w = torch.nan_to_num(softmax(scores + bias, dim=axis), nan=0.0)
        else:
            w = softmax(scores.masked_fill(~m, torch.finfo(scores.dtype).min), dim=axis) * m
        return w @ v, w

    return fn


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


def sdpa_out_only(q, k, v, mask=None):
    return sdpa(q, k, v, mask)[0]


# --------------------------------------------------------------------------------------------------
# the tables: which checks a function passes, which it fails and with what words
# --------------------------------------------------------------------------------------------------

SOFTMAX_CHECKS = [
    lab02.check_softmax,
    lambda f: lab02.hidden_check_softmax(f, seed=11),
    lambda f: lab02.hidden_check_softmax_stability(f, seed=12),
]
LOOP_CHECKS = [
    lab02.check_self_attention_loop,
    lab02.check_self_attention_loop_uses_loops,
    lambda f: lab02.hidden_check_self_attention_loop(f, seed=13),
]
MATRIX_CHECKS = [
    lab02.check_self_attention_matrix,
    lab02.check_self_attention_matrix_no_loops,
    lambda f: lab02.hidden_check_self_attention_matrix(f, seed=14),
]
SDPA_CHECKS = [
    lab02.check_scaled_dot_product_attention,
    lab02.check_scaled_dot_product_attention_mask,
    lambda f: lab02.hidden_check_scaled_dot_product_attention(f, seed=15),
    lambda f: lab02.hidden_check_scaled_dot_product_attention_mask(f, seed=16),
]


@pytest.mark.parametrize(
    ("fn", "checks"),
    [
        (softmax, SOFTMAX_CHECKS),
        (softmax_logsumexp, SOFTMAX_CHECKS),
        (softmax_amax, SOFTMAX_CHECKS),
        (sa_loop, LOOP_CHECKS),
        (sa_loop_table, LOOP_CHECKS),
        (sa_matrix, MATRIX_CHECKS),
        (sa_matrix_einsum, MATRIX_CHECKS),
        (sa_matrix_columns, MATRIX_CHECKS),
        (sdpa, SDPA_CHECKS),
        (sdpa_where, SDPA_CHECKS),
    ],
    ids=lambda v: getattr(v, "__name__", "checks"),
)
def test_correct_implementations_pass(fn: Callable, checks: list[Callable]) -> None:
    for check in checks:
        check(fn)


S_VIS, S_VAL, S_STAB = SOFTMAX_CHECKS
L_VIS, L_LOOPS, L_HID = LOOP_CHECKS
M_VIS, M_NOLOOP, M_HID = MATRIX_CHECKS
A_VIS, A_MASK, A_HID, A_HID_MASK = SDPA_CHECKS

# (wrong implementation, the checks that must fail, words the message must contain)
MISTAKES = [
    # softmax
    (sm_no_max, [S_VIS, S_STAB], "Subtract the maximum"),
    (sm_ignores_dim, [S_VIS, S_VAL, S_STAB], "instead of dim=0"),
    (sm_always_dim0, [S_VIS, S_VAL], "instead of dim="),
    (sm_global_max, [S_VIS, S_STAB], "maximum of the whole tensor"),
    (sm_global_sum, [S_VIS, S_VAL], "sum along `dim` only"),
    (sm_in_place, [S_VIS, S_VAL, S_STAB], "in place"),
    (sm_no_keepdim, [S_VIS, S_VAL], "RuntimeError"),
    (sm_torch, [S_VIS, S_VAL, S_STAB], "torch.softmax"),
    (sm_functional, [S_VIS, S_VAL, S_STAB], "does not allow"),
    (sm_method, [S_VIS, S_VAL, S_STAB], "torch.Tensor.softmax"),
    (sm_package, [S_VIS, S_VAL, S_STAB], "transformer_lab.attention.softmax"),
    # self_attention_loop
    (_variant_loop(scale="none"), [L_VIS, L_HID], "without scaling"),
    (_variant_loop(scale="d"), [L_VIS, L_HID], "divided by d_k"),
    (_variant_loop(scale="D"), [L_VIS, L_HID], "sqrt(D), the input width"),
    (_variant_loop(bias=False), [L_VIS, L_HID], "bias"),
    (_variant_loop(swap=True), [L_VIS, L_HID], "swapped"),
    (_variant_loop(reshape_k=True), [L_VIS, L_HID], "reshape does not transpose"),
    (_variant_loop(axis=0), [L_VIS, L_HID], "queries' axis"),
    (_variant_loop(tw=True), [L_VIS, L_HID], "A^T V"),
    (sa_loop_fake, [L_LOOPS], "does not grow with the number of tokens"),
    (sa_loop_rows_of_full, [L_LOOPS], "whole table of scores"),
    (sa_loop_broadcast, [L_LOOPS], "whole table of scores"),
    (sa_loop_sdpa, [L_VIS, L_LOOPS, L_HID], "scaled_dot_product_attention"),
    # self_attention_matrix
    (sa_loop, [M_NOLOOP], "it loops over tokens"),
    (_variant_matrix(scale="none"), [M_VIS, M_HID], "without scaling"),
    (_variant_matrix(scale="d"), [M_VIS, M_HID], "divided by d_k"),
    (_variant_matrix(bias=False), [M_VIS, M_HID], "bias"),
    (_variant_matrix(swap=True), [M_VIS, M_HID], "swapped"),
    (_variant_matrix(reshape_k=True), [M_VIS, M_HID], "reshape does not transpose"),
    (_variant_matrix(axis=0), [M_VIS, M_HID], "queries' axis"),
    (sa_matrix_torch_softmax, [M_VIS, M_NOLOOP, M_HID], "torch.softmax"),
    # scaled_dot_product_attention
    (_variant_sdpa(scale="none"), [A_VIS, A_MASK, A_HID, A_HID_MASK], "without scaling"),
    (_variant_sdpa(scale="d"), [A_VIS, A_MASK, A_HID, A_HID_MASK], "divided by d_k"),
    (_variant_sdpa(axis=-2), [A_VIS, A_MASK, A_HID, A_HID_MASK], "queries' axis"),
    (_variant_sdpa(swap=True), [A_VIS, A_MASK], "swapped"),
    (_variant_sdpa(kT=True), [A_VIS, A_MASK, A_HID, A_HID_MASK], "k.T"),
    (_variant_sdpa(mask_mode="invert"), [A_MASK, A_HID_MASK], "mask inverted"),
    (_variant_sdpa(mask_mode="ignore"), [A_MASK, A_HID_MASK], "mask is ignored"),
    (_variant_sdpa(mask_mode="nan"), [A_MASK, A_HID_MASK], "NaN"),
    (_variant_sdpa(mask_mode="uniform"), [A_MASK, A_HID_MASK], "equal weights 1/S"),
    (_variant_sdpa(mask_mode="after"), [A_MASK, A_HID_MASK], "no longer sum to 1"),
    (_variant_sdpa(mask_mode="nan_grad"), [A_HID_MASK], "gradient"),
    (sdpa_torch, [A_VIS, A_MASK, A_HID, A_HID_MASK], "torch.softmax"),
    (sdpa_fused, [A_VIS, A_MASK, A_HID, A_HID_MASK], "scaled_dot_product_attention"),
    (sdpa_out_only, [A_VIS, A_MASK, A_HID, A_HID_MASK], "pair (out, weights)"),
]


def _id(case: tuple) -> str:
    fn, _checks, words = case
    return f"{getattr(fn, '__name__', 'variant')}-{words[:24]}"


@pytest.mark.filterwarnings("ignore:The use of `x.T`")
@pytest.mark.parametrize("case", MISTAKES, ids=[_id(c) for c in MISTAKES])
def test_mistake_fails_with_a_message_that_names_it(case: tuple) -> None:
    fn, failing, words = case
    for check in failing:
        with pytest.raises(AssertionError) as info:
            check(fn)
        assert words.lower() in str(info.value).lower(), str(info.value)


@pytest.mark.parametrize(
    "case",
    [c for c in MISTAKES if c[1] in ([L_LOOPS], [M_NOLOOP])],
    ids=lambda c: c[0].__name__,
)
def test_structure_only_mistakes_keep_the_value_points(case: tuple) -> None:
    """A loop form that vectorises (or a matrix form that loops) is still numerically right."""
    fn, failing, _ = case
    checks = LOOP_CHECKS if failing == [L_LOOPS] else MATRIX_CHECKS
    for check in checks:
        if check not in failing:
            check(fn)


def test_mask_mistakes_keep_the_unmasked_points() -> None:
    for mode in ("invert", "ignore", "nan", "uniform", "after", "nan_grad"):
        fn = _variant_sdpa(mask_mode=mode)
        lab02.check_scaled_dot_product_attention(fn)
        lab02.hidden_check_scaled_dot_product_attention(fn, seed=15)


def test_count_operations_sees_loops() -> None:
    X = torch.randn(6, 4)
    W = torch.randn(4, 3)
    ops = lab02.count_operations(lambda x: [x[i] @ W for i in range(x.shape[0])], X)
    assert sum(name == "matmul" for name, _ in ops) == 6


def test_forbidden_is_lifted_after_a_check() -> None:
    with pytest.raises(AssertionError, match=r"torch\.softmax, which this exercise does not allow"):
        lab02.check_softmax(sm_torch)
    x = torch.randn(3, 4)
    torch.testing.assert_close(torch.softmax(x, -1), softmax(x))
    torch.testing.assert_close(F.softmax(x, dim=0), softmax(x, 0))


def test_the_kits_own_attention_passes_every_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks' oracle and the kit's implementation agree (with the kit's names unbanned)."""
    from transformer_lab import attention as kit

    kit_names = lab02._BAN.functions
    torch_only = tuple(n for n in kit_names if not n.startswith("transformer_lab."))
    monkeypatch.setattr(lab02, "_BAN", dataclasses.replace(lab02._BAN, functions=torch_only))
    for fn, checks in (
        (kit.softmax, SOFTMAX_CHECKS),
        (kit.self_attention_loop, LOOP_CHECKS),
        (kit.self_attention_matrix, MATRIX_CHECKS),
        (kit.scaled_dot_product_attention, SDPA_CHECKS),
    ):
        for check in checks:
            check(fn)

"""Hidden checks of lab 02 (self-attention), their oracles and the visible checks' fixtures.

The oracles compute in float64 with PyTorch's own ``torch.softmax``; the typical mistakes'
outputs (:func:`softmax_mistakes`, :func:`self_attention_mistakes`, the shared catalogue of
:mod:`~transformer_lab.grading.hidden._attention`) name a wrong answer. The masked examples are
adversarial (:func:`adversarial_keys`: the masked keys score highest) and include empty rows,
``T != S``, float16 and bfloat16 and a backward pass through an empty row.

Reference: Prince, *Understanding Deep Learning*, sections 12.2 and 12.3.2; Vaswani et al.,
"Attention Is All You Need", NeurIPS 2017, section 3.2.1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from transformer_lab.checks import lab02
from transformer_lab.checks._attention import call_attention, expect_finite_gradients
from transformer_lab.checks._common import generator, randint
from transformer_lab.checks.lab02 import (
    SA_ARGS,
    SA_EXAMPLES,
    SDPA_EXAMPLES,
    SDPA_MASK_EXAMPLES,
    SOFTMAX_EXAMPLES,
    call_self_attention,
    call_softmax,
    example_dtype,
    expect_attention,
    judge_self_attention,
    judge_softmax,
    tolerance,
)
from transformer_lab.grading.hidden import fixture_entry
from transformer_lab.grading.hidden._attention import (
    attend64,
    attend_as,
    attention_mistakes,
    pair_entries,
)

__all__ = [
    "fixtures",
    "hidden_check_scaled_dot_product_attention",
    "hidden_check_scaled_dot_product_attention_mask",
    "hidden_check_self_attention_loop",
    "hidden_check_self_attention_matrix",
    "hidden_check_softmax",
    "hidden_check_softmax_stability",
]


def oracle_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Reference softmax in float64 (torch's own)."""
    return torch.softmax(x.double(), dim)


def _project(args: tuple[Tensor, ...]) -> tuple[Tensor, Tensor, Tensor]:
    X, W_q, b_q, W_k, b_k, W_v, b_v = (t.double() for t in args)
    return X @ W_q + b_q, X @ W_k + b_k, X @ W_v + b_v


def oracle_self_attention(*args: Tensor) -> Tensor:
    """Reference single-sequence self-attention ``(N, d_v)`` in float64."""
    Q, K, V = _project(args)
    return attend64(Q, K, V, None)[0]


def softmax_mistakes(x: Tensor, dim: int) -> dict[str, Tensor]:
    """Hint -> what a typical wrong ``softmax(x, dim)`` returns (float64)."""
    xd = x.double()
    out: dict[str, Tensor] = {}
    for other in range(xd.dim()):
        if other % xd.dim() != dim % xd.dim():
            out[
                f"It matches a softmax over dim={other} instead of dim={dim}: normalise along "
                "the `dim` argument (use it in the max, in the sum, and keepdim=True)."
            ] = torch.softmax(xd, other)
    e = torch.exp(xd - xd.amax(dim, keepdim=True))
    out[
        "It matches dividing by the sum over the whole tensor: sum along `dim` only "
        "(e.sum(dim, keepdim=True))."
    ] = e / e.sum()
    out["It matches exp(x) without dividing by the sum along `dim`."] = torch.exp(xd)
    out["It matches exp(x - max) without dividing by the sum along `dim`: normalise."] = e
    out["It matches x / sum(x): exponentiate first, then normalise."] = xd / xd.sum(
        dim, keepdim=True
    )
    try:  # a sum without keepdim broadcasts against the wrong axis (when the sizes allow it)
        wrong = e / e.sum(dim)
        out[
            "It matches dividing by e.sum(dim) without keepdim=True: the sum loses its axis "
            "and broadcasts against the wrong one. Use e.sum(dim, keepdim=True)."
        ] = wrong
    except RuntimeError:
        pass
    try:
        shifted = torch.exp(xd - xd.amax(dim))
        out[
            "It matches subtracting x.max(dim) without keepdim=True: the maximum loses its "
            "axis and is subtracted along the wrong one. Use x.amax(dim, keepdim=True)."
        ] = shifted / shifted.sum(dim, keepdim=True)
    except RuntimeError:
        pass
    unstable = torch.exp(x).double()  # in the input's dtype: exp(1000) is inf in float32
    out[
        "It overflows or underflows on large logits: exp(1000) is inf in float32 (exp(12) in "
        "float16). Subtract the maximum along `dim` before exponentiating; softmax does not "
        "change when the same constant is subtracted from every input."
    ] = unstable / unstable.sum(dim, keepdim=True)
    glob = torch.exp(x - x.max()).double()
    out[
        "It subtracts the maximum of the whole tensor: rows far below that maximum underflow "
        "to 0/0. Subtract the maximum along `dim` (x.amax(dim, keepdim=True))."
    ] = glob / glob.sum(dim, keepdim=True)
    return out


def self_attention_mistakes(*args: Tensor) -> dict[str, Tensor]:
    """Hint -> what a typical wrong single-sequence self-attention returns (float64): the
    shared catalogue's mistakes on ``Q, K, V``, then those of the projections."""
    X, W_q, _, W_k, _, W_v, _ = (t.double() for t in args)
    Q, K, V = _project(args)
    d = X.shape[1]
    extra = {
        "It matches scores divided by sqrt(D), the input width: scale by sqrt(d_k), the "
        "width of the queries and keys (W_q.shape[1]).": attend_as(Q, K, V, scale=d**-0.5)
        if d != W_q.shape[1]
        else None,
        "It matches A^T V: row n of the output is sum_m a[n, m] v_m, i.e. A @ V with the "
        "weights of query n in row n of A.": attend_as(Q, K, V, transpose_weights=True),
        "It matches attention without the value bias: V = X W_v + b_v.": attend_as(Q, K, X @ W_v),
        "It matches attention without the biases: Q = X W_q + b_q, and the same for K, V.": (
            attend_as(X @ W_q, X @ W_k, X @ W_v)
        ),
        "It matches V itself: each output row is its own value vector. Row n is the sum over "
        "m of weight[n, m] * v_m: index the values by the key m, not by the query n.": (V, V)
        if X.shape[0] > 1
        else None,
    }
    shared = attention_mistakes(Q, K, V, None) | extra
    return {hint: pair[0] for hint, pair in shared.items() if pair is not None}


def adversarial_keys(
    q: Tensor, mask: Tensor, s: int, g: torch.Generator, margin: float = 2.0
) -> Tensor:
    """Keys ``(..., S, d_k)`` whose scaled scores with ``q`` are standard normal where ``mask``
    allows them and at least ``margin`` above their row's largest allowed score where it does
    not (solved with the pseudo-inverse of ``q``: needs ``T <= d_k``)."""
    *lead, t, dk = q.shape
    if t > dk:
        raise ValueError(f"adversarial keys need T <= d_k, got T={t}, d_k={dk}")
    full = torch.broadcast_to(mask, (*lead, t, s))
    target = torch.randn(*lead, t, s, generator=g, dtype=torch.float64)
    best = target.masked_fill(~full, float("-inf")).amax(-1, keepdim=True)  # (..., T, 1)
    best = torch.where(torch.isfinite(best), best, torch.zeros_like(best))
    above = best + margin + torch.rand(*lead, t, s, generator=g, dtype=torch.float64)
    target = torch.where(full, target, above)  # (..., T, S)
    kt = torch.linalg.pinv(q.double()) @ (target * math.sqrt(dk))  # (..., Dk, S)
    return kt.transpose(-2, -1).float()  # (..., S, Dk)


def _self_attention_inputs(n: int, d: int, dk: int, dv: int, g: torch.Generator) -> tuple:
    """Random ``X (N, D)``, ``W_q, b_q, W_k, b_k`` (width ``d_k``), ``W_v, b_v`` (``d_v``)."""
    shapes = [(n, d), (d, dk), (dk,), (d, dk), (dk,), (d, dv), (dv,)]
    return tuple(torch.randn(*shape, generator=g) for shape in shapes)


def _masked_inputs(
    lead: tuple[int, ...], t: int, s: int, dk: int, dv: int, mask: Tensor, g: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    q = torch.randn(*lead, t, dk, generator=g)
    k = adversarial_keys(q, mask, s, g)
    v = torch.randn(*lead, s, dv, generator=g) * 2
    return q, k, v


def _expect_softmax(fn: Callable[..., Tensor], x: Tensor, dim: int | None, what: str) -> None:
    d = -1 if dim is None else dim
    got = call_softmax(fn, x, dim, what)
    judge_softmax(got, oracle_softmax(x, d), softmax_mistakes(x, d), what, x)


def hidden_check_softmax(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Random shapes, ``dim`` values and scales (float32 and float64) against torch's softmax."""
    g = generator(seed)
    for trial, (shape, dim) in enumerate(
        [((7,), -1), ((3, 5), 0), ((2, 3, 4), 1), ((4, 1, 6), -1), ((2, 5, 3), -2), ((4, 4), 1)]
    ):
        scale = 0.2 + 5.0 * float(torch.rand(1, generator=g))
        x = torch.randn(*shape, generator=g) * scale
        if trial == 4:
            x = x.double()
        _expect_softmax(fn, x, dim, f"softmax(x, dim={dim}) for x of shape {shape} ({x.dtype})")


def hidden_check_softmax_stability(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Huge logits, rows on very different scales, ``-inf`` entries, float16 and bfloat16."""
    g = generator(seed)
    x = torch.randn(4, 6, generator=g) * 3 + torch.tensor([[5e3], [-5e3], [0.0], [80.0]])
    _expect_softmax(fn, x, -1, "softmax of rows offset by +5000, -5000, 0 and 80")
    cols = torch.randn(5, 3, generator=g) + torch.tensor([1e4, -1e4, 90.0])
    _expect_softmax(fn, cols, 0, "softmax(x, dim=0) of columns offset by +1e4, -1e4 and 90")
    masked = torch.randn(3, 5, generator=g)
    masked[0, 1] = masked[2, 0] = masked[2, 4] = float("-inf")
    _expect_softmax(fn, masked, -1, "softmax of logits with some -inf entries (masked keys)")
    half = (torch.randn(3, 6, generator=g) * 2 + torch.tensor([[12.0], [-12.0], [0.0]])).half()
    _expect_softmax(fn, half, -1, "softmax of float16 logits up to 16 (exp(12) overflows)")
    brain = (torch.randn(2, 5, generator=g) * 2 + torch.tensor([[4.0], [-4.0]])).bfloat16()
    _expect_softmax(fn, brain, -1, "softmax of bfloat16 logits")


def _expect_self_attention(fn: Callable[..., Tensor], args: tuple[Tensor, ...], what: str) -> None:
    Q, K, _ = _project(args)
    scale = float(Q.norm(dim=-1).max() * K.norm(dim=-1).max()) / math.sqrt(Q.shape[-1])
    judge_self_attention(
        call_self_attention(fn, args, what),
        oracle_self_attention(*args),
        self_attention_mistakes(*args),
        what,
        tol=tolerance(torch.float32, scale),
    )


def _hidden_self_attention(fn: Callable[..., Tensor], name: str, seed: int) -> None:
    g = generator(seed)
    for _ in range(4):
        n, d, dk, dv = (randint(2, 9, g), randint(2, 8, g), randint(1, 8, g), randint(1, 8, g))
        if dv == n:  # a transposed (d_v, N) answer must not fit the (N, d_v) shape
            dv += 1
        args = _self_attention_inputs(n, d, dk, dv, g)
        _expect_self_attention(fn, args, f"{name} with N={n}, D={d}, d_k={dk}, d_v={dv}")
    # Larger queries and keys: the 1/sqrt(d_k) scale matters a lot here.
    args = _self_attention_inputs(6, 5, 16, 4, g)
    args = (args[0] * 2, *args[1:])
    _expect_self_attention(fn, args, f"{name} with d_k=16 and large scores")


def hidden_check_self_attention_loop(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Random sizes (``d_k``, ``d_v`` and ``D`` all different) and weights against the oracle."""
    _hidden_self_attention(fn, "self_attention_loop", seed)


def hidden_check_self_attention_matrix(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Random sizes (``d_k``, ``d_v`` and ``D`` all different) and weights against the oracle."""
    _hidden_self_attention(fn, "self_attention_matrix", seed)


def _expect_attention(fn: Callable[..., Any], *qkv_mask: Any, what: str) -> None:
    want, mistakes = attend64(*qkv_mask), attention_mistakes(*qkv_mask)
    expect_attention(fn, *qkv_mask, what, want, mistakes)


def hidden_check_scaled_dot_product_attention(fn: Callable[..., Any], seed: int = 0) -> None:
    """Random leading dims, ``T != S``, ``d_v != d_k``, large logits, float64 and bfloat16."""
    g = generator(seed)
    q, k, v = (torch.randn(2, 5, 4, generator=g) * 2 for _ in range(3))
    v = torch.randn(2, 5, 3, generator=g)
    _expect_attention(
        fn, q, k, v, None, what="scaled_dot_product_attention on q, k (2, 5, 4), v (2, 5, 3)"
    )
    for lead in [(), (3,), (2, 2), (1, 3, 2)]:
        t, s, dk, dv = (randint(1, 6, g), randint(1, 7, g), randint(1, 9, g), randint(1, 5, g))
        if s == t:
            s += 1
        q = torch.randn(*lead, t, dk, generator=g) * 2
        k = torch.randn(*lead, s, dk, generator=g) * 2
        v = torch.randn(*lead, s, dv, generator=g)
        shapes = f"q {(*lead, t, dk)}, k {(*lead, s, dk)}, v {(*lead, s, dv)}"
        _expect_attention(fn, q, k, v, None, what=f"scaled_dot_product_attention on {shapes}")
    # Scores in the thousands: a softmax without the max-subtraction overflows.
    q = torch.randn(2, 5, 8, generator=g) * 30
    k = torch.randn(2, 6, 8, generator=g) * 30
    v = torch.randn(2, 6, 3, generator=g)
    _expect_attention(
        fn, q, k, v, None, what="scaled_dot_product_attention with scores in the thousands"
    )
    for dtype in (torch.float64, torch.bfloat16):
        q = torch.randn(2, 3, 4, generator=g).to(dtype)
        k = torch.randn(2, 5, 4, generator=g).to(dtype)
        v = torch.randn(2, 5, 6, generator=g).to(dtype)
        what = f"scaled_dot_product_attention in {str(dtype).replace('torch.', '')}"
        _expect_attention(fn, q, k, v, None, what=what)


def hidden_check_scaled_dot_product_attention_mask(fn: Callable[..., Any], seed: int = 0) -> None:
    """Masks of several broadcast shapes whose masked keys score highest, empty rows, T != S,
    float64, float16 and bfloat16, and finite gradients through an empty row."""
    g = generator(seed)
    b, h, t, s, dk, dv = 2, 3, 5, 7, 7, 3
    square = torch.rand(b, h, t, t, generator=g) < 0.5
    square[1, 2, 4] = False  # an empty row
    full = torch.rand(b, h, t, s, generator=g) < 0.6
    full[0, 1, 2] = False  # an empty row
    full[1, 0, 0] = True
    sparse = torch.rand(b, 1, t, s, generator=g) < 0.3
    sparse[1, 0, 3] = False  # at least one empty row
    lengths = torch.tensor([4, 2])
    masks = {
        "a random (B, H, T, T) mask with an empty row": square,
        "a random (B, H, T, S) mask with an empty row (S != T)": full,
        "a (T, S) causal-like mask shared by the batch": torch.ones(t, s, dtype=torch.bool).tril(),
        "a (B, 1, 1, S) key padding mask": (torch.arange(s) < lengths[:, None])[:, None, None, :],
        "a (B, 1, T, S) mask with empty rows": sparse,
    }
    for label, mask in masks.items():
        size = mask.shape[-1]
        q, k, v = _masked_inputs((b, h), t, size, dk, dv, mask, g)
        _expect_attention(fn, q, k, v, mask, what=f"scaled_dot_product_attention with {label}")
    small = torch.rand(b, 4, 6, generator=g) < 0.5
    small[0, 2] = False  # an empty row
    small[1, 1, 0] = True
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        q, k, v = _masked_inputs((b,), 4, 6, 5, 2, small, g)
        q, k, v = (x.to(dtype) for x in (q, k, v))
        name = str(dtype).replace("torch.", "")
        what = f"scaled_dot_product_attention in {name} with a (B, T, S) mask with an empty row"
        _expect_attention(fn, q, k, v, small, what=what)

    # Gradients: an empty row must not poison the gradients with NaN (it would during training).
    q, k, v = _masked_inputs((b, h), t, s, dk, dv, full, g)
    what = "scaled_dot_product_attention with an empty mask row (backward pass)"
    expect_finite_gradients(
        lambda *qkv: call_attention(fn, *qkv, full, what, ban=lab02.BAN), q, k, v, what
    )


def _attention_example(key: str, g: torch.Generator) -> dict[str, Tensor]:
    """Inputs (float32; the mask as bool) of the visible attention examples, by name."""
    if "T=S=4" in key:
        q, k, v = (torch.randn(4, n, generator=g) * s for n, s in ((3, 2.0), (3, 2.0), (5, 1.0)))
        return {"q": q, "k": k, "v": v}
    if "(2, 3, 2, 4)" in key:
        q, k, v = (torch.randn(2, 3, *size, generator=g) for size in ((2, 4), (5, 4), (5, 6)))
        return {"q": q, "k": k, "v": v}
    if "causal" in key:
        mask = torch.tril(torch.ones(4, 4, dtype=torch.bool))
        q, k, v = _masked_inputs((2,), 4, 4, 6, 3, mask, g)
        return {"q": q, "k": k, "v": v, "mask": mask}
    mask = torch.tensor(
        [
            [[True, False, True, True, False], [False] * 5, [True, True, False, False, False]],
            [[True] * 4 + [False], [False, True, False, False, True], [False] * 5],
        ]
    )  # (B=2, T=3, S=5)
    q, k, v = _masked_inputs((2,), 3, 5, 5, 2, mask, g)
    return {"q": q, "k": k, "v": v, "mask": mask}


def fixtures() -> dict[str, dict[str, Any]]:
    """The stored examples of :mod:`transformer_lab.checks.lab02`, keyed by the example."""
    out: dict[str, dict[str, Any]] = {}
    for what, (x, dim) in SOFTMAX_EXAMPLES.items():
        d = -1 if dim is None else dim
        out[what] = fixture_entry(oracle_softmax(x, d), softmax_mistakes(x, d))

    g = generator(2)
    for label, (n, dv) in SA_EXAMPLES.items():
        args = _self_attention_inputs(n, 6, 4, dv, g)
        for name, t in zip(SA_ARGS, args, strict=True):
            out[f"self_attention {label}: {name}"] = fixture_entry(t)
        out[f"self_attention on {label}"] = fixture_entry(
            oracle_self_attention(*args), self_attention_mistakes(*args)
        )

    g = generator(3)
    for what in (*SDPA_EXAMPLES, *SDPA_MASK_EXAMPLES):
        example = _attention_example(what, g)
        for name, t in example.items():
            out[f"{what}: {name}"] = fixture_entry(t.double())
        q, k, v = (example[n].to(example_dtype(what)) for n in ("q", "k", "v"))
        mask = example.get("mask")
        out |= pair_entries(what, attend64(q, k, v, mask), attention_mistakes(q, k, v, mask))
    return out

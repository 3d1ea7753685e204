"""Self-checks for lab 03, multi-head attention.

The notebook's test cells call these functions on the student's ``split_heads``,
``merge_heads``, ``MultiHeadAttention`` and ``load_torch_weights``. Visible checks
(``check_<name>``) run small worked examples; hidden checks (``hidden_check_<name>``) draw seeded
random sizes and compare against ``torch.nn.MultiheadAttention(batch_first=True)`` with the
student's weights copied in, and against a float64 oracle written here for what torch cannot do
(rows with no allowed key, which torch turns into NaN). When an answer is wrong, the check
recomputes the typical wrong answers (a reshape without the transpose, a missing output
projection, scaling by ``d_model`` instead of the head width, an ignored or inverted mask, the
chunks of ``in_proj_weight`` in the wrong order or transposed, ...) and names the one the
student's output reproduces.

The student's code runs under :func:`~transformer_lab.checks._common.forbidden`: torch's
``nn.MultiheadAttention`` and ``F.multi_head_attention_forward``,
``F.scaled_dot_product_attention`` and the kit's own ``split_heads``, ``merge_heads``,
``MultiHeadAttention`` and ``load_torch_weights`` refuse to run. The kit's
``transformer_lab.attention.scaled_dot_product_attention`` (lab 02's function) stays allowed.

Torch's layout, which the checks rely on: ``in_proj_weight`` is ``(3D, D)`` with the query,
key and value projections stacked in that order, each in ``nn.Linear``'s ``(out, in)`` layout;
``in_proj_bias`` is ``(3D,)`` (None without bias); ``out_proj`` is an ``nn.Linear(D, D)``; a
boolean ``attn_mask`` means True = *not* allowed, the opposite of the kit's masks.

Reference: Prince, *Understanding Deep Learning*, section 12.3.4 (multiple heads); Vaswani et
al., "Attention Is All You Need" (2017), section 3.2.2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from transformer_lab.checks._common import (
    Ban,
    call_forbidding,
    close,
    compare,
    expect_close,
    expect_module,
    expect_shape,
    forbidden,
    generator,
    randint,
)

__all__ = [
    "check_load_torch_weights",
    "check_merge_heads",
    "check_multi_head_attention",
    "check_multi_head_attention_divisible",
    "check_split_heads",
    "check_split_heads_divisible",
    "copy_to_torch",
    "hidden_check_load_torch_weights",
    "hidden_check_merge_heads",
    "hidden_check_multi_head_attention",
    "hidden_check_multi_head_attention_mask",
    "hidden_check_split_heads",
]

_REASON = (
    "this lab asks for your own heads; transformer_lab.attention.scaled_dot_product_attention "
    "(lab 02) may be reused"
)
_BAN = Ban(
    ops=("attention",),
    functions=(
        "torch.nn.MultiheadAttention",
        "transformer_lab.attention.split_heads",
        "transformer_lab.attention.merge_heads",
        "transformer_lab.attention.MultiHeadAttention",
        "transformer_lab.attention.load_torch_weights",
    ),
    reason=_REASON,
)


# --------------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------------


def _run(fn: Callable[..., Any], *args: Any, what: str, on_error: str = "", **kwargs: Any) -> Any:
    """Call the student's ``fn`` with every shortcut disabled; add ``on_error`` to a crash."""
    return call_forbidding(fn, args, kwargs, ban=_BAN, what=what, on_error=on_error)


def _expect_value_error(
    fn: Callable[..., Any], args: tuple[Any, ...], names: Sequence[str], what: str
) -> None:
    """``fn(*args)`` must raise ``ValueError`` whose message contains every string in ``names``."""
    rule = (
        "Check it first and raise a ValueError that names both values, e.g. "
        'raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}").'
    )
    try:
        with forbidden(_BAN):
            result = fn(*args)
    except ValueError as exc:
        missing = [n for n in names if n not in str(exc)]
        if missing:
            raise AssertionError(
                f"{what} raised ValueError({str(exc)!r}), which does not name the offending "
                f"values {', '.join(missing)}: a student reading it cannot tell what to change. "
                + rule
            ) from None
        return
    except NotImplementedError:
        raise AssertionError(
            f"{what} is not implemented yet: replace `raise NotImplementedError()`."
        ) from None
    except AssertionError:
        raise
    except Exception as exc:
        raise AssertionError(
            f"{what} raised {type(exc).__name__}: {exc}. That message is torch's, about shapes, "
            "not about the real problem (the width does not split evenly into heads). " + rule
        ) from None
    got = f"a tensor of shape {tuple(result.shape)}" if isinstance(result, Tensor) else "a result"
    raise AssertionError(f"{what} returned {got} instead of raising ValueError. " + rule)


# --------------------------------------------------------------------------------------------------
# split_heads / merge_heads
# --------------------------------------------------------------------------------------------------


def _split(x: Tensor, h: int) -> Tensor:
    B, T, D = x.shape
    return x.reshape(B, T, h, D // h).transpose(1, 2)  # (B, H, T, Dh)


def _merge(x: Tensor) -> Tensor:
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * Dh)  # (B, T, D)


def _split_candidates(x: Tensor, h: int) -> list[tuple[Tensor | None, str]]:
    B, T, D = x.shape
    dh = D // h
    return [
        (
            x.reshape(B, h, T, dh),
            "It matches x.reshape(B, H, T, Dh) straight away: that cuts the memory in the "
            "wrong order, mixing tokens between heads. Reshape to (B, T, H, Dh) first, then "
            "transpose(1, 2).",
        ),
        (
            x.reshape(B, T, dh, h).permute(0, 3, 1, 2),
            "It matches heads that take every H-th feature (interleaved): head h must hold the "
            "contiguous slice of features h*Dh ... (h+1)*Dh - 1. Reshape to (B, T, H, Dh), "
            "not (B, T, Dh, H).",
        ),
    ]


def _merge_candidates(x: Tensor) -> list[tuple[Tensor | None, str]]:
    B, H, T, Dh = x.shape
    return [
        (
            x.reshape(B, T, H * Dh),
            "It matches x.reshape(B, T, H * Dh) without the transpose: that mixes tokens "
            "between positions. Bring the heads next to the features first: "
            "x.transpose(1, 2) gives (B, T, H, Dh), then reshape to (B, T, H * Dh).",
        ),
        (
            x.permute(0, 2, 3, 1).reshape(B, T, H * Dh),
            "It matches interleaved heads (features ordered Dh-major): the features of head 0 "
            "come first, then head 1, ...: transpose(1, 2) to (B, T, H, Dh), then reshape.",
        ),
    ]


_CONTIGUOUS_HINT = (
    "After a transpose the tensor is no longer contiguous in memory, so .view cannot flatten "
    "it: use .reshape(...) (or .contiguous().view(...))."
)


def _expect_split(fn: Callable[..., Any], x: Tensor, h: int, what: str) -> None:
    B, T, D = x.shape
    out = _run(fn, x, h, what=what)
    out = expect_shape(out, (B, h, T, D // h), f"{what}, (B, T, D) -> (B, H, T, D/H)")
    compare(
        out,
        _split(x, h),
        what=what,
        candidates=_split_candidates(x, h),
        hint="Head h of token t must hold features x[b, t, h*Dh:(h+1)*Dh].",
    )


def _expect_merge(fn: Callable[..., Any], x: Tensor, what: str) -> None:
    B, H, T, Dh = x.shape
    out = _run(fn, x, what=what, on_error=_CONTIGUOUS_HINT)
    out = expect_shape(out, (B, T, H * Dh), f"{what}, (B, H, T, Dh) -> (B, T, H*Dh)")
    compare(
        out,
        _merge(x),
        what=what,
        candidates=_merge_candidates(x),
        hint="merge_heads must undo split_heads: features h*Dh:(h+1)*Dh of token t come from "
        "head h at position t.",
    )


def check_split_heads(fn: Callable[..., Any]) -> None:
    """Visible check of ``split_heads(x, n_heads)`` on numbered features."""
    # Entry value = 100 * b + 10 * t + d, so a wrong entry shows where it came from.
    b, t, d = torch.meshgrid(torch.arange(2), torch.arange(3), torch.arange(8), indexing="ij")
    x = (100 * b + 10 * t + d).float()  # (2, 3, 8)
    _expect_split(fn, x, 2, "split_heads(x, 2) for x of shape (2, 3, 8)")
    _expect_split(fn, x, 4, "split_heads(x, 4) for x of shape (2, 3, 8)")
    _expect_split(fn, x, 1, "split_heads(x, 1) (a single head)")


def check_split_heads_divisible(fn: Callable[..., Any]) -> None:
    """Visible check: a width that does not split evenly raises a ValueError naming it."""
    x = torch.randn(2, 3, 10)
    _expect_value_error(fn, (x, 4), ("10", "4"), "split_heads(x, 4) for x of width d_model=10")


def hidden_check_split_heads(fn: Callable[..., Any], seed: int = 0) -> None:
    """Hidden check: random sizes, including one head and one feature per head."""
    g = generator(seed)
    for h, dh in [(randint(2, 6, g), randint(2, 5, g)), (3, 1), (1, 5), (randint(2, 4, g), 3)]:
        B, T = randint(1, 3, g), randint(1, 6, g)
        x = torch.randn(B, T, h * dh, generator=g)
        _expect_split(fn, x, h, f"split_heads(x, {h}) for x of shape {(B, T, h * dh)}")


def check_merge_heads(fn: Callable[..., Any]) -> None:
    """Visible check of ``merge_heads(x)``: a worked example and the round trip."""
    h, t, dh = torch.meshgrid(torch.arange(2), torch.arange(3), torch.arange(4), indexing="ij")
    x = (100 * h + 10 * t + dh).float()[None].repeat(2, 1, 1, 1)  # (2, 2, 3, 4)
    x[1] += 1000
    _expect_merge(fn, x.contiguous(), "merge_heads(x) for x of shape (2, 2, 3, 4)")
    y = torch.randn(2, 3, 12)
    heads = _split(y, 3)  # non-contiguous, as split_heads returns it
    out = _run(fn, heads, what="merge_heads(split_heads(y, 3))", on_error=_CONTIGUOUS_HINT)
    compare(
        out,
        y,
        what="merge_heads(split_heads(y, 3))",
        candidates=_merge_candidates(heads),
        hint="merge_heads(split_heads(y, H)) must give y back exactly.",
    )


def hidden_check_merge_heads(fn: Callable[..., Any], seed: int = 0) -> None:
    """Hidden check: random sizes, non-contiguous inputs straight from a split."""
    g = generator(seed)
    for _ in range(3):
        B, H, T, Dh = randint(1, 3, g), randint(1, 5, g), randint(1, 6, g), randint(1, 5, g)
        y = torch.randn(B, T, H * Dh, generator=g)
        _expect_merge(fn, _split(y, H), f"merge_heads(x) for x of shape {(B, H, T, Dh)}")
    x = torch.randn(2, 4, 3, 2, generator=g)
    _expect_merge(fn, x, "merge_heads(x) for a contiguous x of shape (2, 4, 3, 2)")


# --------------------------------------------------------------------------------------------------
# MultiHeadAttention
# --------------------------------------------------------------------------------------------------


def _params(module: nn.Module, what: str) -> dict[str, Tensor | None]:
    """The projection weights of a student's module, as float64, checked for their layout."""
    out: dict[str, Tensor | None] = {}
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        lin = getattr(module, name, None)
        if not isinstance(lin, nn.Linear):
            got = "nothing" if lin is None else type(lin).__name__
            raise AssertionError(
                f"{what} should have an attribute `{name}` that is an nn.Linear(d_model, "
                f"d_model), found {got}: create it in __init__ as self.{name} = nn.Linear(...)."
            )
        out[name] = lin.weight.detach().double()
        out[name + "_bias"] = None if lin.bias is None else lin.bias.detach().double()
    return out


def _mha(
    p: dict[str, Tensor | None],
    query: Tensor,
    key: Tensor,
    value: Tensor,
    n_heads: int,
    mask: Tensor | None = None,
    *,
    scale: str = "head",
    out_proj: bool = True,
    split: str = "right",
    merge: str = "right",
    mask_mode: str = "right",
) -> tuple[Tensor, Tensor] | None:
    """Multi-head attention in float64 from projection weights, with one variation switched on."""

    def lin(x: Tensor, name: str) -> Tensor:
        w, b = p[name], p[name + "_bias"]
        assert w is not None
        return x @ w.T if b is None else x @ w.T + b

    query, key, value = query.double(), key.double(), value.double()
    B, T, D = query.shape
    S = key.shape[1]
    dh = D // n_heads

    def heads(x: Tensor, n: int) -> Tensor:
        if split == "no_transpose":
            return x.reshape(B, n_heads, n, dh)  # (B, H, n, Dh), scrambled
        return x.reshape(B, n, n_heads, dh).transpose(1, 2)  # (B, H, n, Dh)

    q, k, v = (
        heads(lin(query, "q_proj"), T),
        heads(lin(key, "k_proj"), S),
        heads(lin(value, "v_proj"), S),
    )
    s = {"head": 1 / math.sqrt(dh), "model": 1 / math.sqrt(D), "none": 1.0}[scale]
    scores = q @ k.transpose(-2, -1) * s  # (B, H, T, S)
    if mask is not None and mask_mode != "ignored":
        m = torch.broadcast_to(mask if mask_mode == "right" else ~mask, scores.shape)
        w = torch.softmax(scores.masked_fill(~m, float("-inf")), -1)
        w = torch.nan_to_num(w, nan=0.0)
    else:
        w = torch.softmax(scores, -1)
    o = w @ v  # (B, H, T, Dh)
    merged = o.reshape(B, T, D) if merge == "no_transpose" else o.transpose(1, 2).reshape(B, T, D)
    return (lin(merged, "out_proj") if out_proj else merged), w


def _mha_candidates(
    p: dict[str, Tensor | None],
    query: Tensor,
    key: Tensor,
    value: Tensor,
    n_heads: int,
    mask: Tensor | None,
) -> list[tuple[tuple[Tensor, Tensor] | None, str]]:
    args = (p, query, key, value, n_heads, mask)
    out: list[tuple[tuple[Tensor, Tensor] | None, str]] = [
        (
            _mha(*args, out_proj=False),
            "It matches the concatenated heads without the output projection: apply "
            "self.out_proj to the merged heads; it mixes what the heads found.",
        ),
        (
            _mha(*args, scale="model"),
            "It matches scores divided by sqrt(d_model): each head works in its own subspace "
            "of width Dh = d_model / n_heads, so divide by sqrt(Dh).",
        ),
        (
            _mha(*args, scale="none"),
            "It matches attention without scaling: divide each head's scores by sqrt(Dh).",
        ),
        (
            _mha(*args, split="no_transpose"),
            "It matches heads split with reshape(B, H, T, Dh) and no transpose: reshape to "
            "(B, T, H, Dh), then transpose(1, 2).",
        ),
        (
            _mha(*args, merge="no_transpose"),
            "It matches heads merged with reshape(B, T, D) and no transpose: transpose(1, 2) "
            "back to (B, T, H, Dh) before reshaping.",
        ),
    ]
    if mask is not None:
        out += [
            (
                _mha(*args, mask_mode="ignored"),
                "It matches attention without the mask: pass the mask on to the attention "
                "of every head (it broadcasts to (B, H, T, S)).",
            ),
            (
                _mha(*args, mask_mode="inverted"),
                "It matches the mask inverted: True means 'may attend'.",
            ),
        ]
    return out


def _instantiate(cls: Callable[..., Any], *args: Any, what: str, **kw: Any) -> nn.Module:
    with torch.random.fork_rng():  # deterministic init without touching the notebook's RNG
        torch.manual_seed(0)
        module = _run(cls, *args, what=what, **kw)
    return expect_module(module, what)


def _randomise(module: nn.Module, g: torch.Generator) -> None:
    """Give every parameter (biases included) random values, so nothing hides behind zeros."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(max(p.shape[-1], 1)))


def _expect_mha(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    n_heads: int,
    mask: Tensor | None,
    what: str,
) -> tuple[Tensor, Tensor]:
    p = _params(module, what)
    ref = _mha(p, query, key, value, n_heads, mask)
    assert ref is not None
    out_exp, w_exp = ref
    kwargs = {} if mask is None else {"mask": mask}
    result = _run(module, query, key, value, what=what, **kwargs)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError(
            f"{what} should return a pair (out, weights), got {type(result).__name__}: "
            "`return self.out_proj(...), weights`."
        )
    out, w = result
    B, T, D = query.shape
    S = key.shape[1]
    w = expect_shape(w, (B, n_heads, T, S), f"the weights of {what}, (B, H, T_q, T_k)")
    out = expect_shape(out, (B, T, D), f"the output of {what}")
    cands = _mha_candidates(p, query, key, value, n_heads, mask)
    named = any(c is not None and close(w, c[1]) for c, _ in cands)
    if mask is not None and not named and not close(w, w_exp):
        misaligned = _mask_alignment(w, mask, n_heads, what)
        if misaligned:
            raise AssertionError(misaligned)
    compare(
        w,
        w_exp,
        what=f"the weights of {what}",
        candidates=[(None if c is None else c[1], h) for c, h in cands],
        hint="Per head: softmax over the keys of (q_h @ k_h^T) / sqrt(Dh), masked where the "
        "mask is False.",
    )
    compare(
        out,
        out_exp,
        what=f"the output of {what}",
        candidates=[(None if c is None else c[0], h) for c, h in cands],
        hint="The weights are right but the output is not: weights @ v per head, merge the "
        "heads, then out_proj.",
    )
    return out, w


def _mask_alignment(w: Tensor, mask: Tensor, n_heads: int, what: str) -> str | None:
    """Name the example or head whose mask the student's weights follow, if not their own."""
    B, H, T, S = w.shape
    blocked = ~torch.broadcast_to(mask, (B, H, T, S))
    zeros = w.detach().abs() < 1e-12  # masked weights are exactly 0
    for b in range(B):
        for h in range(H):
            if torch.equal(zeros[b, h], blocked[b, h]):
                continue
            for b2 in range(B):
                if b2 != b and torch.equal(zeros[b, h], blocked[b2, h]):
                    return (
                        f"the weights of {what} are zero where the mask of example {b2} blocks, "
                        f"but they belong to example {b} (head {h}): the mask does not line up "
                        "with the batch axis. Keep the batch axis first and let the mask "
                        "broadcast to (B, H, T, S); do not repeat or flatten it in another order."
                    )
            for h2 in range(H):
                if h2 != h and torch.equal(zeros[b, h], blocked[b, h2]):
                    return (
                        f"head {h} of {what} follows the mask of head {h2}: a (B, H, T, S) mask "
                        "gives every head its own mask; keep the head axis in place."
                    )
    return None


def copy_to_torch(module: nn.Module, n_heads: int) -> nn.MultiheadAttention:
    """A ``torch.nn.MultiheadAttention(batch_first=True)`` holding ``module``'s projections.

    Args:
        module: anything with ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` (``nn.Linear``).
        n_heads: number of heads.

    Returns:
        The torch module in eval mode, with the same weights and biases.
    """
    D = module.q_proj.weight.shape[1]
    bias = module.q_proj.bias is not None
    theirs = nn.MultiheadAttention(D, n_heads, bias=bias, batch_first=True).eval()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(
            torch.cat([module.q_proj.weight, module.k_proj.weight, module.v_proj.weight])
        )
        theirs.out_proj.weight.copy_(module.out_proj.weight)
        if bias:
            theirs.in_proj_bias.copy_(
                torch.cat([module.q_proj.bias, module.k_proj.bias, module.v_proj.bias])
            )
            theirs.out_proj.bias.copy_(module.out_proj.bias)
    return theirs


def _torch_reference(
    module: nn.Module,
    n_heads: int,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """Torch's own multi-head attention on the student's weights (True in attn_mask = blocked)."""
    theirs = copy_to_torch(module, n_heads)
    B, T, _ = query.shape
    S = key.shape[1]
    attn_mask = None
    if mask is not None:
        full = torch.broadcast_to(mask, (B, n_heads, T, S))
        attn_mask = ~full.reshape(B * n_heads, T, S)  # torch: True = not allowed
    with torch.no_grad():
        out, w = theirs(
            query, key, value, attn_mask=attn_mask, need_weights=True, average_attn_weights=False
        )
    return out, w


def check_multi_head_attention(cls: Callable[..., Any]) -> None:
    """Visible check of ``MultiHeadAttention``: layout, parameter count, shapes, values."""
    what = "MultiHeadAttention(8, 2)"
    module = _instantiate(cls, 8, 2, what=what)
    _params(module, what)
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        lin = getattr(module, name)
        if (lin.in_features, lin.out_features) != (8, 8) or lin.bias is None:
            raise AssertionError(
                f"{what}.{name} is nn.Linear({lin.in_features}, {lin.out_features}, "
                f"bias={lin.bias is not None}); expected nn.Linear(8, 8, bias=True): every "
                "projection maps the full width d_model to d_model, and the heads share it."
            )
    n = sum(p.numel() for p in module.parameters())
    if n != 4 * 8 * 9:
        raise AssertionError(
            f"{what} has {n} parameters, expected 4 * d_model * (d_model + 1) = {4 * 8 * 9}: "
            "just the four projections. Heads are slices of the projected vectors, they have no "
            "parameters of their own."
        )
    nobias = _instantiate(cls, 8, 2, bias=False, what="MultiHeadAttention(8, 2, bias=False)")
    _params(nobias, "MultiHeadAttention(8, 2, bias=False)")
    if any(getattr(nobias, n).bias is not None for n in ("q_proj", "k_proj", "v_proj", "out_proj")):
        raise AssertionError(
            "MultiHeadAttention(8, 2, bias=False) still has biases: pass bias=bias to every "
            "nn.Linear."
        )
    g = generator(5)
    _randomise(module, g)
    x = torch.randn(2, 3, 8, generator=g)
    _expect_mha(module, x, x, x, 2, None, f"{what}(x, x, x) for x of shape (2, 3, 8)")
    mem = torch.randn(2, 5, 8, generator=g)
    _expect_mha(module, x, mem, mem, 2, None, f"{what}(x, mem, mem) with 3 queries and 5 keys")
    causal = torch.ones(3, 3, dtype=torch.bool).tril()
    _expect_mha(module, x, x, x, 2, causal, f"{what}(x, x, x, mask=causal (3, 3))")


def check_multi_head_attention_divisible(cls: Callable[..., Any]) -> None:
    """Visible check: ``MultiHeadAttention(10, 4)`` raises a ValueError naming 10 and 4."""
    _expect_value_error(cls, (10, 4), ("10", "4"), "MultiHeadAttention(10, 4)")


def hidden_check_multi_head_attention(cls: Callable[..., Any], seed: int = 0) -> None:
    """Hidden check: random sizes, with and without bias, against ``nn.MultiheadAttention``."""
    g = generator(seed)
    for trial in range(3):
        H, dh = randint(1, 4, g), randint(1, 5, g)
        D = H * dh
        B, T, S = randint(1, 3, g), randint(1, 6, g), randint(1, 6, g)
        bias = trial != 1
        what = f"MultiHeadAttention({D}, {H}, bias={bias})"
        module = _instantiate(cls, D, H, bias=bias, what=what)
        _randomise(module, g)
        query = torch.randn(B, T, D, generator=g)
        kv = torch.randn(B, S, D, generator=g)
        call = f"{what} on query {(B, T, D)}, key/value {(B, S, D)}"
        out, w = _expect_mha(module, query, kv, kv, H, None, call)
        ref_out, ref_w = _torch_reference(module, H, query, kv, kv, None)
        compare(out, ref_out, what=f"the output of {call}", hint="It differs from torch's.")
        compare(w, ref_w, what=f"the weights of {call}", hint="They differ from torch's.")
    # Large head width with a small model: the scale must be the head width, not d_model.
    module = _instantiate(cls, 16, 4, what="MultiHeadAttention(16, 4)")
    _randomise(module, g)
    with torch.no_grad():
        module.q_proj.weight.mul_(4)
    x = torch.randn(2, 5, 16, generator=g)
    _expect_mha(module, x, x, x, 4, None, "MultiHeadAttention(16, 4) with large scores")


def hidden_check_multi_head_attention_mask(cls: Callable[..., Any], seed: int = 0) -> None:
    """Hidden check: masks of every broadcast shape, per-example and per-head, empty rows."""
    g = generator(seed)
    B, H, T, S, D = 3, 2, 4, 5, 6
    module = _instantiate(cls, D, H, what=f"MultiHeadAttention({D}, {H})")
    _randomise(module, g)
    query = torch.randn(B, T, D, generator=g)
    kv = torch.randn(B, S, D, generator=g)
    lengths = torch.tensor([5, 2, 3])
    per_head = torch.rand(B, H, T, S, generator=g) < 0.6
    per_head[:, :, :, 0] = True  # no empty rows: torch can serve as the oracle
    masks = {
        "a (T, S) mask": torch.ones(T, S, dtype=torch.bool).tril(),
        "a (B, 1, 1, S) key padding mask": (torch.arange(S) < lengths[:, None])[:, None, None, :],
        "a (B, 1, T, S) mask": torch.rand(B, 1, T, S, generator=g) < 0.7,
        "a (B, H, T, S) mask, different per head": per_head,
    }
    masks["a (B, 1, T, S) mask"][..., 1] = True
    for label, mask in masks.items():
        what = f"MultiHeadAttention({D}, {H})(query, kv, kv, mask=...) with {label}"
        out, w = _expect_mha(module, query, kv, kv, H, mask, what)
        ref_out, ref_w = _torch_reference(module, H, query, kv, kv, mask)
        compare(out, ref_out, what=f"the output of {what}", hint="It differs from torch's.")
        compare(w, ref_w, what=f"the weights of {what}", hint="They differ from torch's.")
    # Rows with no allowed key: zero weights, no NaN (torch itself gives NaN here).
    empty = per_head.clone()
    empty[1, 0, 2] = False
    empty[2, :, 0] = False
    what = f"MultiHeadAttention({D}, {H}) with fully masked query rows"
    _expect_mha(module, query, kv, kv, H, empty, what)


# --------------------------------------------------------------------------------------------------
# load_torch_weights
# --------------------------------------------------------------------------------------------------


class _Holder(nn.Module):
    """Just the four projections of a multi-head attention: what load_torch_weights fills."""

    def __init__(self, d_model: int, n_heads: int, bias: bool = True) -> None:
        super().__init__()
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.num_heads = n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        with torch.no_grad():
            for p in self.parameters():
                p.fill_(float("nan"))  # anything not copied shows up


def _torch_mha(D: int, H: int, bias: bool, g: torch.Generator) -> nn.MultiheadAttention:
    theirs = nn.MultiheadAttention(D, H, bias=bias, batch_first=True).eval()
    _randomise(theirs, g)  # torch starts its biases at zero; random ones reveal a missing copy
    return theirs


_NAMES = ("query", "key", "value")


def _expect_loaded(ours: nn.Module, theirs: nn.MultiheadAttention, what: str) -> None:
    D = theirs.embed_dim
    chunks = theirs.in_proj_weight.detach().split(D)  # q, k, v, each (D, D)
    bias_chunks = (
        theirs.in_proj_bias.detach().split(D) if theirs.in_proj_bias is not None else (None,) * 3
    )
    for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
        got = getattr(ours, name).weight.detach()
        if torch.isnan(got).any():
            raise AssertionError(
                f"after {what}, {name}.weight was not filled: copy "
                f"in_proj_weight[{i}*D:{i + 1}*D] into it (with torch.no_grad(), .copy_)."
            )
        if close(got, chunks[i]):
            continue
        for j, other in enumerate(chunks):
            if j != i and close(got, other):
                raise AssertionError(
                    f"after {what}, {name}.weight holds rows {j}*D:{j + 1}*D of in_proj_weight, "
                    f"the {_NAMES[j]} projection: torch stacks them in the order query, key, "
                    f"value, so {name} takes rows {i}*D:{i + 1}*D."
                )
            if close(got, other.T):
                raise AssertionError(
                    f"after {what}, {name}.weight holds the transpose of a chunk of "
                    "in_proj_weight: torch's chunks are already in nn.Linear's (out, in) layout, "
                    "copy them without .T."
                )
        expect_close(got, chunks[i], f"{name}.weight after {what}", atol=1e-6, rtol=0)
    for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
        b = bias_chunks[i]
        if b is not None and not close(getattr(ours, name).bias.detach(), b):
            raise AssertionError(
                f"after {what}, {name}.bias is not in_proj_bias[{i}*D:{i + 1}*D]: copy the "
                "biases too, in the same q, k, v order."
            )
    got_w = ours.out_proj.weight.detach()
    if not close(got_w, theirs.out_proj.weight.detach()):
        hint = (
            "copy it without .T (both are (out, in))"
            if close(got_w, theirs.out_proj.weight.detach().T)
            else "copy theirs.out_proj.weight into it"
        )
        raise AssertionError(
            f"after {what}, out_proj.weight is not torch's out_proj.weight: {hint}."
        )
    if theirs.out_proj.bias is not None and not close(
        ours.out_proj.bias.detach(), theirs.out_proj.bias.detach()
    ):
        raise AssertionError(
            f"after {what}, out_proj.bias is not torch's out_proj.bias: copy it too."
        )
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        if not isinstance(getattr(ours, name).weight, nn.Parameter):
            raise AssertionError(
                f"after {what}, {name}.weight is no longer an nn.Parameter, so it would not be "
                "trained: copy the values into the existing parameter, "
                "ours.q_proj.weight.copy_(...) under torch.no_grad()."
            )


def check_load_torch_weights(fn: Callable[..., Any]) -> None:
    """Visible check of ``load_torch_weights(ours, theirs)`` on a bare module of projections."""
    g = generator(7)
    theirs = _torch_mha(6, 2, True, g)
    ours = _Holder(6, 2)
    what = "load_torch_weights(ours, theirs) with d_model=6, n_heads=2"
    _run(fn, ours, theirs, what=what)
    _expect_loaded(ours, theirs, what)


def hidden_check_load_torch_weights(
    fn: Callable[..., Any], cls: Callable[..., Any], seed: int = 0
) -> None:
    """Hidden check: random sizes, no bias, and the student's own module against torch's output.

    Args:
        fn: the student's ``load_torch_weights``.
        cls: the student's ``MultiHeadAttention``.
        seed: seed of the random sizes and weights.
    """
    g = generator(seed)
    for bias in (True, False):
        H, dh = randint(1, 4, g), randint(2, 4, g)
        D = H * dh
        theirs = _torch_mha(D, H, bias, g)
        ours = _Holder(D, H, bias=bias)
        what = f"load_torch_weights(ours, theirs) with d_model={D}, n_heads={H}, bias={bias}"
        _run(fn, ours, theirs, what=what)
        _expect_loaded(ours, theirs, what)
    # End to end: the student's module, loaded, computes what torch computes.
    theirs = _torch_mha(8, 2, True, g)
    module = _instantiate(cls, 8, 2, what="MultiHeadAttention(8, 2)")
    _run(fn, module, theirs, what="load_torch_weights(MultiHeadAttention(8, 2), theirs)")
    x = torch.randn(2, 4, 8, generator=g)
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    with torch.no_grad():
        ref_out, _ = theirs(x, x, x, attn_mask=~mask, need_weights=False)
    what = "your MultiHeadAttention(8, 2) loaded from torch's, with a causal mask"
    out, _ = _expect_mha(module, x, x, x, 2, mask, what)
    compare(
        out,
        ref_out,
        what=f"the output of {what}",
        hint="With the same weights, your module and torch's must agree: check the chunk order "
        "in load_torch_weights.",
    )

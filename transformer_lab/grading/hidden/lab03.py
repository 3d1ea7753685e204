"""Hidden checks of lab 03 (multi-head attention), their float64 oracles and the visible checks'
fixtures: seeded sizes, weights, inputs (keys different from values) and masks that block the
keys with the largest scores, in training and eval mode and in low precision.

Reference: Vaswani et al., "Attention Is All You Need", NeurIPS 2017, section 3.2.2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from transformer_lab.checks import lab03
from transformer_lab.checks._common import close, generator, randint
from transformer_lab.checks._generated import Oracle
from transformer_lab.grading.hidden import fixture_entry
from transformer_lab.grading.hidden._attention import (
    attend64,
    distinct_mistakes,
    heads_merged_as,
    heads_split_as,
    mask_as_used,
    pair_entries,
)

__all__ = [
    "fixtures",
    "hidden_check_load_torch_weights",
    "hidden_check_merge_heads",
    "hidden_check_multi_head_attention",
    "hidden_check_multi_head_attention_dtypes",
    "hidden_check_multi_head_attention_mask",
    "hidden_check_split_heads",
]

Params = dict[str, Tensor | None]
Args, Pair = lab03.Args, lab03.Pair


def params_of(module: nn.Module) -> Params:
    """The projections of a module as float64 (``None`` for a missing bias)."""
    held = lab03.projection_tensors(module).items()
    return {k: None if t is None else t.detach().to("cpu", torch.float64) for k, t in held}


def oracle_linear(x: Tensor, p: Params, name: str) -> Tensor:
    """``x @ weight.T + bias`` of the projection ``name`` of ``p`` (lab 08 projects with it too)."""
    w, b = p[f"{name}.weight"], p[f"{name}.bias"]
    assert w is not None
    return x @ w.T if b is None else x @ w.T + b


def _mask_as(mask: Tensor | None, shape: Sequence[int], use: str) -> Tensor | None:
    """:func:`._attention.mask_as_used`, and two misuses of the head axis: a mask cut to its first
    head (``"first_head"``), one per example repeated as ``h*B + b`` (``"repeated"``)."""
    if use not in ("first_head", "repeated"):
        return mask_as_used(mask, shape, use)
    assert mask is not None
    if use == "first_head":
        return mask_as_used(mask[:, :1] if mask.dim() == 4 else mask, shape)
    B, H = shape[:2]
    example = (torch.arange(B)[:, None] * H + torch.arange(H)) % B  # (B, H): whose mask
    return mask_as_used(mask, shape)[example, 0]  # (B, H, T, S)


def oracle_multi_head_attention(
    p: Params,
    args: Args,
    n_heads: int,
    *,
    scale: str = "head",
    out_proj: bool = True,
    split: str = "right",
    merge: str = "right",
    use: str = "right",
    fill: str = "zero",
) -> Pair | None:
    """``(out (B, T, D), weights (B, H, T, S))`` in float64 of the projections ``p``
    (:func:`params_of`) for ``args = (query (B, T, D), key, value (B, S, D), mask)``. Every
    option but the default is a mistake (None where it cannot run here): ``scale`` ``"model"``
    or ``"none"``; no ``out_proj``; heads ``split`` or ``merge``d ``"no_transpose"``; the mask
    ``use``d as :func:`_mask_as` says; the ``fill`` of :func:`._attention.masked_weights`.
    """
    mask = args[3]
    query, key, value = (t.to("cpu", torch.float64) for t in args[:3])  # autograd's graph kept
    B, T, D = query.shape
    S = key.shape[1]
    q, k, v = (
        heads_split_as(oracle_linear(x, p, name), n_heads, split)  # (B, H, N, Dh)
        for x, name in ((query, "q_proj"), (key, "k_proj"), (value, "v_proj"))
    )
    allowed = _mask_as(mask, (B, n_heads, T, S), use)
    if allowed is None:
        return None
    factor = {"head": 1 / math.sqrt(D // n_heads), "model": 1 / math.sqrt(D), "none": 1.0}[scale]
    # (B, H, T, Dh), (B, H, T, S)
    heads, weights = attend64(q, k, v, allowed, scale=factor, fill=fill)
    merged = heads_merged_as(heads, merge)  # (B, T, D)
    out = oracle_linear(merged, p, "out_proj") if out_proj else merged
    return out, weights


def scores_of(p: Params, query: Tensor, key: Tensor, n_heads: int) -> Tensor:
    """The oracle's weights ``(B, H, T, S)`` without a mask: they rank each row's keys as the
    raw scores do (to build masks that block the top key)."""
    return oracle_multi_head_attention(p, (query, key, key, None), n_heads)[1]


def blocking_mask(
    scores: Tensor, shape: Sequence[int], g: torch.Generator, extra: float = 0.2
) -> Tensor:
    """A bool mask of ``shape`` (broadcasting to the scores) that blocks each row's top key
    (and at random, probability ``extra``, more); one shared along some axes blocks the keys on
    top in most rows it covers, at most half of them. A mask applied late or not at all shows."""
    full = tuple(scores.shape)
    top = torch.zeros(full)
    top.scatter_(-1, scores.argmax(-1, keepdim=True), 1.0)
    pad = (1,) * (len(full) - len(shape)) + tuple(shape)
    dims = tuple(i for i, n in enumerate(pad) if n == 1 and full[i] != 1)
    if not dims:
        blocked = top.bool() | (torch.rand(full, generator=g) < extra)
        return (~blocked).reshape(tuple(shape))
    votes = top.sum(dim=dims, keepdim=True)  # how many covered rows have each key on top
    limit = max(1, full[-1] // 2)
    rank = votes.argsort(dim=-1, descending=True, stable=True).argsort(dim=-1)
    blocked = (votes > 0) & (rank < limit)
    return (~blocked).reshape(tuple(shape))


def split_mistakes(x: Tensor, n_heads: int) -> dict[str, Tensor]:
    """Hint -> what a typical wrong ``split_heads(x, n_heads)`` returns."""
    how = ("no_transpose", "interleaved")
    return distinct_mistakes(
        heads_split_as(x, n_heads),
        [(lab03.HINTS[f"split_{h}"], heads_split_as(x, n_heads, h)) for h in how],
    )


def merge_mistakes(x: Tensor, strided: bool = False) -> dict[str, Tensor]:
    """Hint -> what a typical wrong ``merge_heads(x)`` returns."""
    how = ("no_transpose", "interleaved", "wrong_axes")
    return distinct_mistakes(
        heads_merged_as(x), [(lab03.HINTS[f"merge_{h}"], heads_merged_as(x, h)) for h in how]
    )


#: The typical mistakes of ``MultiHeadAttention``: their hints' ids -> the oracle's options
#: (``kv``: where key and value come from among query, key, value; ``mask_*``: with a mask).
_VARIANTS: dict[str, dict[str, Any]] = {
    "no_out_proj": {"out_proj": False},
    "scale_d_model": {"scale": "model"},
    "no_scale": {"scale": "none"},
    "split_no_transpose": {"split": "no_transpose"},
    "merge_no_transpose": {"merge": "no_transpose"},
    "kv_swapped": {"kv": (2, 1)},
    "values_from_key": {"kv": (1, 1)},
    "keys_from_value": {"kv": (2, 2)},
    "mask_ignored": {"use": "ignored"},
    "mask_inverted": {"use": "inverted"},
    "mask_after_softmax": {"fill": "after"},
    "mask_neg_inf": {"fill": "nan"},
    "mask_uniform": {"fill": "uniform"},
    "mask_unsqueezed": {"use": "unsqueezed"},
    "mask_first_head": {"use": "first_head"},
    "mask_repeated": {"use": "repeated"},
}


def mha_mistakes(p: Params, args: Args, n_heads: int) -> dict[str, Pair]:
    """Hint -> ``(out, weights)`` of every typical mistake that differs from the right answer
    (in self-attention, keys and values from the wrong input do not)."""
    want = oracle_multi_head_attention(p, args, n_heads)
    assert want is not None
    out: dict[str, Pair] = {}
    for name, options in _VARIANTS.items():
        if args[3] is None and name.startswith("mask_"):
            continue
        kv = [args[i] for i in options.get("kv", (1, 2))]  # key and value, from these inputs
        rest = {k: v for k, v in options.items() if k != "kv"}
        got = oracle_multi_head_attention(p, (args[0], *kv, args[3]), n_heads, **rest)
        if got is not None and not all(
            close(g, w, 1e-9, 1e-9) for g, w in zip(got, want, strict=True)
        ):
            out[lab03.HINTS[name]] = got
    return out


def _drawn(
    cls: Callable[..., Any],
    g: torch.Generator,
    D: int,
    H: int,
    sizes: tuple[int, int, int],
    what: str,
    scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
    **kwargs: Any,
) -> tuple[nn.Module, Tensor, Tensor, Tensor]:
    """The student's ``MultiHeadAttention(D, H, **kwargs)``, random, in ``dtype``, and random
    ``query (B, T, D)``, ``key`` and ``value (B, S, D)`` for ``sizes = (B, T, S)``."""
    module = lab03.randomised(lab03.instantiate(cls, D, H, what=what, **kwargs), g, scale)
    B, T, S = sizes
    query, key, value = (torch.randn(B, n, D, generator=g).to(dtype) for n in (T, S, S))
    return module.to(dtype), query, key, value


def _expect_mha(
    module: nn.Module, args: Args, n_heads: int, what: str, train_too: bool = False
) -> None:
    """The student's module on ``args`` against the oracle (and in training mode, if asked)."""
    p = params_of(module)
    want = oracle_multi_head_attention(p, args, n_heads)
    assert want is not None
    got = lab03.call_mha(module.eval(), args, n_heads, what)
    lab03.judge_mha(got, want, mha_mistakes(p, args, n_heads), what, lab03.TOLERANCE[args[0].dtype])
    if train_too:
        lab03.expect_train_like_eval(module, args, n_heads, what)


SPLIT = Oracle(lab03.SPLIT, heads_split_as, split_mistakes)
MERGE = Oracle(lab03.MERGE, lambda x, strided=False: heads_merged_as(x), merge_mistakes)


def _split_cases(g: torch.Generator) -> list[tuple[Tensor, int]]:
    sizes = [
        (randint(2, 6, g), randint(2, 5, g), torch.float32),
        (3, 1, torch.float32),
        (1, 5, torch.float64),
        (randint(2, 4, g), 3, torch.bfloat16),
        (2, randint(2, 4, g), torch.int64),
    ]  # (n_heads, Dh, dtype) of each case; then B, T drawn, then x (B, T, n_heads * Dh)
    return [
        ((torch.randn(randint(1, 3, g), randint(1, 6, g), h * dh, generator=g) * 10).to(t), h)
        for h, dh, t in sizes
    ]


hidden_check_split_heads = SPLIT.hidden(
    "hidden_check_split_heads",
    _split_cases,
    """Random sizes (one head, one feature per head) and dtypes (float64, bfloat16, int64).""",
)


def _merge_cases(g: torch.Generator) -> list[tuple[Tensor, bool]]:
    cases = []
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        B, H, T, Dh = randint(1, 3, g), randint(2, 5, g), randint(2, 6, g), randint(2, 5, g)
        y = torch.randn(B, T, H * Dh, generator=g).to(dtype)
        cases += [(heads_split_as(y, H), True), (y.reshape(B, H, T, Dh), False)]
    return [*cases, (torch.randn(2, 1, 3, 4, generator=g), False)]


hidden_check_merge_heads = MERGE.hidden(
    "hidden_check_merge_heads",
    _merge_cases,
    """Random sizes and dtypes, heads as a split hands them over (not contiguous), one head.""",
)


def hidden_check_multi_head_attention(cls: Callable[..., Any], seed: int = 0) -> None:
    """Random sizes, bias or not, cross- and self-attention, training mode, large scores."""
    g = generator(seed)
    for trial in range(3):
        H, dh = randint(1, 4, g), randint(1, 5, g)
        if trial == 0:
            H, dh = max(H, 2), max(dh, 2)
        D, bias = H * dh, trial != 1
        B, T = randint(1, 3, g), randint(2, 5, g)
        S = T + randint(1, 3, g)
        what = f"MultiHeadAttention({D}, {H}, bias={bias})"
        module, *inputs = _drawn(cls, g, D, H, (B, T, S), what, bias=bias)
        lab03.expect_layout(module, D, bias, what)
        call = f"{what} on query {(B, T, D)}, key and value {(B, S, D)} (different tensors)"
        _expect_mha(module, (*inputs, None), H, call, train_too=trial == 0)
    # Self-attention, and scores large enough that the scale matters.
    module, x, _, _ = _drawn(cls, g, 16, 4, (2, 5, 5), "MultiHeadAttention(16, 4)", scale=3.0)
    _expect_mha(module, (x, x, x, None), 4, "MultiHeadAttention(16, 4)(x, x, x) with large scores")
    lab03.expect_gradients(module.train(), (x, x, x, None), 4, "MultiHeadAttention(16, 4)(x, x, x)")


def hidden_check_multi_head_attention_mask(cls: Callable[..., Any], seed: int = 0) -> None:
    """Masks of every broadcast shape that block each row's top key; empty rows; per head."""
    g = generator(seed)
    B, H, T, S, D = 3, 2, 3, 7, 6
    module, query, key, value = _drawn(cls, g, D, H, (B, T, S), f"MultiHeadAttention({D}, {H})")
    scores = scores_of(params_of(module), query, key, H)
    for shape in ((S,), (T, S), (B, 1, 1, S), (B, 1, T, S), (1, H, T, S), (B, H, T, S)):
        mask = blocking_mask(scores, shape, g)
        what = f"MultiHeadAttention({D}, {H})(query, key, value, mask) with a {shape} mask"
        _expect_mha(module, (query, key, value, mask), H, what, train_too=len(shape) == 4)
    # Empty rows: in every head of one query, and in one head only.
    mask = blocking_mask(scores, (B, H, T, S), g)
    mask[1, :, 2] = False
    mask[2, 0, 0] = False
    what = f"MultiHeadAttention({D}, {H}) with queries that may attend to nothing"
    _expect_mha(module, (query, key, value, mask), H, what)
    # T == H: a (T, S) mask given an extra axis broadcasts silently, one query row per head.
    module, query, key, value = _drawn(cls, g, 9, 3, (2, 3, 5), "MultiHeadAttention(9, 3)")
    mask = blocking_mask(scores_of(params_of(module), query, key, 3), (3, 5), g)
    _expect_mha(module, (query, key, value, mask), 3, "MultiHeadAttention(9, 3) with a (T, S) mask")


def hidden_check_multi_head_attention_dtypes(cls: Callable[..., Any], seed: int = 0) -> None:
    """float16 and bfloat16 modules and inputs, masks with empty rows (the fill must fit)."""
    g = generator(seed)
    B, H, T, S, D = 2, 2, 3, 6, 8
    for dtype in (torch.float16, torch.bfloat16):
        what = f"MultiHeadAttention({D}, {H}) in {str(dtype).replace('torch.', '')}"
        module, query, key, value = _drawn(cls, g, D, H, (B, T, S), what, dtype=dtype)
        scores = scores_of(params_of(module), query, key, H)
        _expect_mha(module, (query, key, value, None), H, what)
        mask = blocking_mask(scores, (B, 1, T, S), g)
        mask[0, 0, 1] = False  # a query with nothing to attend to
        _expect_mha(module, (query, key, value, mask), H, f"{what} with a (B, 1, T, S) mask")


def hidden_check_load_torch_weights(
    fn: Callable[..., Any], cls: Callable[..., Any], seed: int = 0
) -> None:
    """Random sizes, no bias, the student's own module (``cls``) loaded from torch's and run."""
    g = generator(seed)
    for bias in (True, False):
        H, dh = randint(1, 4, g), randint(2, 4, g)
        D = H * dh
        what = f"load_torch_weights(ours, theirs) with d_model={D}, n_heads={H}, bias={bias}"
        theirs = nn.MultiheadAttention(D, H, bias=bias, batch_first=True).eval()
        lab03.judge_load(fn, lab03.Projections(D, H, bias=bias), lab03.randomised(theirs, g), what)
    # End to end: the student's module, loaded, computes what torch's module computes.
    theirs = lab03.randomised(nn.MultiheadAttention(12, 3, batch_first=True).eval(), g)
    module, *inputs = _drawn(cls, g, 12, 3, (2, 4, 6), "MultiHeadAttention(12, 3)")
    lab03.judge_load(fn, module, theirs, "load_torch_weights(MultiHeadAttention(12, 3), theirs)")
    mask = torch.rand(4, 6, generator=g) < 0.7
    call = "your MultiHeadAttention(12, 3) loaded from torch's, with a (T, S) mask"
    _expect_mha(module, (*inputs, mask), 3, call)


def _grid(shape: Sequence[int], g: torch.Generator, steps: int) -> Tensor:
    """Random multiples of ``1/steps`` in ``[-1, 1]``: exact in float16 and bfloat16."""
    return torch.randint(-steps, steps + 1, tuple(shape), generator=g).double() / steps


def _example(
    seed: int, d_model: int = 8, sizes: Sequence[int] = (2, 3, 6), bias: bool = True
) -> tuple[Params, Tensor, Tensor, Tensor]:
    """A stored example's projections ``(D, D)`` (biases when ``bias``) and inputs: ``sizes``
    is (examples, queries, keys)."""
    g = generator(seed)
    p: Params = {}
    for name in lab03.PROJECTIONS:  # weights (D, D) and biases (D,)
        for attr, shape in (("weight", (d_model, d_model)), ("bias", (d_model,))):
            p[f"{name}.{attr}"] = _grid(shape, g, 32) if bias or attr == "weight" else None
    B, T, S = sizes
    query, key, value = (_grid((B, n, d_model), g, 16) for n in (T, S, S))
    return p, query, key, value


def _mha_entries(
    key: str,
    example: tuple[Params, Tensor, Tensor, Tensor],
    n_heads: int,
    masks: Mapping[str, Tensor | None],
) -> dict[str, dict[str, Any]]:
    """The entries of the stored example ``"<key>"``: its inputs and projections, and for each
    mask (``""``: none; else ``" with <label>"``) the expected pair and the mistakes' pairs."""
    p, *inputs = example
    tensors = {**dict(zip(("query", "key", "value"), inputs, strict=True)), **p}
    out = {f"{key}: {name}": fixture_entry(t) for name, t in tensors.items() if t is not None}
    for label, mask in masks.items():
        args = (*inputs, mask)
        want = oracle_multi_head_attention(p, args, n_heads)
        assert want is not None
        out |= pair_entries(key + label, want, mha_mistakes(p, args, n_heads))
        if mask is not None:
            out[f"{key}{label}: mask"] = fixture_entry(mask.double())
    return out


def fixtures() -> dict[str, dict[str, Any]]:
    """The stored examples of :mod:`transformer_lab.checks.lab03`, keyed by the call."""
    out: dict[str, dict[str, Any]] = {}
    out |= SPLIT.fixtures("check_split_heads", [(lab03.numbered(2, 3, 8), n) for n in (2, 4, 1)])
    x = lab03.numbered(2, 2, 3, 4)  # (B, H, T, Dh), entry 1000*b + 100*h + 10*t + j
    heads = heads_split_as(lab03.numbered(2, 3, 8), 2)  # merged back into the numbered input
    out |= MERGE.fixtures("check_merge_heads", [(x, False), (x, True), (heads, False)])
    # The attention example: its key mask (it blocks every row's top key) leaves every example
    # at least three of its six keys.
    p, query, keys, value = _example(3030)
    scores = scores_of(p, query, keys, 2)
    g = generator(3030)
    key_mask = blocking_mask(scores, (2, 1, 1, 6), g, extra=0.0)
    assert int(key_mask.sum(-1).min()) >= 3
    head_mask = blocking_mask(scores, (2, 2, 3, 6), g, extra=0.25)
    head_mask[1, 0, 1] = False  # one query of one head may attend to nothing
    masks = {
        "": None,
        " with a (B, 1, 1, S) key mask": key_mask,
        " with a (B, H, T, S) mask with an empty row": head_mask,
    }
    out |= _mha_entries("MultiHeadAttention(8, 2) example", (p, query, keys, value), 2, masks)
    # No bias, 4 heads; and a (T, S) mask with as many queries as heads (T == H == 4).
    example = _example(303, 12, (2, 4, 6), bias=False)
    out |= _mha_entries("MultiHeadAttention(12, 4, bias=False) example", example, 4, {"": None})
    mask = torch.tensor(
        [[1, 0, 1, 1, 0], [0, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 1, 0]], dtype=torch.bool
    )
    example = _example(304, 8, (3, 4, 5))
    masks = {" with a (T, S) mask": mask}
    out |= _mha_entries("MultiHeadAttention(8, 4) example", example, 4, masks)
    return out

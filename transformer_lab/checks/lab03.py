"""Visible checks of lab 03 (multi-head attention): split_heads, merge_heads, MultiHeadAttention,
load_torch_weights.

The notebook's visible test cells call the ``check_*`` functions here. They know what to expect
in two ways, and neither is an implementation of the lab:

* **stored worked examples** (``fixtures/lab03.json``, written from the hidden checks' oracle
  when the instructor builds the labs): numbered inputs for ``split_heads`` and ``merge_heads``
  (entry ``100*b + 10*t + d``, so a misplaced entry says where it came from), fixed projection
  weights and inputs for ``MultiHeadAttention`` (queries and keys of different lengths, keys
  different from values, masks whose blocked keys have the largest raw scores, a query row
  with nothing allowed), together with what the typical mistakes return on them (a reshape
  without the transpose, no output projection, scores divided by ``sqrt(d_model)``, keys and
  values swapped, the mask ignored, inverted or applied after the softmax, ``-inf`` fills that
  turn empty rows into NaN ...). A wrong answer is compared with those and the message names
  the mistake it reproduces. ``split_heads`` and ``merge_heads`` are ordinary parts: their
  checks are generated (:mod:`transformer_lab.checks._generated`) from :data:`SPLIT` and
  :data:`MERGE`, which say how each is called and judged.
* **PyTorch itself**: :func:`reference_multi_head_attention` feeds the student's own
  projection weights to ``torch.nn.functional.multi_head_attention_forward``
  (``use_separate_proj_weight=True``), and ``load_torch_weights`` is judged by what
  ``torch.nn.MultiheadAttention`` computes. Helpers that compute an expected answer are named
  ``reference_*`` and refused while a student's function runs.

Beyond values, the checks look at what makes a module usable: exactly the four projections
(``nn.Linear``), the same result in training and in eval mode (this class has no dropout),
gradients reaching every projection, the input's dtype kept (float16 too, where a fill value of
``-1e9`` overflows), and for ``load_torch_weights`` that the values are COPIED into the very
Parameter objects the module had (an optimizer built before loading must still train them).

While a student's code runs (:data:`BAN`), PyTorch's attention (the ``attention`` operator family:
``F.scaled_dot_product_attention``, ``F.multi_head_attention_forward`` ...),
``torch.nn.MultiheadAttention`` and the kit's own answers of this lab are refused. Lab 02's
``scaled_dot_product_attention`` and ``softmax`` (the student's own, or the kit's in
``transformer_lab.attention``) and ``torch.softmax`` may be reused: this lab is about heads.

Torch's layout, which the checks rely on: ``in_proj_weight`` is ``(3D, D)`` with the query, key
and value projections stacked in that order, each in ``nn.Linear``'s ``(out, in)`` layout;
``in_proj_bias`` is ``(3D,)`` (None without bias); ``out_proj`` is an ``nn.Linear(D, D)``; a
boolean ``attn_mask`` means True = *blocked*, the opposite of the course's masks.

Reference: Prince, *Understanding Deep Learning*, section 12.3.3 (multiple heads); Vaswani et
al., "Attention Is All You Need", NeurIPS 2017, section 3.2.2.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab.checks import spec
from transformer_lab.checks._attention import HALF_FILL
from transformer_lab.checks._common import (
    Case,
    ForbiddenCallError,
    call_forbidding,
    close,
    compare,
    expect_close,
    expect_module,
    expect_shape,
    expect_true,
    forbidden,
    generator,
    stored,
)
from transformer_lab.checks._generated import Given, Ordinary

__all__ = [
    "BAN",
    "MERGE",
    "SPLIT",
    "check_load_torch_weights",
    "check_merge_heads",
    "check_multi_head_attention",
    "check_multi_head_attention_divisible",
    "check_multi_head_attention_mask",
    "check_split_heads",
    "check_split_heads_divisible",
    "reference_multi_head_attention",
]

#: The lab's spec (``specs/lab03.toml``): its bans and shared tolerances.
SPEC = spec.load("03_multi_head_attention")
BAN = SPEC.ban("heads")

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")

#: What each typical mistake gets told. The hidden checks' mistake catalogue uses the same
#: words (``grading/hidden/lab03.py``), and so do the stored examples.
HINTS: dict[str, str] = {
    "split_no_transpose": "It matches heads made with reshape(B, H, T, Dh) straight away: that "
    "cuts the memory in the wrong order and mixes tokens between heads. Reshape to "
    "(B, T, H, Dh) first, then transpose(1, 2).",
    "split_interleaved": "It matches heads that take every H-th feature (interleaved): head h "
    "must hold the contiguous slice of features h*Dh ... (h+1)*Dh - 1. Reshape to "
    "(B, T, H, Dh), not (B, T, Dh, H).",
    "merge_no_transpose": "It matches heads merged with reshape(B, T, D) and no transpose: "
    "that mixes positions. Bring the heads next to the features first: transpose(1, 2) gives "
    "(B, T, H, Dh), then reshape to (B, T, H * Dh).",
    "merge_interleaved": "It matches interleaved heads (features ordered Dh-major): the "
    "features of head 0 come first, then head 1, ...: transpose(1, 2) to (B, T, H, Dh), then "
    "reshape.",
    "merge_wrong_axes": "It matches a transpose of the last two axes: the head axis (1) must "
    "move next to the feature axis, transpose(1, 2), not transpose(2, 3).",
    "no_out_proj": "It matches the concatenated heads without the output projection: apply "
    "self.out_proj to the merged heads; it mixes what the heads found.",
    "scale_d_model": "It matches scores divided by sqrt(d_model): each head works in its own "
    "subspace of width Dh = d_model / n_heads, so divide by sqrt(Dh).",
    "no_scale": "It matches attention without scaling: divide each head's scores by sqrt(Dh).",
    "kv_swapped": "It matches keys and values swapped: the scores compare queries with "
    "k_proj(key) and the weights average v_proj(value); in cross-attention key and value are "
    "different tensors.",
    "values_from_key": "It matches values computed from `key`: the weights average "
    "v_proj(value); in cross-attention key and value are different tensors.",
    "keys_from_value": "It matches keys computed from `value`: the scores compare queries with "
    "k_proj(key); in cross-attention key and value are different tensors.",
    "mask_ignored": "It matches attention without the mask: pass the mask on to the attention "
    "of every head (it broadcasts to (B, H, T, S)). The keys it blocks here have the largest "
    "scores, so ignoring it changes everything.",
    "mask_inverted": "It matches the mask inverted: in this course True means 'may attend' "
    "(torch.nn.MultiheadAttention's attn_mask uses the opposite).",
    "mask_after_softmax": "It matches a mask applied after the softmax: zeroing the weights of "
    "blocked keys leaves rows that no longer sum to 1. Fill the blocked scores before the "
    "softmax.",
    "mask_neg_inf": "It has NaN exactly where a query may attend to nothing: a fill of -inf "
    "makes such a row exp(-inf)/0. Fill with torch.finfo(scores.dtype).min and zero the "
    "weights of blocked keys after the softmax (lab 02's rule).",
    "mask_uniform": "A query that may attend to nothing gets uniform weights over the blocked "
    "keys: its weights must all be 0 (and its head's output 0). Zero the weights of blocked "
    "keys after the softmax (lab 02's rule).",
    "mask_unsqueezed": "It matches a mask given an extra axis (mask.unsqueeze(1)): the mask "
    "already broadcasts to (B, H, T, S) as it is (a (T, S) mask lines up with the last two "
    "axes); do not add or repeat axes.",
}

_CONTIGUOUS_HINT = (
    "After a transpose the tensor is no longer contiguous in memory, so .view cannot flatten "
    "it: use .reshape(...) (or .contiguous().view(...))."
)
_SHAPES_HINT = (
    "query is (B, T_q, D) and key, value are (B, T_k, D) with T_q != T_k here: queries come "
    "from q_proj(query), keys from k_proj(key), values from v_proj(value)."
)
_MASK_CRASH_HINT = (
    "The mask broadcasts to (B, H, T, S) as it is: a (T, S) mask, a (B, 1, 1, S) key mask "
    "and a (B, H, T, S) mask need no unsqueeze, repeat or reshape."
)
_RULE = (
    "Check it first and raise a ValueError that names both values, e.g. "
    'raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}").'
)

# A correct float32 answer is ~1e-6 from the float64 values; low precision needs more room, and
# every catalogued mistake is far beyond it (checked by tests/test_lab03_checks.py).
TOLERANCE: dict[torch.dtype, float] = {
    torch.float32: 1e-4,
    torch.float64: 1e-4,
    torch.float16: 2e-2,
    torch.bfloat16: 6e-2,
}


# --------------------------------------------------------------------------------------
# Calling the student's code
# --------------------------------------------------------------------------------------


def run(fn: Callable[..., Any], *args: Any, what: str, on_error: str = "", **kwargs: Any) -> Any:
    """Call the student's ``fn`` under :data:`BAN`; add ``on_error`` to a crash's message."""
    return call_forbidding(fn, args, kwargs, ban=BAN, what=what, on_error=on_error)


def expect_value_error(
    fn: Callable[..., Any], args: tuple[Any, ...], names: Sequence[str], what: str
) -> None:
    """``fn(*args)`` must raise ``ValueError`` whose message contains every string in ``names``."""
    try:
        with forbidden(BAN):
            result = fn(*args)
    except ValueError as exc:
        missing = [n for n in names if n not in str(exc)]
        if missing:
            raise AssertionError(
                f"{what} raised ValueError({str(exc)!r}), which does not name the offending "
                f"values {', '.join(missing)}: a student reading it cannot tell what to change. "
                + _RULE
            ) from None
        return
    except NotImplementedError:
        raise AssertionError(
            f"{what} is not implemented yet: replace `raise NotImplementedError()` with your code."
        ) from None
    except ForbiddenCallError:
        raise
    except AssertionError as exc:
        raise AssertionError(
            f"{what} failed an assert ({exc or 'no message'}) instead of raising ValueError: "
            "asserts vanish under python -O and their message is an AssertionError, not the "
            "error a caller expects. " + _RULE
        ) from None
    except Exception as exc:
        raise AssertionError(
            f"{what} raised {type(exc).__name__}: {exc}. That message is torch's, about shapes, "
            "not about the real problem (the width does not split evenly into heads). " + _RULE
        ) from None
    got = f"a tensor of shape {tuple(result.shape)}" if isinstance(result, Tensor) else "a result"
    raise AssertionError(f"{what} returned {got} instead of raising ValueError. " + _RULE)


def numbered(*shape: int) -> Tensor:
    """A float tensor whose entry at index ``(i, j, k, ...)`` reads ``...ijk`` in decimal.

    With every size at most 10, ``numbered(2, 3, 8)[b, t, d] == 100*b + 10*t + d``: a
    misplaced entry says where it came from.
    """
    out = torch.zeros(shape)
    for axis, size in enumerate(shape):
        place = 10 ** (len(shape) - 1 - axis)
        view = [1] * len(shape)
        view[axis] = size
        out = out + place * torch.arange(size, dtype=torch.float32).reshape(view)
    return out


def as_candidates(mistakes: Mapping[str, Tensor]) -> list[tuple[Tensor | None, str]]:
    """``compare``'s ``(output, hint)`` pairs from a ``{hint: output}`` table."""
    return [(wrong, hint) for hint, wrong in mistakes.items()]


# --------------------------------------------------------------------------------------
# split_heads / merge_heads
# --------------------------------------------------------------------------------------


def _dtype(x: Tensor) -> str:
    return "" if x.dtype == torch.float32 else f", {str(x.dtype).removeprefix('torch.')}"


def _as_float64(value: Any) -> Tensor:
    """An output (stored as nested lists, or the oracle's tensor) as float64, to compare."""
    return torch.as_tensor(value, dtype=torch.float64)


def same_entries(got: Tensor, want: Tensor) -> bool:
    """The same shape and values (to 1e-4: heads only move entries, they never compute)."""
    return got.shape == want.shape and close(got.double(), want, atol=1e-4, rtol=1e-4)


def describe_entries(case: Case[Given]) -> str:
    """A wrong rearrangement: how many entries are off, and the first one, where it sits."""
    got, want = case.got.detach().double(), case.want
    wrong = ~torch.isclose(got, want, atol=1e-4, rtol=1e-4)  # (same shape as want)
    idx = tuple(int(i) for i in wrong.nonzero()[0])
    return (
        f"{case.what} is wrong at {int(wrong.sum())} of {want.numel()} entries: at index {idx} "
        f"you have {float(got[idx]):g}, expected {float(want[idx]):g}."
    )


def _kept_dtype(got: Tensor, x: Tensor, what: str, verb: str) -> Tensor:
    expect_true(
        got.dtype == x.dtype,
        f"{what} has dtype {got.dtype} for an input of dtype {x.dtype}: {verb} only "
        "rearranges the entries, keep the input's dtype.",
    )
    return got


def _split_what(x: Tensor, n_heads: int) -> str:
    return f"split_heads(x, {n_heads}) for x of shape {tuple(x.shape)}{_dtype(x)}"


def split_call(fn: Callable[..., Any], x: Tensor, n_heads: int) -> Tensor:
    """The student's ``split_heads(x, n_heads)`` under the ban: heads ``(B, H, T, Dh)`` of the
    input's dtype (the head axis left after the tokens is told apart)."""
    what = _split_what(x, n_heads)
    got = run(fn, x, n_heads, what=what)
    B, T, D = x.shape
    dh = D // n_heads
    shape = tuple(getattr(got, "shape", ()))
    if shape == (B, T, n_heads, dh) and (T, n_heads) != (n_heads, T):
        raise AssertionError(
            f"{what} has shape {shape}, i.e. (B, T, H, Dh): you cut the features into heads but "
            "left the head axis after the tokens. transpose(1, 2) moves it next to the batch, "
            "(B, H, T, Dh), so that one batched attention handles every head."
        )
    got = expect_shape(got, (B, n_heads, T, dh), f"{what}, (B, T, D) -> (B, H, T, D/H)")
    return _kept_dtype(got, x, what, "splitting")


#: ``split_heads`` of a case ``(x (B, T, D), n_heads)``.
SPLIT = Ordinary(
    "lab03",
    call=split_call,
    what=_split_what,
    describe=describe_entries,
    rule="Head h of token t must hold features x[b, t, h*Dh:(h+1)*Dh].",
    same=same_entries,
    load=lambda x, n_heads: (torch.tensor(x, dtype=torch.float32), n_heads),
    output=_as_float64,
)


def _merge_what(x: Tensor, strided: bool = False) -> str:
    layout = " (not contiguous in memory)" if strided else ""
    return f"merge_heads(x) for x of shape {tuple(x.shape)}{_dtype(x)}{layout}"


def merge_call(fn: Callable[..., Any], x: Tensor, strided: bool = False) -> Tensor:
    """The student's ``merge_heads(x)`` under the ban (``strided``: the same values in another
    memory order, what a transpose hands over), ``(B, T, H*Dh)`` of the input's dtype; a crash
    of ``.view`` is explained."""
    what = _merge_what(x, strided)
    if strided:
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)  # (B, H, T, Dh), not contiguous
    got = run(fn, x, what=what, on_error=_CONTIGUOUS_HINT)
    B, H, T, Dh = x.shape
    shape = tuple(getattr(got, "shape", ()))
    if shape == (B, T, H, Dh):
        raise AssertionError(
            f"{what} has shape {shape}, i.e. (B, T, H, Dh): the heads are in place but not "
            "flattened. Reshape to (B, T, H * Dh)."
        )
    got = expect_shape(got, (B, T, H * Dh), f"{what}, (B, H, T, Dh) -> (B, T, H*Dh)")
    return _kept_dtype(got, x, what, "merging")


#: ``merge_heads`` of a case ``(x (B, H, T, Dh)[, strided])``.
MERGE = Ordinary(
    "lab03",
    call=merge_call,
    what=_merge_what,
    describe=describe_entries,
    rule=(
        "merge_heads must undo split_heads: features h*Dh:(h+1)*Dh of token t come from head h "
        "at position t."
    ),
    same=same_entries,
    load=lambda x, strided=False: (torch.tensor(x, dtype=torch.float32), strided),
    output=_as_float64,
)


check_split_heads = SPLIT.visible(
    "check_split_heads",
    """Numbered features (entry ``100*b + 10*t + d``) of shape ``(2, 3, 8)`` in 2, 4 and 1
    heads.""",
)


def check_split_heads_divisible(fn: Callable[..., Tensor]) -> None:
    """A width of 10 cut into 4 heads raises a ``ValueError`` naming 10 and 4; a width of 8
    does not (so an answer that always raises does not pass)."""
    x = torch.zeros(2, 3, 10)
    expect_value_error(fn, (x, 4), ("10", "4"), "split_heads(x, 4) for x of width d_model=10")
    fits = torch.zeros(2, 3, 8)  # (B, T, D): 8 = 4 heads of width 2
    call_forbidding(fn, (fits, 4), {}, ban=BAN, what="split_heads(x, 4) for x of width d_model=8")


check_merge_heads = MERGE.visible(
    "check_merge_heads",
    """A numbered ``(2, 2, 3, 4)`` input (contiguous and not), and the heads of a numbered
    ``(2, 3, 8)`` input merged back into it.""",
)


# --------------------------------------------------------------------------------------
# MultiHeadAttention
# --------------------------------------------------------------------------------------


def instantiate(cls: Callable[..., Any], *args: Any, what: str, **kwargs: Any) -> nn.Module:
    """Build the student's module with a fixed seed, leaving the notebook's RNG alone."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        module = run(cls, *args, what=what, **kwargs)
    return expect_module(module, what)


def expect_layout(module: nn.Module, d_model: int, bias: bool, what: str) -> None:
    """Exactly four ``nn.Linear(d_model, d_model, bias=bias)`` projections, nothing else."""
    for name in PROJECTIONS:
        lin = getattr(module, name, None)
        if not isinstance(lin, nn.Linear):
            got = "nothing" if lin is None else type(lin).__name__
            raise AssertionError(
                f"{what} should have an attribute `{name}` that is an nn.Linear(d_model, "
                f"d_model), found {got}: create it in __init__ as self.{name} = nn.Linear(...)."
            )
        if (lin.in_features, lin.out_features) != (d_model, d_model) or (
            lin.bias is not None
        ) != bias:
            raise AssertionError(
                f"{what}.{name} is nn.Linear({lin.in_features}, {lin.out_features}, "
                f"bias={lin.bias is not None}); expected nn.Linear({d_model}, {d_model}, "
                f"bias={bias}): every projection maps the full width d_model to d_model (the "
                "heads share it), and bias=bias goes to every projection."
            )
    n = sum(p.numel() for p in module.parameters())
    want = 4 * d_model * (d_model + int(bias))
    if n != want:
        raise AssertionError(
            f"{what} has {n} parameters, expected 4 * d_model * (d_model{' + 1' * bias}) = "
            f"{want}: just the four projections. Heads are slices of the projected vectors; "
            "they have no parameters of their own."
        )


@torch.no_grad()
def set_weights(module: nn.Module, weights: Mapping[str, Tensor]) -> None:
    """Copy ``{"q_proj.weight": ..., "q_proj.bias": ...}`` into the student's projections."""
    for name, value in weights.items():
        layer, attr = name.split(".")
        param = getattr(getattr(module, layer), attr)
        param.copy_(value.to(param.dtype))


def call_mha(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    n_heads: int,
    what: str,
) -> tuple[Tensor, Tensor]:
    """Run the student's module; check it returns ``(out (B, T, D), weights (B, H, T, S))``."""
    kwargs = {} if mask is None else {"mask": mask}
    try:
        result = run(module, query, key, value, what=what, **kwargs)
    except ForbiddenCallError:
        raise
    except AssertionError as exc:
        message = str(exc)
        if f"{what} raised " not in message:
            raise
        if "overflow" in message:
            extra = HALF_FILL
        elif mask is not None and any(w in message for w in ("mask", "broadcast", "expand")):
            extra = f"{_MASK_CRASH_HINT} Also: {_SHAPES_HINT}"
        else:
            extra = _SHAPES_HINT
        raise AssertionError(f"{message} {extra}") from None
    if not isinstance(result, tuple | list) or len(result) != 2:
        raise AssertionError(
            f"{what} should return a pair (out, weights), got {type(result).__name__}: "
            "`return self.out_proj(...), weights`."
        )
    out, w = result
    B, T, D = query.shape
    S = key.shape[1]
    if tuple(getattr(w, "shape", ())) == (B, T, S):
        raise AssertionError(
            f"the weights of {what} have shape (B, T_q, T_k) = {(B, T, S)}, expected "
            f"(B, H, T_q, T_k) = {(B, n_heads, T, S)}: return every head's weights, not their "
            "average (torch averages them unless average_attn_weights=False)."
        )
    if tuple(getattr(w, "shape", ())) == (B, n_heads, T, T) and T != S:
        raise AssertionError(
            f"the weights of {what} have {T} columns, one per query, instead of {S}, one per "
            "key: the keys come from `key` (k_proj(key)) and the values from `value`, not from "
            "`query`."
        )
    w = expect_shape(w, (B, n_heads, T, S), f"the weights of {what}, (B, H, T_q, T_k)")
    out = expect_shape(out, (B, T, D), f"the output of {what}")
    expect_true(
        out.dtype == query.dtype,
        f"the output of {what} has dtype {out.dtype} for inputs of dtype {query.dtype}: keep "
        "the input's dtype (a float16 module returns float16).",
    )
    expect_true(w.is_floating_point(), f"the weights of {what} have dtype {w.dtype}, not float.")
    return out, w


def mask_alignment(w: Tensor, mask: Tensor, what: str) -> str | None:
    """Name the example or head whose mask the student's weights follow, if not their own.

    Weights follow a mask when they are (about) zero wherever it blocks and clearly positive
    only where it allows (in float16 tiny weights underflow to 0, so "zero" means below 1e-3).
    """
    B, H, T, S = w.shape
    allowed = torch.broadcast_to(mask, (B, H, T, S)).cpu()
    weights = w.detach().cpu().double()
    small = weights.abs() < 1e-3
    large = weights > 1e-3

    def follows(b: int, h: int, b2: int, h2: int) -> bool:
        m = allowed[b2, h2]
        return bool((small[b, h] | m).all() and (~large[b, h] | m).all())

    for b in range(B):
        for h in range(H):
            if follows(b, h, b, h):
                continue
            for b2 in range(B):
                if (
                    b2 != b
                    and follows(b, h, b2, h)
                    and not torch.equal(allowed[b2, h], allowed[b, h])
                ):
                    return (
                        f"the weights of {what} are zero where the mask of example {b2} blocks, "
                        f"but they belong to example {b} (head {h}): the mask does not line up "
                        "with the batch axis. Keep the batch axis first and let the mask "
                        "broadcast to (B, H, T, S); do not repeat or flatten it in another order."
                    )
            for h2 in range(H):
                if (
                    h2 != h
                    and follows(b, h, b, h2)
                    and not torch.equal(allowed[b, h2], allowed[b, h])
                ):
                    return (
                        f"head {h} of {what} follows the mask of head {h2}: a (B, H, T, S) mask "
                        "gives every head its own mask; keep the head axis in place."
                    )
    return None


def judge_mha(
    got: tuple[Tensor, Tensor],
    want: tuple[Tensor, Tensor],
    mistakes: Mapping[str, tuple[Tensor, Tensor]],
    what: str,
    mask: Tensor | None = None,
    tolerance: float = 1e-4,
) -> None:
    """Compare ``(out, weights)`` with the expected pair; name the mistake they reproduce.

    Args:
        got: the student's ``(out, weights)``.
        want: the expected ``(out (B, T, D), weights (B, H, T, S))`` (float64).
        mistakes: hint -> ``(out, weights)`` of that typical mistake.
        what: the call, for messages.
        mask: the mask it was called with (to say when heads or examples follow another's).
        tolerance: absolute and relative tolerance.
    """
    out, w = got
    want_out, want_w = want
    # A mistake that reproduces both the weights and the output is named first (several share
    # the weights: keys from `value` with values from `value` or from `key`).
    both = [
        hint
        for hint, (m_out, m_w) in mistakes.items()
        if close(out, m_out, tolerance, tolerance) and close(w, m_w, tolerance, tolerance)
    ]
    order = both + [hint for hint in mistakes if hint not in both]
    if mask is not None and not close(w, want_w, tolerance, tolerance):
        named = any(close(w, m[1], tolerance, tolerance) for m in mistakes.values())
        misaligned = None if named else mask_alignment(w, mask, what)
        if misaligned:
            raise AssertionError(misaligned)
    compare(
        w,
        want_w,
        what=f"the weights of {what}",
        candidates=[(mistakes[hint][1], hint) for hint in order],
        hint="Per head: softmax over the keys of (q_h @ k_h^T) / sqrt(Dh), blocked where the "
        "mask is False.",
        atol=tolerance,
        rtol=tolerance,
    )
    compare(
        out,
        want_out,
        what=f"the output of {what}",
        candidates=[(mistakes[hint][0], hint) for hint in order],
        hint="The weights are right but the output is not: weights @ v per head (v from "
        "v_proj(value)), merge the heads, then out_proj.",
        atol=tolerance,
        rtol=tolerance,
    )


def expect_train_like_eval(
    module: nn.Module,
    args: tuple[Tensor, Tensor, Tensor, Tensor | None],
    n_heads: int,
    what: str,
) -> tuple[Tensor, Tensor]:
    """Training mode computes what eval mode computes (this class has no dropout).

    Returns:
        The ``(out, weights)`` of the training-mode call.
    """
    query, key, value, mask = args
    was_training = module.training
    module.eval()
    want = call_mha(module, query, key, value, mask, n_heads, f"{what} in eval mode")
    module.train()
    first = call_mha(module, query, key, value, mask, n_heads, f"{what} in training mode")
    second = call_mha(module, query, key, value, mask, n_heads, f"{what} in training mode")
    if not module.training:
        raise AssertionError(
            f"{what} switched the module to eval mode: forward must not change module.training "
            "(the training loop sets it)."
        )
    module.train(was_training)
    for got, when in ((first, "in training mode"), (second, "called again in training mode")):
        for i, part in enumerate(("output", "weights")):
            if not close(got[i], want[i], 1e-6, 1e-6):
                gap = float((got[i].detach().double() - want[i].detach().double()).abs().max())
                raise AssertionError(
                    f"the {part} of {what} {when} differ from eval mode (largest difference "
                    f"{gap:.3g}): "
                    "MultiHeadAttention(d_model, n_heads, bias) has no dropout, so train() and "
                    "eval() must compute the same thing. Remove the dropout (or give it p=0 "
                    "by default)."
                )
    return first


def expect_gradients(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, n_heads: int, what: str
) -> None:
    """A loss on the output sends a gradient to every projection's weight."""
    module.zero_grad(set_to_none=True)
    out, _ = call_mha(module, query, key, value, None, n_heads, what)
    if not out.requires_grad:
        raise AssertionError(
            f"the output of {what} does not require grad: nothing could be trained. Did forward "
            "run under torch.no_grad(), or detach a tensor?"
        )
    (out.double() * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    for name in PROJECTIONS:
        grad = getattr(module, name).weight.grad
        if grad is None or not bool(grad.abs().sum() > 0):
            raise AssertionError(
                f"no gradient reaches {name}.weight after a loss on the output of {what}: "
                "training would never change it. Use the projection's output in the "
                "computation (no .detach(), .data or torch.no_grad() inside forward)."
            )
    module.zero_grad(set_to_none=True)


def reference_multi_head_attention(
    module: nn.Module,
    n_heads: int,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """PyTorch's multi-head attention with ``module``'s own projections, in float64.

    ``torch.nn.functional.multi_head_attention_forward`` with ``use_separate_proj_weight=True``
    and the weights of ``module.q_proj``, ``k_proj``, ``v_proj``, ``out_proj``. Torch turns a
    query row with nothing allowed into NaN; the course's rule is zero weights and a zero head
    output, so such rows (when no head of that query may attend) are let through to torch and
    set afterwards: weights 0, output ``out_proj(0)``.

    Args:
        module: anything with the four ``nn.Linear`` projections.
        n_heads: how many heads ``module`` splits its width into.
        query: queries ``(B, T, D)``; key and value: ``(B, S, D)`` each.
        mask: the course's boolean mask (True = may attend), broadcast to ``(B, H, T, S)``.

    Returns:
        ``(out (B, T, D), weights (B, H, T, S))`` in float64.

    Raises:
        ValueError: a query row is empty in some heads but not in others (torch cannot say).
    """

    def f64(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.detach().to("cpu", torch.float64)

    B, T, D = query.shape
    S = key.shape[1]
    attn_mask = empty = None
    if mask is not None:
        full = torch.broadcast_to(mask.cpu(), (B, n_heads, T, S))
        empty = ~full.any(-1)  # (B, H, T): queries with nothing allowed
        if bool((empty.any(1) != empty.all(1)).any()):
            raise ValueError("a query row is empty in some heads only: torch cannot serve here")
        attn_mask = ~(full | empty[..., None]).reshape(B * n_heads, T, S)  # torch: True = blocked
    biases = [f64(getattr(module, n).bias) for n in PROJECTIONS[:3]]
    in_bias = None if biases[0] is None else torch.cat(biases)
    q, k, v = (f64(t).transpose(0, 1) for t in (query, key, value))  # (T or S, B, D)
    out, w = F.multi_head_attention_forward(
        q,
        k,
        v,
        D,
        n_heads,
        None,
        in_bias,
        None,
        None,
        False,
        0.0,
        f64(module.out_proj.weight),
        f64(module.out_proj.bias),
        training=False,
        need_weights=True,
        attn_mask=attn_mask,
        use_separate_proj_weight=True,
        q_proj_weight=f64(module.q_proj.weight),
        k_proj_weight=f64(module.k_proj.weight),
        v_proj_weight=f64(module.v_proj.weight),
        average_attn_weights=False,
    )
    out = out.transpose(0, 1)  # (B, T, D)
    if empty is not None and bool(empty.any()):
        w = w.masked_fill(empty[..., None], 0.0)
        bias = f64(module.out_proj.bias)
        row = torch.zeros(D, dtype=torch.float64) if bias is None else bias
        out = torch.where(empty[:, 0, :, None], row, out)
    return out, w


def reference_mistakes(
    module: nn.Module,
    n_heads: int,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
) -> dict[str, tuple[Tensor, Tensor]]:
    """What typical mistakes give, computed by PyTorch on altered copies of the student's weights.

    Dividing by ``sqrt(d_model)`` instead of ``sqrt(Dh)`` is a query projection scaled by
    ``sqrt(Dh / D)``; no output projection is an identity ``out_proj``; keys and values swapped
    is torch called with them swapped; the mask ignored or inverted is torch with no mask or the
    inverse mask.
    """
    D = query.shape[-1]
    dh = D // n_heads

    class _Altered(nn.Module):
        def __init__(self, q_scale: float = 1.0, identity_out: bool = False) -> None:
            super().__init__()
            for name in PROJECTIONS:
                src = getattr(module, name)
                lin = nn.Linear(D, D, bias=src.bias is not None, dtype=torch.float64)
                with torch.no_grad():
                    lin.weight.copy_(src.weight.detach().double())
                    if lin.bias is not None:
                        lin.bias.copy_(src.bias.detach().double())
                setattr(self, name, lin)
            with torch.no_grad():
                self.q_proj.weight.mul_(q_scale)
                if self.q_proj.bias is not None:
                    self.q_proj.bias.mul_(q_scale)
                if identity_out:
                    self.out_proj.weight.copy_(torch.eye(D, dtype=torch.float64))
                    if self.out_proj.bias is not None:
                        self.out_proj.bias.zero_()

    out: dict[str, tuple[Tensor, Tensor]] = {
        HINTS["no_out_proj"]: reference_multi_head_attention(
            _Altered(identity_out=True), n_heads, query, key, value, mask
        ),
        HINTS["scale_d_model"]: reference_multi_head_attention(
            _Altered(q_scale=math.sqrt(dh / D)), n_heads, query, key, value, mask
        ),
        HINTS["no_scale"]: reference_multi_head_attention(
            _Altered(q_scale=math.sqrt(dh)), n_heads, query, key, value, mask
        ),
    }
    if key.shape == value.shape and not torch.equal(key, value):
        for hint, k, v in (
            ("kv_swapped", value, key),
            ("values_from_key", key, key),
            ("keys_from_value", value, value),
        ):
            out[HINTS[hint]] = reference_multi_head_attention(module, n_heads, query, k, v, mask)
    if mask is not None:
        out[HINTS["mask_ignored"]] = reference_multi_head_attention(
            module, n_heads, query, key, value, None
        )
        with contextlib.suppress(ValueError):  # torch cannot say when some heads are empty
            out[HINTS["mask_inverted"]] = reference_multi_head_attention(
                module, n_heads, query, key, value, ~mask
            )
    return out


def stored_mha(key: str) -> dict[str, Tensor]:
    """The tensors of a stored example (``"<key>: <name>"`` entries of ``fixtures/lab03.json``)."""
    names = (
        "query",
        "key",
        "value",
        *(f"{p}.{a}" for p in PROJECTIONS for a in ("weight", "bias")),
    )
    return {name: stored("lab03", f"{key}: {name}")[0] for name in names}


def stored_result(key: str) -> tuple[tuple[Tensor, Tensor], dict[str, tuple[Tensor, Tensor]]]:
    """Expected ``(out, weights)`` of a stored example and its mistakes' ``(out, weights)``."""
    want_out, out_mistakes = stored("lab03", f"{key}: out")
    want_w, w_mistakes = stored("lab03", f"{key}: weights")
    mistakes = {hint: (out_mistakes[hint], w_mistakes[hint]) for hint in out_mistakes}
    return (want_out, want_w), mistakes


def example_module(
    cls: Callable[..., Any], d_model: int, n_heads: int, what: str, dtype: torch.dtype
) -> tuple[nn.Module, dict[str, Tensor]]:
    """The student's module holding the stored example's weights, and the example's tensors."""
    module = instantiate(cls, d_model, n_heads, what=what)
    expect_layout(module, d_model, True, what)
    tensors = stored_mha(f"MultiHeadAttention({d_model}, {n_heads}) example")
    set_weights(module, {k: v for k, v in tensors.items() if "." in k})
    module.to(dtype)
    return module, {k: v.to(dtype) for k, v in tensors.items() if "." not in k}


def check_multi_head_attention(cls: Callable[..., Any]) -> None:
    """Layout, a stored cross-attention example, train == eval, torch's own MHA, gradients."""
    what = "MultiHeadAttention(8, 2)"
    module = instantiate(cls, 8, 2, what=what)
    expect_layout(module, 8, True, what)
    nobias = instantiate(cls, 8, 2, bias=False, what="MultiHeadAttention(8, 2, bias=False)")
    expect_layout(nobias, 8, False, "MultiHeadAttention(8, 2, bias=False)")

    # A stored cross-attention example: 3 queries, 5 keys, keys different from values.
    module, x = example_module(cls, 8, 2, what, torch.float32)
    want, mistakes = stored_result("MultiHeadAttention(8, 2) example")
    call = f"{what}(query, key, value) with 3 queries and 6 keys (key != value)"
    module.eval()
    judge_mha(
        call_mha(module, x["query"], x["key"], x["value"], None, 2, call), want, mistakes, call
    )
    args = (x["query"], x["key"], x["value"], None)
    expect_train_like_eval(module, args, 2, call)

    # PyTorch's own multi-head attention with your module's initial weights (no bias, 4 heads).
    what = "MultiHeadAttention(12, 4, bias=False)"
    module = instantiate(cls, 12, 4, bias=False, what=what).eval()
    expect_layout(module, 12, False, what)
    g = generator(303)
    query, key, value = (torch.randn(2, n, 12, generator=g) for n in (4, 6, 6))
    call = f"{what} with its own initial weights, 4 queries, 6 keys"
    got = call_mha(module, query, key, value, None, 4, call)
    judge_mha(
        got,
        reference_multi_head_attention(module, 4, query, key, value),
        reference_mistakes(module, 4, query, key, value),
        call + " (against torch.nn.functional.multi_head_attention_forward)",
    )
    expect_gradients(module.train(), query, key, value, 4, what)


def check_multi_head_attention_divisible(cls: Callable[..., Any]) -> None:
    """``MultiHeadAttention(10, 4)`` raises a ``ValueError`` naming 10 and 4."""
    expect_value_error(cls, (10, 4), ("10", "4"), "MultiHeadAttention(10, 4)")


def check_multi_head_attention_mask(cls: Callable[..., Any]) -> None:
    """Stored masked examples (blocked keys score highest, an empty row), float16, and torch."""
    what = "MultiHeadAttention(8, 2)"
    for label in ("a (B, 1, 1, S) key mask", "a (B, H, T, S) mask with an empty row"):
        key = f"{what} example with {label}"
        mask = stored("lab03", f"{key}: mask")[0].bool()
        want, mistakes = stored_result(key)
        for dtype in (torch.float32, torch.float16):
            module, x = example_module(cls, 8, 2, what, dtype)
            call = f"{what}(query, key, value, mask) with {label}" + (
                f", in {dtype}".replace("torch.", "") if dtype != torch.float32 else ""
            )
            got = call_mha(module.eval(), x["query"], x["key"], x["value"], mask, 2, call)
            judge_mha(got, want, mistakes, call, mask, TOLERANCE[dtype])
    # A (T, S) mask with your module's own weights, against PyTorch.
    module = instantiate(cls, 8, 4, what="MultiHeadAttention(8, 4)").eval()
    g = generator(304)
    query, key, value = (torch.randn(3, n, 8, generator=g) for n in (4, 5, 5))
    mask = torch.tensor(
        [[1, 0, 1, 1, 0], [0, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 1, 0]], dtype=torch.bool
    )
    call = "MultiHeadAttention(8, 4) with its own initial weights and a (T, S) mask"
    got = call_mha(module, query, key, value, mask, 4, call)
    judge_mha(
        got,
        reference_multi_head_attention(module, 4, query, key, value, mask),
        reference_mistakes(module, 4, query, key, value, mask),
        call + " (against torch.nn.functional.multi_head_attention_forward)",
        mask,
    )


# --------------------------------------------------------------------------------------
# load_torch_weights
# --------------------------------------------------------------------------------------


class Projections(nn.Module):
    """Just the four projections of a multi-head attention: what ``load_torch_weights`` fills.

    Every parameter starts as NaN, so anything not copied shows up.
    """

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
                p.fill_(float("nan"))


#: ``out_proj`` entries of :func:`numbered_torch_mha` start at this value.
OUT_BASE = 500.0


@torch.no_grad()
def numbered_torch_mha(d_model: int, n_heads: int, bias: bool) -> nn.MultiheadAttention:
    """A ``torch.nn.MultiheadAttention`` whose entries say where they sit.

    ``in_proj_weight[r, c] = (r + 1) + (c + 1) / 1000``, ``in_proj_bias[r] = -(r + 1)``;
    ``out_proj`` the same plus :data:`OUT_BASE`. A copied entry names its source row and column.
    """
    theirs = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True)
    rows = torch.arange(3 * d_model, dtype=torch.float32)[:, None] + 1
    cols = torch.arange(d_model, dtype=torch.float32)[None, :] + 1
    theirs.in_proj_weight.copy_(rows + cols / 1000)
    theirs.out_proj.weight.copy_(OUT_BASE + rows[:d_model] + cols / 1000)
    if bias:
        theirs.in_proj_bias.copy_(-rows[:, 0])
        theirs.out_proj.bias.copy_(-(OUT_BASE + rows[:d_model, 0]))
    return theirs.eval()


def _source(got: Tensor, d_model: int) -> str:
    """Where the numbered entries of a loaded weight ``(D, D)`` came from, in words."""
    g = got.detach().double().cpu()
    out = bool((g[0, 0] > OUT_BASE / 2).item())
    g = g - OUT_BASE if out else g
    rows = g.floor().round().long() - 1  # (D, D)
    cols = ((g - g.floor()) * 1000).round().long() - 1
    a = torch.arange(d_model)
    name = "out_proj.weight" if out else "in_proj_weight"
    if torch.equal(cols, a[None, :].expand_as(cols)) and torch.equal(
        rows - rows[0, 0], a[:, None].expand_as(rows)
    ):
        start = int(rows[0, 0])
        return f"rows {start}..{start + d_model - 1} of {name}"
    if torch.equal(cols, a[:, None].expand_as(cols)) and torch.equal(
        rows - rows[0, 0], a[None, :].expand_as(rows)
    ):
        start = int(rows[0, 0])
        return f"the transpose of rows {start}..{start + d_model - 1} of {name}"
    return f"a rearrangement of {name}"


def judge_loaded(
    ours: nn.Module, theirs: nn.MultiheadAttention, want: Mapping[str, Tensor], what: str
) -> None:
    """Compare the projections of ``ours`` after loading a numbered ``theirs`` with ``want``.

    Args:
        ours: the module the student's ``load_torch_weights`` filled.
        theirs: the numbered torch module it read (:func:`numbered_torch_mha`).
        want: ``"q_proj.weight"`` ... -> the expected values (float64); biases only with bias.
        what: the call, for messages.
    """
    D = theirs.embed_dim
    order = {0: "query", 1: "key", 2: "value"}
    for name in PROJECTIONS:
        got = getattr(ours, name).weight.detach()
        if bool(torch.isnan(got).any()):
            raise AssertionError(
                f"after {what}, {name}.weight was not filled (it still holds the NaNs it started "
                "with): copy torch's values into it, with .copy_(...) under torch.no_grad()."
            )
        if close(got, want[f"{name}.weight"], 1e-6, 0):
            continue
        source = _source(got, D)
        hint = f"Your {name}.weight holds {source}"
        if "transpose" in source:
            hint += (
                ": torch's blocks are already in nn.Linear's (out, in) layout, copy them "
                "without .T."
            )
        elif source.startswith("rows") and "in_proj" in source:
            block = int(source.split()[1].split("..")[0]) // D
            hint += (
                f", the {order.get(block, '?')} projection: torch stacks them in the order "
                "query, key, value, so q_proj takes rows 0..D-1, k_proj D..2D-1 and v_proj "
                "2D..3D-1."
                if name != "out_proj"
                else ": out_proj is copied from theirs.out_proj, not from in_proj_weight."
            )
        elif name != "out_proj" and "out_proj" in source:
            hint += ": the input projections come from in_proj_weight."
        else:
            hint += "."
        expect_close(got, want[f"{name}.weight"], f"{name}.weight after {what}", hint=hint)
    for name in PROJECTIONS:
        bias = getattr(ours, name).bias
        key = f"{name}.bias"
        if key not in want:
            continue
        expect_true(
            bias is not None,
            f"after {what}, {name} has no bias but torch's module has one: build it with "
            "bias=True.",
        )
        got = bias.detach()
        if not close(got, want[key], 1e-6, 0):
            raise AssertionError(
                f"after {what}, {name}.bias is not torch's: "
                + (
                    "it was never copied: copy the biases too, in_proj_bias in the same q, k, "
                    "v order, and out_proj.bias."
                    if bool(torch.isnan(got).any())
                    else "copy in_proj_bias in the same q, k, v order as the weights, and "
                    "out_proj.bias from theirs.out_proj."
                )
            )


def watch_parameters(ours: nn.Module) -> dict[str, Tensor]:
    """``"q_proj.weight" -> Parameter`` of ``ours``, to compare after loading."""
    return {
        f"{name}.{attr}": getattr(getattr(ours, name), attr)
        for name in PROJECTIONS
        for attr in ("weight", "bias")
        if getattr(getattr(ours, name), attr) is not None
    }


def expect_copied_in_place(
    ours: nn.Module,
    theirs: nn.MultiheadAttention,
    before: Mapping[str, Tensor],
    optimizer: torch.optim.Optimizer,
    what: str,
) -> None:
    """The same Parameter objects, trainable, not sharing memory with torch's; still trained.

    Args:
        ours: the module after loading.
        theirs: the torch module it was loaded from.
        before: :func:`watch_parameters` of ``ours`` before loading.
        optimizer: an optimizer over ``ours.parameters()`` built before loading.
        what: the call, for messages.
    """
    now = watch_parameters(ours)
    for name, param in before.items():
        current = now.get(name)
        if current is not param:
            kind = type(current).__name__ if current is not None else "nothing"
            raise AssertionError(
                f"after {what}, ours.{name} is a new object ({kind}) instead of the Parameter "
                "the module had: load_torch_weights must COPY the values into the existing "
                "parameters (ours.q_proj.weight.copy_(...) under torch.no_grad()). Replacing "
                "them breaks everything that already holds the old ones: an optimizer built "
                "before loading would go on updating tensors the module no longer uses."
            )
        expect_true(
            isinstance(param, nn.Parameter) and param.requires_grad,
            f"after {what}, ours.{name} no longer requires grad, so it would not be trained: "
            "copy the values without changing the parameter's requires_grad.",
        )
    theirs_storage = {p.untyped_storage().data_ptr() for p in theirs.parameters() if p.numel()}
    for name, param in now.items():
        if param.untyped_storage().data_ptr() in theirs_storage:
            raise AssertionError(
                f"after {what}, ours.{name} shares its memory with a parameter of torch's "
                "module: training one would silently change the other. Copy the values "
                "(.copy_(...)) instead of pointing .data at torch's tensor."
            )
    # An optimizer built before loading still trains the module's parameters.
    old = {name: p.detach().clone() for name, p in now.items()}
    g = generator(305)
    x = torch.randn(3, theirs.embed_dim, generator=g)
    loss = sum((getattr(ours, name)(x) ** 2).sum() for name in PROJECTIONS)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    for name, p in watch_parameters(ours).items():
        if torch.equal(p.detach(), old[name]):
            raise AssertionError(
                f"after {what}, one optimizer step (built before loading) left ours.{name} "
                "unchanged: the module no longer uses the parameters the optimizer holds. "
                "Copy into the existing parameters instead of replacing them."
            )


def load_call(fn: Callable[..., Any], ours: nn.Module, theirs: nn.Module, what: str) -> None:
    """The student's ``load_torch_weights(ours, theirs)`` under the ban."""
    run(
        fn,
        ours,
        theirs,
        what=what,
        on_error="Copy under torch.no_grad() (a parameter cannot be changed in place while "
        "autograd records), and remember that in_proj_bias and out_proj.bias are None when "
        "torch's module was built with bias=False.",
    )


def check_load_torch_weights(fn: Callable[..., Any]) -> None:
    """Numbered torch weights land in the right projections, copied into the same Parameters."""
    theirs = numbered_torch_mha(6, 2, True)
    ours = Projections(6, 2)
    before = watch_parameters(ours)
    optimizer = torch.optim.SGD(ours.parameters(), lr=0.1)
    what = "load_torch_weights(ours, theirs) with d_model=6, n_heads=2"
    load_call(fn, ours, theirs, what)
    want = {
        name: stored("lab03", f"load_torch_weights(d_model=6): {name}")[0]
        for name in watch_parameters(ours)
    }
    judge_loaded(ours, theirs, want, what)
    expect_copied_in_place(ours, theirs, before, optimizer, what)
    # Loaded from a random torch module, PyTorch's function with your weights computes
    # what torch's module computes.
    g = generator(306)
    theirs = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / 3)
    ours = Projections(8, 2)
    what = "load_torch_weights(ours, theirs) with a random torch module of width 8"
    load_call(fn, ours, theirs, what)
    query, key, value = (torch.randn(2, n, 8, generator=g) for n in (3, 4, 4))
    with torch.no_grad():
        ref_out, ref_w = theirs(query, key, value, average_attn_weights=False)
    out, w = reference_multi_head_attention(ours, 2, query, key, value)
    expect_close(
        w,
        ref_w.double(),
        f"the attention weights of your loaded projections ({what})",
        hint="The queries or keys differ from torch's: check which rows of in_proj_weight "
        "went into q_proj and k_proj, and the biases.",
    )
    expect_close(
        out,
        ref_out.double(),
        f"the output of your loaded projections ({what})",
        hint="The weights agree but the output does not: check v_proj (rows 2D..3D-1) and "
        "out_proj, weights and biases.",
    )

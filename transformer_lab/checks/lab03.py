"""Visible checks of lab 03 (multi-head attention): split_heads, merge_heads, MultiHeadAttention,
load_torch_weights, on worked examples stored in ``fixtures/lab03.json`` with what the typical
mistakes (:data:`HINTS`) return there. PyTorch's attention and the kit's answers are refused.

Reference: Prince, *Understanding Deep Learning*, section 12.3.3 (multiple heads).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from transformer_lab.checks import spec
from transformer_lab.checks._attention import HALF_FILL, dtype_name, stored_pair
from transformer_lab.checks._common import (
    Case,
    ForbiddenCallError,
    call_forbidding,
    close,
    compare,
    expect_module,
    expect_shape,
    expect_true,
    generator,
    load_weights,
    stored,
)
from transformer_lab.checks._generated import Given, Ordinary

__all__ = [
    "check_load_torch_weights",
    "check_merge_heads",
    "check_multi_head_attention",
    "check_multi_head_attention_divisible",
    "check_multi_head_attention_mask",
    "check_split_heads",
    "check_split_heads_divisible",
]

#: What graded code may not call (``specs/lab03.toml``).
BAN = spec.load("03_multi_head_attention").ban("heads")

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")
ATTRS = ("weight", "bias")
#: ``(query, key, value, mask)``: what a ``MultiHeadAttention`` is called with.
Args = tuple[Tensor, Tensor, Tensor, Tensor | None]
#: What it returns, ``(out (B, T, D), weights (B, H, T, S))``.
Pair = tuple[Tensor, Tensor]

#: What each typical mistake gets told (the hidden checks' catalogue and the stored examples).
HINTS: dict[str, str] = {
    "split_no_transpose": "It matches heads made with reshape(B, H, T, Dh) straight away, which "
    "mixes tokens between heads: reshape to (B, T, H, Dh) first, then transpose(1, 2).",
    "split_interleaved": "It matches interleaved heads (head h takes every H-th feature): head h "
    "holds the features h*Dh:(h+1)*Dh. Reshape to (B, T, H, Dh), not (B, T, Dh, H).",
    "merge_no_transpose": "It matches heads merged with reshape(B, T, D) and no transpose, which "
    "mixes positions: transpose(1, 2) to (B, T, H, Dh) first, then reshape to (B, T, H * Dh).",
    "merge_interleaved": "It matches interleaved heads (features ordered Dh-major): head 0's "
    "features come first, then head 1's: transpose(1, 2) to (B, T, H, Dh), then reshape.",
    "merge_wrong_axes": "It matches a transpose of the last two axes: the head axis (1) must "
    "move next to the feature axis, transpose(1, 2), not transpose(2, 3).",
    "no_out_proj": "It matches the concatenated heads without the output projection: apply "
    "self.out_proj to the merged heads; it mixes what the heads found.",
    "scale_d_model": "It matches scores divided by sqrt(d_model): each head works in its own "
    "subspace of width Dh = d_model / n_heads, so divide by sqrt(Dh).",
    "no_scale": "It matches attention without scaling: divide each head's scores by sqrt(Dh).",
    "kv_swapped": "It matches keys and values swapped: keys come from k_proj(key) and values "
    "from v_proj(value); in cross-attention key and value are different tensors.",
    "values_from_key": "It matches values computed from `key`: the weights average "
    "v_proj(value); in cross-attention key and value are different tensors.",
    "keys_from_value": "It matches keys computed from `value`: the scores compare queries with "
    "k_proj(key); in cross-attention key and value are different tensors.",
    "mask_ignored": "It matches attention without the mask: pass the mask on to the attention "
    "of every head (it broadcasts to (B, H, T, S)); here it blocks the top-scoring keys.",
    "mask_inverted": "It matches the mask inverted: in this course True means 'may attend' "
    "(torch.nn.MultiheadAttention's attn_mask uses the opposite).",
    "mask_after_softmax": "It matches a mask applied after the softmax, which leaves rows that "
    "no longer sum to 1: fill the blocked scores before the softmax.",
    "mask_neg_inf": "It has NaN exactly where a query may attend to nothing (a fill of -inf "
    "gives exp(-inf)/0): fill with torch.finfo(scores.dtype).min and zero the weights of "
    "blocked keys after the softmax (lab 02's rule).",
    "mask_uniform": "A query that may attend to nothing gets uniform weights over the blocked "
    "keys: zero the weights of blocked keys after the softmax (lab 02's rule).",
    "mask_unsqueezed": "It matches a mask given an extra axis (mask.unsqueeze(1)): the mask "
    "already broadcasts to (B, H, T, S) as it is; do not add or repeat axes.",
    "mask_first_head": "It matches every head that follows the mask of head 0 (mask[:, :1]): "
    "a (B, H, T, S) mask gives every head its own mask; keep the head axis in place.",
    "mask_repeated": "It matches masks that do not line up with the batch axis (heads "
    "flattened as b*H + h, the mask repeated as h*B + b): let the mask broadcast as it is.",
    "load_wrong_order": "It matches the query and key projections swapped: torch stacks them "
    "in the order query, key, value (q_proj takes rows 0..D-1 of in_proj_weight).",
    "load_transposed": "It matches torch's weights transposed: they are already in nn.Linear's "
    "(out, in) layout, copy them without .T.",
}


# Room for rounding (a correct float32 answer is ~1e-6 off); every catalogued mistake is far off.
TOLERANCE: dict[torch.dtype, float] = {
    torch.float32: 1e-4,
    torch.float16: 2e-2,
    torch.bfloat16: 6e-2,
}


def run(fn: Callable[..., Any], *args: Any, what: str, on_error: str = "", **kwargs: Any) -> Any:
    """Call the student's ``fn`` under :data:`BAN`; add ``on_error`` to a crash's message."""
    return call_forbidding(fn, args, kwargs, ban=BAN, what=what, on_error=on_error)


def expect_value_error(fn: Callable[..., Any], args: tuple[Any, ...], what: str) -> None:
    """``fn(*args)`` (d_model 10, 4 heads) must raise a ``ValueError`` naming 10 and 4."""
    try:
        run(fn, *args, what=what)
    except AssertionError as exc:
        error = exc.__cause__ or exc  # what the student's code raised (an assert: exc itself)
        if isinstance(exc, ForbiddenCallError) or isinstance(error, NotImplementedError):
            raise
        if isinstance(error, ValueError) and "10" in str(error) and "4" in str(error):
            return
        got = f"raised {type(error).__name__}({str(error)!r})"
    else:
        got = "returned normally"
    raise AssertionError(
        f"{what} {got} instead of a ValueError naming 10 and 4. Check it first: "
        'raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}").'
    )


def numbered(*shape: int) -> Tensor:
    """A float tensor whose entry at ``(i, j, k, ...)`` reads ``...ijk`` in decimal (sizes up to
    10: ``numbered(2, 3, 8)[b, t, d] == 100*b + 10*t + d``): a misplaced entry says whence."""
    axes = torch.meshgrid(*(torch.arange(n) for n in shape), indexing="ij")  # each (*shape)
    return sum(10 ** (len(shape) - 1 - i) * a for i, a in enumerate(axes)).float()


def _dtype(x: Tensor) -> str:
    return "" if x.dtype == torch.float32 else f", {str(x.dtype).removeprefix('torch.')}"


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


def heads_call(
    fn: Callable[..., Any], args: tuple[Any, ...], what: str, want: tuple[int, ...]
) -> Tensor:
    """The student's ``fn(*args)`` under the ban: a tensor of shape ``want``, the input's dtype."""
    got = expect_shape(run(fn, *args, what=what), want, what)
    expect_true(
        got.dtype == args[0].dtype,
        f"{what} has dtype {got.dtype} for an input of dtype {args[0].dtype}: heads only "
        "rearrange the entries, keep the input's dtype.",
    )
    return got


def split_call(fn: Callable[..., Any], x: Tensor, n_heads: int) -> Tensor:
    """The student's ``split_heads(x, n_heads)``: heads ``(B, H, T, Dh)``."""
    B, T, D = x.shape
    return heads_call(fn, (x, n_heads), SPLIT.what(x, n_heads), (B, n_heads, T, D // n_heads))


#: ``split_heads`` of a case ``(x (B, T, D), n_heads)``.
SPLIT = Ordinary(
    "lab03",
    call=split_call,
    what=lambda x, n: f"split_heads(x, {n}) for x of shape {tuple(x.shape)}{_dtype(x)}",
    describe=describe_entries,
    rule="Head h of token t must hold features x[b, t, h*Dh:(h+1)*Dh].",
    same=same_entries,
    load=lambda x, n_heads: (torch.tensor(x, dtype=torch.float32), n_heads),
    output=functools.partial(torch.as_tensor, dtype=torch.float64),
)


def merge_call(fn: Callable[..., Any], x: Tensor, strided: bool = False) -> Tensor:
    """The student's ``merge_heads(x)``: ``(B, T, H*Dh)`` (``strided``: the same values in
    another memory order, what a transpose hands over)."""
    what = MERGE.what(x, strided)
    if strided:
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)  # (B, H, T, Dh), not contiguous
    B, H, T, Dh = x.shape
    return heads_call(fn, (x,), what, (B, T, H * Dh))


#: ``merge_heads`` of a case ``(x (B, H, T, Dh)[, strided])``.
MERGE = Ordinary(
    "lab03",
    call=merge_call,
    what=lambda x, strided=False: (
        f"merge_heads(x) for x of shape {tuple(x.shape)}{_dtype(x)}"
        + " (not contiguous in memory)" * strided
    ),
    describe=describe_entries,
    rule="merge_heads undoes split_heads: features h*Dh:(h+1)*Dh of token t come from head h.",
    same=same_entries,
    load=lambda x, strided=False: (torch.tensor(x, dtype=torch.float32), strided),
    output=SPLIT.output,
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
    expect_value_error(fn, (x, 4), "split_heads(x, 4) for x of width d_model=10")
    run(fn, torch.zeros(2, 3, 8), 4, what="split_heads(x, 4) for x of width d_model=8")


check_merge_heads = MERGE.visible(
    "check_merge_heads",
    """A numbered ``(2, 2, 3, 4)`` input (contiguous and not), and the heads of a numbered
    ``(2, 3, 8)`` input merged back into it.""",
)


def instantiate(cls: Callable[..., Any], *args: Any, what: str, **kwargs: Any) -> nn.Module:
    """Build the student's module with a fixed seed, leaving the notebook's RNG alone."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        module = run(cls, *args, what=what, **kwargs)
    return expect_module(module, what)


def expect_layout(module: nn.Module, d_model: int, bias: bool, what: str) -> None:
    """Four ``nn.Linear`` projections named as in the notebook, and only their parameters."""
    linear = all(isinstance(getattr(module, name, None), nn.Linear) for name in PROJECTIONS)
    n = sum(p.numel() for p in module.parameters())
    want = 4 * d_model * (d_model + int(bias))
    expect_true(
        linear and n == want,
        f"{what} has {n} parameters, expected 4 * d_model * (d_model{' + 1' * bias}) = {want}: "
        f"just the projections {', '.join(PROJECTIONS)}, each nn.Linear(d_model, d_model, "
        "bias=bias). Heads are slices of the projected vectors, with no parameters of their own.",
    )


def call_mha(module: nn.Module, args: Args, n_heads: int, what: str) -> Pair:
    """Run the student's module; check it returns ``(out (B, T, D), weights (B, H, T, S))``."""
    query, key, value, mask = args
    kwargs = {} if mask is None else {"mask": mask}
    try:
        result = run(module, query, key, value, what=what, **kwargs)
    except AssertionError as exc:
        if "overflow" not in str(exc):
            raise
        raise AssertionError(f"{exc} {HALF_FILL}") from None
    expect_true(
        isinstance(result, tuple | list) and len(result) == 2,
        f"{what} should return a pair (out, weights): `return self.out_proj(...), weights`.",
    )
    out, w = result
    B, T, D = query.shape
    w = expect_shape(w, (B, n_heads, T, key.shape[1]), f"the weights of {what}, (B, H, T_q, T_k)")
    out = expect_shape(out, (B, T, D), f"the output of {what}")
    expect_true(
        out.dtype == query.dtype,
        f"the output of {what} has dtype {out.dtype} for inputs of dtype {query.dtype}: keep "
        "the input's dtype (a float16 module returns float16).",
    )
    return out, w


def judge_mha(
    got: Pair, want: Pair, mistakes: Mapping[str, Pair], what: str, tolerance: float = 1e-4
) -> None:
    """Compare ``got`` with ``want``, the output first (mistakes that share their weights differ
    there), naming the mistake it reproduces (``mistakes``: hint -> its ``(out, weights)``)."""
    for i, part in ((0, "output"), (1, "weights")):
        compare(
            got[i],
            want[i],
            what=f"the {part} of {what}",
            candidates=[(pair[i], h) for h, pair in mistakes.items()],
            hint="Per head: weights = softmax over the keys of (q_h @ k_h^T) / sqrt(Dh), blocked "
            "where the mask is False; out = out_proj(the heads' weights @ v_h, merged).",
            atol=tolerance,
            rtol=tolerance,
        )


def expect_train_like_eval(module: nn.Module, args: Args, n_heads: int, what: str) -> None:
    """Training mode computes what eval mode computes, call after call (this class has no
    dropout), and forward leaves ``module.training`` as the caller set it."""
    want = call_mha(module.eval(), args, n_heads, f"{what} in eval mode")
    module.train()
    for when in ("in training mode", "called again in training mode"):
        got = call_mha(module, args, n_heads, f"{what} {when}")
        expect_true(
            module.training
            and all(close(g, w, 1e-6, 1e-6) for g, w in zip(got, want, strict=True)),
            f"{what} {when} must compute what eval mode computes, and stay in training mode: "
            "MultiHeadAttention(d_model, n_heads, bias) has no dropout (remove it, or give it p=0 "
            "by default), and forward must not change module.training (the training loop sets it).",
        )


def expect_gradients(module: nn.Module, args: Args, n_heads: int, what: str) -> None:
    """A loss on the output sends a gradient to every projection's weight."""
    module.zero_grad(set_to_none=True)
    out, _ = call_mha(module, args, n_heads, what)
    if out.requires_grad:  # (else no gradient reaches anything)
        (out.double() * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    for name in PROJECTIONS:
        grad = getattr(module, name).weight.grad
        expect_true(
            grad is not None and bool(grad.abs().sum() > 0),
            f"no gradient reaches {name}.weight after a loss on the output of {what}: training "
            "would never change it. Use the projection's output in the computation (no "
            ".detach(), .data or torch.no_grad() inside forward).",
        )
    module.zero_grad(set_to_none=True)


def judge_example(
    cls: Callable[..., Any],
    d_model: int,
    n_heads: int,
    bias: bool = True,
    label: str = "",
    dtype: torch.dtype = torch.float32,
) -> tuple[nn.Module, Args]:
    """The student's module holding the weights of a stored example, in ``dtype`` and eval mode,
    judged on its inputs (and stored mask ``label``); returns the module and those inputs."""
    what = f"MultiHeadAttention({d_model}, {n_heads}{'' if bias else ', bias=False'})"
    module = instantiate(cls, d_model, n_heads, what=what, **({} if bias else {"bias": False}))
    expect_layout(module, d_model, bias, what)
    params = (f"{p}.{a}" for p in PROJECTIONS for a in ATTRS[: 1 + bias])
    names = ("query", "key", "value", *params)  # the example's inputs and projections
    tensors = {n: stored("lab03", f"{what} example: {n}")[0] for n in names}
    load_weights(module, {k: v for k, v in tensors.items() if "." in k}, what)
    module.to(dtype).eval()
    key = f"{what} example" + (f" with {label}" if label else "")
    mask = stored("lab03", f"{key}: mask")[0].bool() if label else None
    args = (*(tensors[n].to(dtype) for n in ("query", "key", "value")), mask)
    call = f"{what}(query, key, value{', mask' * bool(label)}) on its example (key != value)"
    call += f"{f', {label}' * bool(label)}{f', in {dtype_name(dtype)}' * (dtype != torch.float32)}"
    got = call_mha(module, args, n_heads, call)
    judge_mha(got, *stored_pair("lab03", key), call, TOLERANCE[dtype])
    return module, args


def check_multi_head_attention(cls: Callable[..., Any]) -> None:
    """Layout (with bias and without), two stored cross-attention examples, train == eval,
    gradients."""
    module, args = judge_example(cls, 8, 2)
    expect_train_like_eval(module, args, 2, "MultiHeadAttention(8, 2)")
    module, args = judge_example(cls, 12, 4, bias=False)
    expect_gradients(module.train(), args, 4, "MultiHeadAttention(12, 4, bias=False)")


def check_multi_head_attention_divisible(cls: Callable[..., Any]) -> None:
    """``MultiHeadAttention(10, 4)`` raises a ``ValueError`` naming 10 and 4."""
    expect_value_error(cls, (10, 4), "MultiHeadAttention(10, 4)")


def check_multi_head_attention_mask(cls: Callable[..., Any]) -> None:
    """Stored masked examples (blocked keys score highest, an empty row) in float32 and float16,
    and a ``(T, S)`` mask with as many queries as heads (an extra axis broadcasts silently)."""
    for label in ("a (B, 1, 1, S) key mask", "a (B, H, T, S) mask with an empty row"):
        for dtype in (torch.float32, torch.float16):
            judge_example(cls, 8, 2, label=label, dtype=dtype)
    judge_example(cls, 8, 4, label="a (T, S) mask")


class Projections(nn.Module):
    """Just the four projections of a multi-head attention: what ``load_torch_weights`` fills.
    Every parameter starts as NaN, so anything not copied shows up."""

    def __init__(self, d_model: int, n_heads: int, bias: bool = True) -> None:
        super().__init__()
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.num_heads = n_heads
        for name in PROJECTIONS:  # q_proj, k_proj, v_proj, out_proj, as the notebook names them
            setattr(self, name, nn.Linear(d_model, d_model, bias=bias))
        with torch.no_grad():
            for p in self.parameters():
                p.fill_(float("nan"))


@torch.no_grad()
def randomised(module: nn.Module, g: torch.Generator, scale: float = 1.0) -> nn.Module:
    """``module`` with random parameters (biases too: zero biases would hide a missing one)."""
    for p in module.parameters():
        p.copy_(scale * torch.randn(p.shape, generator=g) / math.sqrt(max(p.shape[-1], 1)))
    return module


def loaded_as(theirs: nn.MultiheadAttention, how: str = "right") -> dict[str, Tensor]:
    """What each projection of ``ours`` holds (float64) after loading ``theirs`` right, or as
    the typical wrong loader ``how`` does (``"load_wrong_order"``, ``"load_transposed"``)."""
    out: dict[str, Tensor] = {}
    for attr in ("weight", "bias"):
        stacked = getattr(theirs, f"in_proj_{attr}")
        if stacked is None:
            break
        blocks = [*stacked.detach().double().chunk(3), getattr(theirs.out_proj, attr).double()]
        if how == "load_wrong_order":
            blocks[:2] = blocks[1::-1]
        if how == "load_transposed" and attr == "weight":
            blocks = [block.T for block in blocks]
        out |= {f"{n}.{attr}": t.detach() for n, t in zip(PROJECTIONS, blocks, strict=True)}
    return out


def projection_tensors(ours: nn.Module) -> dict[str, Any]:
    """``"q_proj.weight" -> what ours holds there`` (a Parameter, a plain tensor, None)."""
    return {f"{n}.{a}": getattr(getattr(ours, n), a) for n in PROJECTIONS for a in ATTRS}


def judge_load(
    fn: Callable[..., Any], ours: nn.Module, theirs: nn.MultiheadAttention, what: str
) -> None:
    """``load_torch_weights(ours, theirs)`` under the ban fills every projection as
    :func:`loaded_as`, copying into the trainable Parameters ``ours`` had."""
    before = projection_tensors(ours)
    run(
        fn,
        ours,
        theirs,
        what=what,
        on_error="Copy under torch.no_grad() (a parameter cannot be changed in place while "
        "autograd records), and remember that in_proj_bias and out_proj.bias are None when "
        "torch's module was built with bias=False.",
    )
    now = projection_tensors(ours)
    mistakes = {HINTS[h]: loaded_as(theirs, h) for h in ("load_wrong_order", "load_transposed")}
    for key, expected in loaded_as(theirs).items():
        if now[key] is None or bool(torch.isnan(now[key]).any()):
            raise AssertionError(f"after {what}, {key} was not filled (still NaN): copy it too.")
        compare(
            now[key].detach(),
            expected,
            what=f"{key} after {what}",
            candidates=[(wrong[key], hint) for hint, wrong in mistakes.items()],
            hint="q_proj, k_proj and v_proj take the row blocks 0..D-1, D..2D-1 and 2D..3D-1 "
            "of in_proj_weight (and in_proj_bias); out_proj is copied from theirs.out_proj.",
            atol=1e-6,
            rtol=0,
        )
    theirs_memory = {p.untyped_storage().data_ptr() for p in theirs.parameters() if p.numel()}
    for key, param in ((k, p) for k, p in before.items() if p is not None):
        expect_true(
            now[key] is param
            and param.requires_grad
            and param.untyped_storage().data_ptr() not in theirs_memory,
            f"after {what}, ours.{key} must be the trainable Parameter it was, in memory of its "
            "own: copy the values into it (.copy_(...) under torch.no_grad()), so that an "
            "optimizer built before loading trains it and torch's module stays apart.",
        )


def check_load_torch_weights(fn: Callable[..., Any]) -> None:
    """Torch's weights (of widths 6 and 8: an answer that ignores its arguments leaves the
    second module NaN) land in the right projections, copied into the same Parameters."""
    g = generator(3030)
    for d_model in (6, 8):
        what = f"load_torch_weights(ours, theirs) with d_model={d_model}, n_heads=2"
        theirs = randomised(nn.MultiheadAttention(d_model, 2, batch_first=True).eval(), g)
        judge_load(fn, Projections(d_model, 2), theirs, what)

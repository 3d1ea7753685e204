"""Visible checks of lab 04 (the transformer block): layer_norm, FeedForward, EncoderBlock and the
student's LightningModule, TaggingModule (its ``training_step`` and ``configure_optimizers``).

The notebook's visible test cells call the ``check_*`` functions here. No oracle lives in this
module. Each part is declared once (an :class:`~transformer_lab.checks._generated.Ordinary`):
its visible check runs the student's answer on stored worked examples (``fixtures/lab04.json``,
written by ``labs build`` from the hidden oracles: each case's inputs and weights, the expected
output and what each typical mistake returns), and the hidden checks run it on drawn cases. A
module part is built from the case's sizes, given the case's weights and run, in eval mode or in
training mode with dropout drawn from the case's seed. Training mode is judged against PyTorch's
own ops on the same weights (``torch_feed_forward``, ``torch_encoder_block``), whose dropout masks
are drawn from the same seed in the order ``nn.TransformerEncoderLayer`` draws them (attention
output, feed-forward hidden units, feed-forward output), so a dropout in another place gives
another output.

While the student's code runs, what would compute the answer is refused
(:class:`~transformer_lab.judge.bans.Ban`): every normalisation op for ``layer_norm``, PyTorch's
and the kit's encoder layers for the block, and the kit's training modules for ``TaggingModule``.

Attribute names the checks rely on (stated in the notebook): ``FeedForward.linear1``/``linear2``;
``EncoderBlock.self_attn`` (the kit's ``MultiHeadAttention`` with ``q_proj``, ``k_proj``,
``v_proj``, ``out_proj``, or an ``nn.MultiheadAttention(batch_first=True)``), ``.ff``,
``.norm1`` (attention sub-layer), ``.norm2`` (feed-forward sub-layer).

Reference: Prince, *Understanding Deep Learning*, section 12.4; Vaswani et al., "Attention Is
All You Need" (2017), sections 3.1, 5.3 and 5.4; Ba et al., "Layer Normalization" (2016);
Loshchilov & Hutter, "Decoupled Weight Decay Regularization" (2019); Lightning's
``LightningModule`` documentation (``training_step``, ``self.log``, ``configure_optimizers``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab.checks import spec
from transformer_lab.checks._common import (
    Ban,
    Case,
    call_forbidding,
    call_student,
    close,
    expect_close,
    expect_module,
    expect_shape,
    expect_true,
    generator,
    load_weights,
    note_mistake,
    stored,
)
from transformer_lab.checks._generated import Given, Ordinary
from transformer_lab.checks._lightning import (
    Schedule,
    judge_configure_optimizers,
    judge_training_step,
    learning_rates,
    parse_optimizers,
)
from transformer_lab.judge.mirror import portable

__all__ = [
    "ProbeModel",
    "accuracy_on_fresh_data",
    "check_configure_optimizers",
    "check_encoder_block",
    "check_encoder_block_dropout",
    "check_feed_forward",
    "check_layer_norm",
    "check_trained_encoder",
    "check_training_step",
    "held_out_batches",
    "learning_rates",
    "parse_optimizers",
]

IGNORE_INDEX = -100

#: The lab's spec (``specs/lab04.toml``): its bans and shared tolerances.
SPEC = spec.load("04_transformer_block")
LAYER_NORM_BAN = SPEC.ban("layer_norm")
FEED_FORWARD_BAN = SPEC.ban("feed_forward")
BLOCK_BAN = SPEC.ban("block")
MODULE_BAN = SPEC.ban("module")

_LAB = "lab04"


def _example(key: str) -> Tensor:
    """A stored input of a worked example (float64)."""
    return stored(_LAB, key)[0]


@contextlib.contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Run with the global CPU generator at ``seed`` (when given), then restore its state."""
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        yield


# --------------------------------------------------------------------------------------
# layer_norm
# --------------------------------------------------------------------------------------


def _ln_what(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> str:
    shown = "" if eps == 1e-5 else f", eps={eps:g}"
    dtype = "" if x.dtype == torch.float32 else f" ({x.dtype})"
    return f"layer_norm(x, weight, bias{shown}) on x of shape {tuple(x.shape)}{dtype}"


def layer_norm_call(
    fn: Callable[..., Any], x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5
) -> Tensor:
    """The student's ``layer_norm(x, weight, bias[, eps=...])`` under the lab's ban; a tensor of
    ``x``'s shape."""
    what = _ln_what(x, weight, bias, eps)
    got = call_forbidding(
        fn,
        (x.clone(), weight.clone(), bias.clone()),
        {} if eps == 1e-5 else {"eps": eps},
        ban=LAYER_NORM_BAN,
        what=what,
        on_error="Keep the statistics' last dimension (keepdim=True) so that they broadcast "
        "against x.",
    )
    return expect_shape(got, tuple(x.shape), what)


def values_at(atol: float, rtol: float = 1e-4) -> dict[str, Callable[..., Any]]:
    """``same`` and ``describe`` of an :class:`Ordinary` whose outputs are float tensors,
    compared at ``atol`` and ``rtol``; a wrong one is described in ``expect_close``'s words (the
    largest difference and where, NaN or inf where the expected value is finite)."""

    def describe(case: Case[Any]) -> str:
        try:
            expect_close(case.got, case.want, case.what, atol=atol, rtol=rtol)
        except AssertionError as exc:
            return str(exc)
        return f"{case.what} is within the tolerance."  # never shown: the case failed

    return {"same": lambda got, want: close(got, want, atol=atol, rtol=rtol), "describe": describe}


def _from_json(*case: Any) -> tuple[Any, ...]:
    """A case stored as JSON data, back: nested lists as float32 tensors (or bool ones: masks),
    a dict of them as weights, anything else as it is."""

    def back(value: Any) -> Any:
        if isinstance(value, dict):
            return {name: back(item) for name, item in value.items()}
        if not isinstance(value, list):
            return value
        t = torch.tensor(value)
        return t if t.dtype == torch.bool else t.float()

    return tuple(back(value) for value in case)


#: What every part here compares: float tensors (float64 when stored), at the spec's tolerance.
_FLOATS: dict[str, Any] = {
    "load": _from_json,
    "output": lambda out: torch.as_tensor(out, dtype=torch.float64),
    **values_at(SPEC.tol("float32")),
}


#: ``layer_norm(x, weight, bias, eps)``: a case is ``(x, weight, bias, eps)`` (stored: float32).
LAYER_NORM = Ordinary(
    _LAB,
    call=layer_norm_call,
    what=_ln_what,
    rule="For each token: the mean and the biased variance over the last dimension "
    "(keepdim=True), then weight * (x - mean) / sqrt(var + eps) + bias.",
    **_FLOATS,
)
check_layer_norm = LAYER_NORM.visible(
    "check_layer_norm",
    """Worked examples: the rows ``[1, 2, 3, 4]`` and ``[-2, 0, 0, 6]`` with weight 1 and bias 0,
    a 3-D input with a weight and a bias, a 4-D input with ``eps=1e-3``.""",
)


# --------------------------------------------------------------------------------------
# FeedForward
# --------------------------------------------------------------------------------------


def _linear(module: nn.Module, name: str, n_in: int, n_out: int, what: str) -> nn.Linear:
    layer = getattr(module, name, None)
    if not isinstance(layer, nn.Linear):
        raise AssertionError(
            f"{what} has no nn.Linear attribute `{name}`: name the two layers self.linear1 "
            "(d_model -> d_ff) and self.linear2 (d_ff -> d_model) so the checks can read them."
        )
    if (layer.in_features, layer.out_features) != (n_in, n_out):
        raise AssertionError(
            f"{what}.{name} maps {layer.in_features} -> {layer.out_features} features, expected "
            f"{n_in} -> {n_out}: the hidden layer has d_ff units, linear1 is nn.Linear(d_model, "
            "d_ff) and linear2 is nn.Linear(d_ff, d_model)."
        )
    expect_true(
        layer.bias is not None, f"{what}.{name} has no bias: keep nn.Linear's default bias=True."
    )
    return layer


def ff_parts(ff: nn.Module, d_model: int, d_ff: int, what: str) -> tuple[nn.Linear, nn.Linear]:
    """The feed-forward network's two layers, checked: ``(linear1, linear2)``."""
    return _linear(ff, "linear1", d_model, d_ff, what), _linear(ff, "linear2", d_ff, d_model, what)


def build_feed_forward(
    cls: Callable[..., Any], d_model: int, d_ff: int, dropout: float = 0.0
) -> tuple[nn.Module, str]:
    """``cls(d_model, d_ff, dropout=dropout)`` (from a fixed seed), its layers checked."""
    what = f"FeedForward({d_model}, {d_ff}" + (f", dropout={dropout:g})" if dropout else ")")
    with seeded(0):
        ff = expect_module(call_student(cls, d_model, d_ff, dropout=dropout, what=what), what)
    ff_parts(ff, d_model, d_ff, what)
    return ff, what


def _same_each_call(run: Callable[[int], Any], what: str) -> Any:
    """``run(seed)`` for two seeds in eval mode: dropout must be off, so both give one output."""
    first, second = run(1), run(2)
    if (
        isinstance(first, Tensor)
        and isinstance(second, Tensor)
        and first.shape == second.shape
        and not close(first, second)
    ):
        raise AssertionError(
            f"{what} in eval mode gives another output at each call: dropout must switch off in "
            "eval mode. Use nn.Dropout modules (model.eval() switches them off), or "
            "F.dropout(..., training=self.training)."
        )
    return first


def run_module(
    module: nn.Module,
    x: Tensor,
    kwargs: dict[str, Any],
    what: str,
    *,
    ban: Ban,
    training: bool = False,
    seed: int | None = None,
) -> Any:
    """The student's ``module(x, **kwargs)`` under ``ban`` (a block's attention runs without
    its own dropout: :func:`_no_attention_dropout`).

    In training mode dropout draws its masks from ``seed``; in eval mode the call is made twice
    (from two seeds) and must give one output.
    """
    module.train(training)
    shown = "".join(f", {name}" for name, value in kwargs.items() if value is not None)
    call = f"{what}(x{shown}){' in training mode' if training else ''}"

    def once(s: int | None) -> Any:
        with _no_attention_dropout(module), seeded(s), torch.no_grad():
            return call_forbidding(module, (x.clone(),), kwargs, ban=ban, what=call)

    return once(seed) if training else _same_each_call(once, what)


def _layer(w: dict[str, Tensor], name: str, n_in: int, n_out: int, g: torch.Generator) -> None:
    w[f"{name}.weight"] = torch.randn(n_out, n_in, generator=g) / math.sqrt(n_in)
    w[f"{name}.bias"] = 0.2 * torch.randn(n_out, generator=g)


def random_weights(
    d_model: int, d_ff: int, g: torch.Generator, *, block: bool = False, norms: bool = True
) -> dict[str, Tensor]:
    """Random float32 weights of a ``FeedForward(d_model, d_ff)`` (``linear1.weight``...) or,
    with ``block``, of an ``EncoderBlock(d_model, ., d_ff)`` in the kit's layout
    (``self_attn.q_proj.weight``, ``ff.linear1.weight``, ``norm1.weight``...); the norms' gains
    and shifts are far from 1 and 0 (a swapped or unused norm shows), or with ``norms=False``
    they are 1 and 0, as ``nn.LayerNorm`` starts."""
    w: dict[str, Tensor] = {}
    prefix = "ff." if block else ""
    if block:
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            _layer(w, f"self_attn.{name}", d_model, d_model, g)
    _layer(w, f"{prefix}linear1", d_model, d_ff, g)
    _layer(w, f"{prefix}linear2", d_ff, d_model, g)
    for name in ("norm1", "norm2") if block else ():
        w[f"{name}.weight"] = 1.0 + 0.5 * torch.randn(d_model, generator=g) * norms
        w[f"{name}.bias"] = 0.5 * torch.randn(d_model, generator=g) * norms
    return w


def _mode(train: Any) -> str:
    seed = train[0] if isinstance(train, tuple | list) else train
    return "" if train is None else f" in training mode (dropout masks drawn from seed {seed})"


def _ff_what(d_ff: int, p: float, weights: Any, x: Tensor, seed: int | None) -> str:
    shown = f", dropout={p:g}" if p else ""
    dtype = "" if x.dtype == torch.float32 else f" ({x.dtype})"
    return (
        f"FeedForward({x.shape[-1]}, {d_ff}{shown})(x) on x of shape {tuple(x.shape)}{dtype}"
        f"{_mode(seed)}"
    )


def _ff_call(
    cls: Callable[..., Any], d_ff: int, p: float, weights: Any, x: Tensor, seed: int | None
) -> Tensor:
    """The student's FeedForward built for the case, the case's weights loaded, run on ``x``
    (in training mode with dropout drawn from ``seed``, or in eval mode)."""
    ff, what = build_feed_forward(cls, x.shape[-1], d_ff, p)
    load_weights(ff, weights, what)
    if x.dtype == torch.float64:
        ff.double()
    training = seed is not None
    got = run_module(ff, x, {}, what, ban=FEED_FORWARD_BAN, training=training, seed=seed)
    return expect_shape(got, tuple(x.shape), _ff_what(d_ff, p, weights, x, seed))


#: ``FeedForward``: a case is ``(d_ff, dropout, weights, x, seed)``, ``seed`` ``None`` in eval
#: mode; the student's module is built, given the case's weights and run.
FEED_FORWARD = Ordinary(
    _LAB,
    call=_ff_call,
    what=_ff_what,
    rule="Expected linear2(relu(linear1(x))), every token on its own; in training mode one "
    "nn.Dropout on the hidden units (d_ff wide, after the ReLU, before linear2), none in eval "
    "mode.",
    **_FLOATS,
)


def torch_feed_forward(
    d_ff: int, p: float, w: Mapping[str, Tensor], x: Tensor, seed: int | None
) -> Tensor:
    """PyTorch's computation on a case: ``linear2(dropout(relu(linear1(x))))``, the mask drawn
    from ``seed`` in training mode, as ``nn.TransformerEncoderLayer`` draws it."""
    with seeded(seed), torch.no_grad():
        hidden = F.relu(F.linear(x, w["linear1.weight"], w["linear1.bias"]))  # (..., F)
        hidden = F.dropout(hidden, p, training=seed is not None)
        return F.linear(hidden, w["linear2.weight"], w["linear2.bias"])  # (..., D)


#: A module whose dropout never acts (no dropout, or none in training mode).
EVAL_IN_TRAINING = (
    "It gives the output of eval mode in training mode: dropout never acts. Apply nn.Dropout "
    "modules in forward (they act in training mode only)."
)


#: A feed-forward network that drops its output instead of its hidden units.
ON_OUTPUT = (
    "It matches dropout on the output of linear2: FeedForward drops hidden units (d_ff wide, "
    "after the ReLU, before linear2); the block drops the output."
)


def _ff_dropout_mistakes(
    d_ff: int, p: float, w: Mapping[str, Tensor], x: Tensor, seed: int
) -> dict[str, Tensor]:
    """What a FeedForward without dropout, or with dropout on its output, gives in training."""
    good = torch_feed_forward(d_ff, p, w, x, None)
    with seeded(seed):
        return {EVAL_IN_TRAINING: good, ON_OUTPUT: F.dropout(good, p)}


def check_feed_forward(cls: Callable[..., nn.Module]) -> None:
    """Layer names and sizes, stored worked examples in eval mode, then training mode against
    PyTorch's computation on the same weights (dropout drawn from one seed)."""
    FEED_FORWARD.judge(cls, FEED_FORWARD.examples("check_feed_forward"))
    g = generator(2)
    case = (32, 0.5, random_weights(8, 32, g), torch.randn(2, 5, 8, generator=g), 7)
    FEED_FORWARD.judge(cls, [Given(case)], torch_feed_forward, _ff_dropout_mistakes)


# --------------------------------------------------------------------------------------
# EncoderBlock
# --------------------------------------------------------------------------------------


#: norm1 and norm2 one module (``self.norm2 = self.norm1``), which the judge mirrors as such.
SHARED_NORM = (
    "one and the same LayerNorm (an alias, as self.norm2 = self.norm1 makes): each sub-layer "
    "needs its own nn.LayerNorm(d_model), with its own weight and bias."
)


def build_block(
    cls: Callable[..., Any],
    d_model: int,
    n_heads: int,
    d_ff: int,
    *,
    norm_first: bool,
    dropout: float = 0.0,
) -> tuple[nn.Module, str]:
    """``cls(d_model, n_heads, d_ff, dropout=..., norm_first=...)`` (from a fixed seed), its
    sub-layers checked against the attribute names of the notebook (:func:`load_weights`
    checks the rest: each weight's name and shape)."""
    what = f"EncoderBlock({d_model}, {n_heads}, {d_ff}" + (
        f", dropout={dropout:g}" if dropout else ""
    )
    what += ", norm_first=True)" if norm_first else ")"
    with seeded(0):
        block = call_student(
            cls, d_model, n_heads, d_ff, dropout=dropout, norm_first=norm_first, what=what
        )
    expect_module(block, what)
    missing = [n for n in ("self_attn", "ff", "norm1", "norm2") if not hasattr(block, n)]
    if missing:
        raise AssertionError(
            f"{what} has no attribute(s) {', '.join(missing)}: the checks read self.self_attn "
            "(MultiHeadAttention), self.ff (your FeedForward, with linear1 and linear2), "
            "self.norm1 (the attention sub-layer's norm) and self.norm2 (the feed-forward's)."
        )
    if block.norm1 is block.norm2:
        note_mistake(SHARED_NORM)
        raise AssertionError(f"{what}.norm1 and {what}.norm2 are {SHARED_NORM}")
    expect_true(
        getattr(block.self_attn, "batch_first", True),
        f"{what}.self_attn is nn.MultiheadAttention without batch_first=True: the block's "
        "input is (B, T, D).",
    )
    ff_parts(block.ff, d_model, d_ff, f"{what}.ff")
    return block, what


def sequence_first(cls: Callable[..., Any]) -> bool:
    """Whether the student's block attends with ``nn.MultiheadAttention(batch_first=True)``,
    whose output is a ``(T, B, D)`` tensor seen as ``(B, T, D)``: dropout draws its mask in
    memory order, so the attention output's dropout mask is drawn in that order."""
    block, _ = build_block(cls, 4, 1, 4, norm_first=False)
    return isinstance(block.self_attn, nn.MultiheadAttention)


@contextlib.contextmanager
def _no_attention_dropout(module: nn.Module) -> Iterator[None]:
    """Switch off dropout inside a block's attention module (on its weights) while it runs.

    Dropout on the attention weights is the attention module's business (lab 03); these checks
    test the block's own dropout, on each sub-layer's output and in the feed-forward network.
    """
    saved: list[tuple[Any, str, float]] = []
    attn = getattr(module, "self_attn", None)
    if attn is None:  # a feed-forward network
        yield
        return
    for sub in attn.modules():
        if isinstance(sub, nn.Dropout):
            saved.append((sub, "p", sub.p))
            sub.p = 0.0
    value = getattr(attn, "dropout", None)
    if isinstance(value, float) and value != 0.0:  # (a judged module's write is a request)
        saved.append((attn, "dropout", value))
        attn.dropout = 0.0
    try:
        yield
    finally:
        for owner, name, old in saved:
            setattr(owner, name, old)


class BlockCase(NamedTuple):
    """One case of the block's checks: the arguments the student's class is judged on."""

    n_heads: int
    d_ff: int
    norm_first: bool
    p: float  # the block's dropout
    w: Mapping[str, Tensor]  # weights in the kit's layout (see random_weights)
    x: Tensor  # (B, T, D)
    mask: Tensor | None  # (B, 1, 1, T) or (B, 1, T, T), True where a key may be attended to
    train: tuple[int, bool] | None  # None in eval mode, else (seed, sequence_first(cls))


def _block_what(*case: Any) -> str:
    c = BlockCase(*case)
    shown = (f", dropout={c.p:g}" if c.p else "") + (", norm_first=True" if c.norm_first else "")
    dtype = "" if c.x.dtype == torch.float32 else f" ({c.x.dtype})"
    call = f"x{'' if c.mask is None else ', mask'}"
    return (
        f"EncoderBlock({c.x.shape[-1]}, {c.n_heads}, {c.d_ff}{shown})({call}) on x of shape "
        f"{tuple(c.x.shape)}{dtype}{_mode(c.train)}"
    )


def _block_call(cls: Callable[..., Any], *case: Any) -> Tensor:
    """The student's block built for the case, the case's weights loaded, run on ``x`` (in
    training mode with dropout drawn from ``train[0]``, or in eval mode)."""
    c = BlockCase(*case)
    d = c.x.shape[-1]
    block, what = build_block(cls, d, c.n_heads, c.d_ff, norm_first=c.norm_first, dropout=c.p)
    load_weights(block, c.w, what)
    if c.x.dtype == torch.float64:
        block.double()
    seed = None if c.train is None else c.train[0]
    training = c.train is not None
    kwargs = {"mask": c.mask}
    got = run_module(block, c.x, kwargs, what, ban=BLOCK_BAN, training=training, seed=seed)
    return expect_shape(got, tuple(c.x.shape), _block_what(*case))


def _form(case: Case[Given]) -> str:
    if BlockCase(*case.input.args).norm_first:
        return (
            "Expected pre-norm: x = x + self_attn(norm1(x)), then x = x + ff(norm2(x)) (each "
            "sub-layer reads a normalised copy; the residual path itself is never normalised)."
        )
    return (
        "Expected post-norm ('Add & Norm'): x = norm1(x + self_attn(x)), then x = norm2(x + ff(x))."
    )


#: ``EncoderBlock``: a case is a :class:`BlockCase`.
BLOCK = Ordinary(
    _LAB,
    call=_block_call,
    what=_block_what,
    rule=_form,
    **_FLOATS,
)


def check_encoder_block(cls: Callable[..., nn.Module]) -> None:
    """Attribute names; stored worked examples in eval mode, post-norm (two sizes, with and
    without a padding mask), then pre-norm, each form diagnosed on its own."""
    examples = BLOCK.examples("check_encoder_block")
    for norm_first in (False, True):
        BLOCK.judge(cls, [e for e in examples if BlockCase(*e.args).norm_first == norm_first])


def torch_encoder_block(*case: Any) -> Tensor:
    """``nn.TransformerEncoderLayer``'s computation on a case, in PyTorch's ops.

    Post-norm: ``x = norm1(x + dropout(attn(x))); x = norm2(x + dropout(ff(x)))``; pre-norm:
    ``x = x + dropout(attn(norm1(x))); x = x + dropout(ff(norm2(x)))``; ``ff`` drops its hidden
    units too. In training mode the three masks are drawn from ``train[0]`` in the order torch's
    layer draws them (attention output, hidden units, output).
    """
    n_heads, _, norm_first, p, w, x, mask, train = BlockCase(*case)
    seed, seq_first = (None, False) if train is None else train
    B, T, D = x.shape

    def linear(name: str, h: Tensor) -> Tensor:
        return F.linear(h, w[f"{name}.weight"], w[f"{name}.bias"])

    def attention(h: Tensor) -> Tensor:
        q, k, v = (
            linear(f"self_attn.{n}_proj", h).reshape(B, T, n_heads, -1).transpose(1, 2)
            for n in "qkv"
        )  # (B, H, T, Dh)
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, Dh)
        out = linear("self_attn.out_proj", heads.transpose(1, 2).reshape(B, T, D))
        if seq_first:  # drawn on the (T, B, D) layout nn.MultiheadAttention returns
            out = out.transpose(0, 1).contiguous().transpose(0, 1)
        return F.dropout(out, p, training=seed is not None)

    def feed_forward(h: Tensor) -> Tensor:
        hidden = F.dropout(F.relu(linear("ff.linear1", h)), p, training=seed is not None)
        return F.dropout(linear("ff.linear2", hidden), p, training=seed is not None)

    def norm(i: int, h: Tensor) -> Tensor:
        return F.layer_norm(h, (D,), w[f"norm{i}.weight"], w[f"norm{i}.bias"])

    with seeded(seed), torch.no_grad():
        if norm_first:
            x = x + attention(norm(1, x))
            return x + feed_forward(norm(2, x))
        x = norm(1, x + attention(x))
        return norm(2, x + feed_forward(x))


def check_encoder_block_dropout(cls: Callable[..., nn.Module]) -> None:
    """Training mode (post- and pre-norm): dropout where ``nn.TransformerEncoderLayer`` puts it,
    masks drawn from one seed, against PyTorch's computation on the same weights."""
    g = generator(5)
    keep = torch.arange(6)[None, :] < torch.tensor([6, 4])[:, None]  # (B, T)
    mask = keep[:, None, None, :]  # (B, 1, 1, T)
    w, x = random_weights(8, 32, g, block=True, norms=False), torch.randn(2, 6, 8, generator=g)
    cases = [(2, 32, norm_first, 0.5, w, x, mask) for norm_first in (False, True)]
    BLOCK.judge(cls, [Given((*case, None)) for case in cases], torch_encoder_block)
    train = (11, sequence_first(cls))
    trained = [Given((*case, train)) for case in cases]
    BLOCK.judge(
        cls,
        trained,
        torch_encoder_block,
        lambda *case: {EVAL_IN_TRAINING: torch_encoder_block(*case[:-1], None)},
    )


# --------------------------------------------------------------------------------------
# TaggingModule: training_step
# --------------------------------------------------------------------------------------


def build_module(cls: Callable[..., Any], model: nn.Module, **hparams: Any) -> Any:
    """``cls(model, **hparams)``: the student's LightningModule around a given model."""
    shown = ", ".join(f"{k}={v!r}" for k, v in hparams.items())
    what = f"TaggingModule(model, {shown})"
    module = expect_module(call_student(cls, model, what=what, **hparams), what)
    for method in ("training_step", "configure_optimizers", "log"):
        expect_true(
            callable(getattr(module, method, None)),
            f"{what} has no method {method}: TaggingModule is a LightningModule (class "
            "TaggingModule(L.LightningModule)).",
        )
    return module


#: What a wrong loss is told: lab 04's loss, the cross-entropy of the real tokens.
LOSS_HINT = (
    "Expected the cross-entropy averaged over the real tokens only: model(tokens, "
    "padding_mask) gives logits (B, T, C); flatten them to (B*T, C) and the targets to "
    "(B*T,), and let F.cross_entropy ignore the targets -100."
)


@portable  # rebuilt in the kernel: the student's loss on its logits keeps its graph there
class _StoredTagger(nn.Module):
    """A stand-in model whose logits are stored, so that the expected loss is a stored number.

    It returns ``logits`` when called with a padding mask, and ``unmasked`` when called without
    (what the model computes when padding is not hidden from attention).
    """

    def __init__(self, logits: Tensor, unmasked: Tensor) -> None:
        super().__init__()
        self.logits = nn.Parameter(logits.float())
        self.unmasked = nn.Parameter(unmasked.float())

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        return (self.logits if padding_mask is not None else self.unmasked) * 1.0  # (B, T, C)


def _stored_batch() -> dict[str, Tensor]:
    key = "training_step batch"
    return {
        "tokens": _example(f"{key} tokens").long(),
        "padding_mask": _example(f"{key} padding_mask").bool(),
        "targets": _example(f"{key} targets").long(),
    }


def training_step_check(
    cls: Callable[..., Any],
    model: nn.Module,
    batch: dict[str, Tensor],
    expected: Tensor,
    mistakes: Mapping[str, Tensor],
) -> Tensor:
    """``training_step`` of ``cls(model, ...)`` on ``batch``: the loss (``expected``, a
    catalogued wrong loss named), its graph, what is logged (:func:`judge_training_step`,
    shared with lab 06); returns the loss it returned."""
    module = build_module(cls, model, lr=0.01, weight_decay=0.1, warmup_steps=4, total_steps=12)
    return judge_training_step(
        module,
        batch,
        ban=MODULE_BAN,
        expected=expected,
        mistakes=[(wrong, hint) for hint, wrong in mistakes.items()],
        hint=LOSS_HINT,
    )


def check_training_step(cls: Callable[..., Any]) -> None:
    """``training_step`` on a stored batch with padding: the loss, its graph, what is logged."""
    model = _StoredTagger(
        _example("training_step logits (3, 5, 6)"),
        _example("training_step logits without padding_mask (3, 5, 6)"),
    )
    training_step_check(cls, model, _stored_batch(), *stored(_LAB, "training_step loss"))


# --------------------------------------------------------------------------------------
# TaggingModule: configure_optimizers
# --------------------------------------------------------------------------------------


@portable
class ProbeModel(nn.Module):
    """A small tagging model with every kind of parameter (an embedding, a layer norm, linear
    layers with and without bias) whose logits depend on the tokens and on the padding mask:
    each token sees the mean of the real tokens of its sequence (all tokens without a mask)."""

    def __init__(self, vocab_size: int = 7, d_model: int = 4, num_classes: int = 5) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.mix = nn.Linear(d_model, d_model, bias=False)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        h = self.norm(self.embed(tokens))  # (B, T, D)
        real = torch.ones_like(tokens) if padding_mask is None else padding_mask
        real = real.to(h.dtype)[..., None]  # (B, T, 1)
        context = (h * real).sum(1, keepdim=True) / real.sum(1, keepdim=True).clamp(min=1.0)
        return self.head(torch.tanh(self.mix(h + 2.0 * context)))  # (B, T, C)


def optimizers_check(
    cls: Callable[..., Any],
    model: nn.Module,
    schedule: Schedule,
    weight_decay: float,
    expected: Tensor,
    mistakes: Mapping[str, Tensor],
) -> None:
    """``configure_optimizers`` of ``cls(model, lr=..., weight_decay=..., warmup_steps=...,
    total_steps=...)``: AdamW's two groups and the exact rates (``expected``, a catalogued wrong
    schedule named), stepped per step (:func:`judge_configure_optimizers`, shared with lab 06)."""
    lr, warmup_steps, total_steps = schedule
    module = build_module(
        cls,
        model,
        lr=lr,
        weight_decay=weight_decay,
        warmup_steps=warmup_steps,
        total_steps=total_steps,
    )
    judge_configure_optimizers(
        module,
        model,
        schedule,
        ban=MODULE_BAN,
        weight_decay=weight_decay,
        expected=expected,
        mistakes=[(rates, hint) for hint, rates in mistakes.items()],
    )


def check_configure_optimizers(cls: Callable[..., Any]) -> None:
    """AdamW with two parameter groups and the warm-up + cosine schedule, stepped per step."""
    with seeded(0):
        model = ProbeModel()
    schedule = Schedule(lr=0.01, warmup_steps=4, total_steps=12)
    want, mistakes = stored(_LAB, f"configure_optimizers learning rates {schedule}")
    optimizers_check(cls, model, schedule, 0.1, want, mistakes)


# --------------------------------------------------------------------------------------
# the trained encoder
# --------------------------------------------------------------------------------------


@torch.no_grad()
def accuracy_on_fresh_data(model: nn.Module, batches: Sequence[dict[str, Tensor]]) -> float:
    """Token accuracy of a tagging model on ``batches`` of tokens, padding_mask and targets
    of one length (:func:`held_out_batches`); positions whose target is ``-100`` do not count."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    predicted = [
        model(b["tokens"].to(device), b["padding_mask"].to(device)).argmax(-1).cpu()  # (b, T)
        for b in batches
    ]
    model.train(was_training)
    targets = torch.cat([b["targets"] for b in batches])  # (N, T)
    scored = targets != IGNORE_INDEX
    if not bool(scored.any()):
        raise ValueError("accuracy_on_fresh_data got batches without any scored target")
    return float((torch.cat(predicted)[scored] == targets[scored]).double().mean())


def held_out_batches(
    task: str = "sort",
    *,
    seq_len: int = 8,
    min_len: int | None = 4,
    num_symbols: int = 10,
    n: int = 512,
    batch_size: int = 128,
    seed: int = 2024,
) -> list[dict[str, Tensor]]:
    """Fresh tagging batches of a synthetic task, from a seed no training split uses.

    Returns:
        ``ceil(n / batch_size)`` dicts with ``tokens``, ``padding_mask``, ``targets`` ``(b, T)``.
    """
    from transformer_lab.data.synthetic import make_task

    data = make_task(
        task,
        n,
        format="tagging",
        generator=torch.Generator().manual_seed(seed),
        seq_len=seq_len,
        num_symbols=num_symbols,
        min_len=min_len,
    )
    return [{k: v[i : i + batch_size] for k, v in data.items()} for i in range(0, n, batch_size)]


def check_trained_encoder(
    model: nn.Module,
    block_cls: type,
    *,
    min_accuracy: float,
    task: str = "sort",
    seq_len: int = 8,
    min_len: int | None = 4,
    num_symbols: int = 10,
) -> float:
    """The trained encoder is built from the student's blocks and is accurate on new data.

    Args:
        model: the trained ``EncoderClassifier`` (token head).
        block_cls: the student's ``EncoderBlock`` class; the model must contain its blocks.
        min_accuracy: token accuracy the model must reach on sequences it has never seen.
        task, seq_len, min_len, num_symbols: the task the notebook trains on.

    Returns:
        The measured token accuracy.
    """
    expect_true(
        isinstance(model, nn.Module),
        f"`model` should be your trained EncoderClassifier, got {type(model).__name__}: did the "
        "training cell run?",
    )
    expect_true(
        any(isinstance(m, block_cls) for m in model.modules()),
        "your model contains none of your EncoderBlocks: build it with "
        "EncoderClassifier(config, blocks=[EncoderBlock(...) for _ in range(n_layers)]).",
    )
    batches = held_out_batches(task, seq_len=seq_len, min_len=min_len, num_symbols=num_symbols)
    try:
        acc = accuracy_on_fresh_data(model, batches)
    except Exception as exc:
        raise AssertionError(
            f"running your model on new {task} sequences raised {type(exc).__name__}: {exc}"
        ) from exc
    expect_true(
        acc >= min_accuracy,
        f"your encoder reaches {acc:.1%} token accuracy on new {task} sequences, expected at least "
        f"{min_accuracy:.0%}: check that the training cell ran to the end, that your blocks and "
        "TaggingModule pass their checks, and that the mask reaches self_attn.",
    )
    return acc

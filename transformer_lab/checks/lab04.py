"""Self-checks for lab 04, the transformer block.

The notebook's test cells call these functions on the student's ``layer_norm``, ``FeedForward``
and ``EncoderBlock``. Visible checks (``check_<name>``) test shapes and one small worked example;
hidden checks (``hidden_check_<name>_...``) use seeded random sizes and compare against PyTorch's
own ``F.layer_norm`` and ``nn.TransformerEncoderLayer(batch_first=True, dropout=0)`` with the
student's weights copied in. When an answer is wrong, the check recomputes the typical wrong
answers (normalising over the wrong axis, ``eps`` outside the square root, a missing residual, the
norm in the wrong place, an ignored mask, ...) and names the one the student's output matches.

Weight layout the checks rely on (stated in the notebook):

* ``FeedForward`` has ``linear1: nn.Linear(d_model, d_ff)`` and
  ``linear2: nn.Linear(d_ff, d_model)``, with a ReLU between them (as in
  ``nn.TransformerEncoderLayer``).
* ``EncoderBlock`` has ``self_attn`` (the package's ``MultiHeadAttention`` with ``q_proj``,
  ``k_proj``, ``v_proj``, ``out_proj``, or an ``nn.MultiheadAttention(batch_first=True)``), ``ff``
  (a ``FeedForward``), ``norm1`` (the norm of the attention sublayer) and ``norm2`` (the norm of
  the feed-forward sublayer), each norm with ``weight`` and ``bias`` of shape ``(D,)``.
  :func:`load_torch_encoder_layer` copies a torch layer onto such a block.

Reference: Prince, *Understanding Deep Learning*, section 12.4 (the transformer layer); Vaswani
et al., "Attention Is All You Need" (2017), section 3.1; Xiong et al., "On Layer Normalization in
the Transformer Architecture" (2020) for pre-norm.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab.checks._common import (
    Ban,
    call_student,
    close,
    compare,
    expect_module,
    expect_shape,
    forbidden,
    generator,
    randint,
)

__all__ = [
    "accuracy_on_fresh_data",
    "check_encoder_block",
    "check_feed_forward",
    "check_layer_norm",
    "check_trained_encoder",
    "held_out_batches",
    "hidden_check_encoder_block_mask",
    "hidden_check_encoder_block_post_norm",
    "hidden_check_encoder_block_pre_norm",
    "hidden_check_feed_forward",
    "hidden_check_feed_forward_dropout",
    "hidden_check_layer_norm",
    "hidden_check_layer_norm_numerics",
    "load_torch_encoder_layer",
    "torch_encoder_layer",
]

# What a graded function may not use while the checks run it.
_LAYER_NORM_BAN = Ban(
    ops=("normalization",),
    functions=("transformer_lab.blocks.layer_norm", "transformer_lab.blocks.LayerNorm"),
    reason="layer_norm must compute the statistics itself",
)
_FEED_FORWARD_BAN = Ban(
    functions=("transformer_lab.blocks.FeedForward",),
    reason="write the feed-forward layer yourself",
)
_BLOCK_BAN = Ban(
    functions=(
        "torch.nn.TransformerEncoderLayer",
        "torch.nn.TransformerEncoder",
        "transformer_lab.blocks.EncoderBlock",
    ),
    ops=("_transformer_encoder_layer_fwd",),
    reason="build the block from its sublayers yourself",
)


# --------------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------------


def _max_err(a: Tensor, b: Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max())


def _randn(*shape: int, g: torch.Generator, scale: float = 1.0, shift: float = 0.0) -> Tensor:
    return torch.randn(*shape, generator=g) * scale + shift


def _instantiate(cls: Callable[..., Any], *args: Any, what: str, **kwargs: Any) -> nn.Module:
    return expect_module(call_student(cls, *args, what=what, **kwargs), what)


# --------------------------------------------------------------------------------------------------
# layer_norm
# --------------------------------------------------------------------------------------------------


def _ln_variants(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> list[tuple[Tensor, str]]:
    """Outputs of the typical wrong layer norms on ``x``, each with what to fix."""
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    out: list[tuple[Tensor, str]] = []
    out.append(
        (
            (x - mean) / torch.sqrt(var + eps),
            "It matches the normalised x without the learned scale and shift: "
            "multiply by weight and add bias at the end (weight * x_hat + bias).",
        )
    )
    out.append(
        (
            (x - mean) / torch.sqrt(var + eps) * weight,
            "It matches weight * x_hat without the bias: add bias at the end.",
        )
    )
    out.append(
        (
            (x - mean) / torch.sqrt(var + eps) + bias,
            "It matches x_hat + bias without the weight: multiply by weight before adding bias.",
        )
    )
    out.append(
        (
            ((x - mean) / torch.sqrt(var + eps) + bias) * weight,
            "It matches (x_hat + bias) * weight: scale first, then shift (weight * x_hat + bias).",
        )
    )
    if x.shape[-1] > 1:
        unbiased = x.var(-1, unbiased=True, keepdim=True)
        out.append(
            (
                (x - mean) / torch.sqrt(unbiased + eps) * weight + bias,
                "It matches the unbiased variance (dividing by D - 1): layer norm uses the "
                "biased variance, the mean of the squared deviations (divide by D, or "
                "unbiased=False / correction=0).",
            )
        )
    out.append(
        (
            (x - mean) / (torch.sqrt(var) + eps) * weight + bias,
            "It matches (x - mean) / (sqrt(var) + eps): eps belongs inside the square root, "
            "(x - mean) / sqrt(var + eps).",
        )
    )
    out.append(
        (
            (x - mean) / (var + eps) * weight + bias,
            "It matches dividing by the variance: divide by the standard deviation "
            "sqrt(var + eps) instead.",
        )
    )
    out.append(
        (
            x / torch.sqrt(var + eps) * weight + bias,
            "It matches x / sqrt(var + eps): subtract the mean before dividing.",
        )
    )
    for dim in range(x.dim() - 1):
        if x.shape[dim] < 2:
            continue
        m = x.mean(dim, keepdim=True)
        v = x.var(dim, unbiased=False, keepdim=True)
        out.append(
            (
                (x - m) / torch.sqrt(v + eps) * weight + bias,
                f"It matches normalising over dim={dim} of the input: layer norm takes the mean "
                "and variance of each token over its features, the last dimension "
                "(dim=-1, keepdim=True).",
            )
        )
    if x.dim() > 1:
        m = x.mean()
        v = x.var(unbiased=False)
        out.append(
            (
                (x - m) / torch.sqrt(v + eps) * weight + bias,
                "It matches normalising with one mean and variance over the whole tensor: take "
                "them per token, over the last dimension only (dim=-1, keepdim=True).",
            )
        )
    return out


_LN_HINT = (
    "Compute, for each token, mean and biased variance over the last dimension (keepdim=True), "
    "then weight * (x - mean) / sqrt(var + eps) + bias."
)


def _expect_layer_norm(
    fn: Callable[..., Tensor], x: Tensor, weight: Tensor, bias: Tensor, eps: float, what: str
) -> None:
    expected = F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    candidates = _ln_variants(x, weight, bias, eps)
    with forbidden(_LAYER_NORM_BAN):
        actual = call_student(fn, x.clone(), weight.clone(), bias.clone(), eps=eps, what=what)
    compare(actual, expected, what=what, candidates=candidates, hint=_LN_HINT)


def check_layer_norm(fn: Callable[..., Tensor]) -> None:
    """Visible check of ``layer_norm(x, weight, bias, eps=1e-5)``: a worked example and shapes."""
    # Worked example: the row (1, 2, 3, 4) has mean 2.5 and biased variance 1.25.
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-2.0, 0.0, 0.0, 6.0]])
    ones, zeros = torch.ones(4), torch.zeros(4)
    actual = call_student(fn, x.clone(), ones, zeros, what="layer_norm(x, ones, zeros)")
    expect_shape(actual, (2, 4), "layer_norm(x, ones, zeros) for x of shape (2, 4)")
    first = torch.tensor([-1.5, -0.5, 0.5, 1.5]) / math.sqrt(1.25 + 1e-5)
    compare(
        actual[0],
        first,
        what="layer_norm of the row (1, 2, 3, 4) with weight 1 and bias 0",
        candidates=[(t[0], h) for t, h in _ln_variants(x, ones, zeros, 1e-5)],
        hint="Expected (x - 2.5) / sqrt(1.25 + eps): mean 2.5, biased variance 1.25.",
    )
    _expect_layer_norm(fn, x, ones, zeros, 1e-5, "layer_norm(x, ones, zeros) on a (2, 4) input")

    # Batched input: every token is normalised on its own, over its features.
    g = generator(4)
    x3 = _randn(2, 3, 5, g=g, scale=3.0, shift=1.0)
    out = call_student(
        fn, x3.clone(), torch.ones(5), torch.zeros(5), what="layer_norm on (2, 3, 5)"
    )
    expect_shape(out, (2, 3, 5), "layer_norm(x) for x of shape (2, 3, 5)")
    row_means = out.detach().mean(-1)
    if not close(row_means, torch.zeros(2, 3), atol=1e-4, rtol=0):
        raise AssertionError(
            f"with weight 1 and bias 0, each token of your output should have mean 0 over its "
            f"features, but the means go up to {float(row_means.abs().max()):.3g}: normalise over "
            "the last dimension (dim=-1, keepdim=True)."
        )
    _expect_layer_norm(
        fn, x3, torch.ones(5), torch.zeros(5), 1e-5, "layer_norm on a (2, 3, 5) input"
    )

    # The learned scale and shift.
    weight, bias = (
        torch.tensor([2.0, 1.0, 0.5, -1.0, 3.0]),
        torch.tensor([0.5, 0.0, -1.0, 2.0, 0.1]),
    )
    _expect_layer_norm(fn, x3, weight, bias, 1e-5, "layer_norm with a weight and a bias")


def hidden_check_layer_norm(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Hidden check: random shapes, weights and biases against ``F.layer_norm``."""
    g = generator(seed)
    for trial in range(3):
        d = int(torch.randint(2, 17, (1,), generator=g))
        shape: tuple[int, ...] = ((int(torch.randint(1, 5, (1,), generator=g)),), (3,), (2, 4))[
            trial
        ]
        x = _randn(*shape, d, g=g, scale=float(torch.rand(1, generator=g)) * 4 + 0.5, shift=2.0)
        weight = _randn(d, g=g)
        bias = _randn(d, g=g)
        _expect_layer_norm(
            fn, x, weight, bias, 1e-5, f"layer_norm on an input of shape {(*shape, d)}"
        )


def hidden_check_layer_norm_numerics(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Hidden check: eps inside the root, constant tokens, biased variance, large offsets."""
    g = generator(seed)
    # A large eps and small spread tell eps inside the square root from eps outside it.
    x = _randn(3, 6, g=g, scale=0.3)
    weight, bias = _randn(6, g=g), _randn(6, g=g)
    _expect_layer_norm(fn, x, weight, bias, 0.5, "layer_norm with eps=0.5")
    # Two features: the biased and the unbiased variance differ by a factor of two.
    x2 = _randn(4, 2, g=g, scale=2.0)
    _expect_layer_norm(fn, x2, torch.ones(2), torch.zeros(2), 1e-5, "layer_norm with D=2")
    # A constant token has zero variance: the output must be the bias, not NaN.
    const = torch.full((2, 5), 3.0)
    b5 = _randn(5, g=g)
    _expect_layer_norm(fn, const, _randn(5, g=g), b5, 1e-5, "layer_norm of a constant token")
    # Centre before squaring: E[x^2] - E[x]^2 loses every digit when the mean is large.
    big = _randn(3, 16, g=g) + 3000.0
    expected = F.layer_norm(big, (16,), None, None, 1e-5)
    with forbidden(_LAYER_NORM_BAN):
        actual = call_student(
            fn,
            big.clone(),
            torch.ones(16),
            torch.zeros(16),
            eps=1e-5,
            what="layer_norm of tokens around 3000",
        )
    compare(
        actual,
        expected,
        what="layer_norm of tokens whose features are around 3000 (spread 1)",
        atol=1e-2,  # float32 keeps ~4 digits of the spread here; raw moments keep none
        hint="Compute the variance from the centred values, ((x - mean) ** 2).mean(-1): "
        "mean(x ** 2) - mean(x) ** 2 cancels catastrophically in float32 when the mean is large.",
    )


# --------------------------------------------------------------------------------------------------
# FeedForward
# --------------------------------------------------------------------------------------------------


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
    if layer.bias is None:
        raise AssertionError(f"{what}.{name} has no bias: keep nn.Linear's default bias=True.")
    return layer


def _ff_parts(ff: nn.Module, d_model: int, d_ff: int, what: str) -> tuple[nn.Linear, nn.Linear]:
    return _linear(ff, "linear1", d_model, d_ff, what), _linear(ff, "linear2", d_ff, d_model, what)


def _ff_variants(
    l1: nn.Linear, l2: nn.Linear, x: Tensor
) -> tuple[Tensor, list[tuple[Tensor, str]]]:
    with torch.no_grad():
        h = l1(x)
        expected = l2(F.relu(h))
        wrong = [
            (
                l2(h),
                "It matches linear2(linear1(x)) with no nonlinearity: two linear layers in a row "
                "are one linear map. Apply ReLU between them.",
            ),
            (
                F.relu(l2(h)),
                "It matches relu(linear2(linear1(x))): the ReLU goes between the layers, "
                "linear2(relu(linear1(x))), not after the second one.",
            ),
            (
                F.relu(l2(F.relu(h))),
                "It has an extra ReLU after linear2: the output is linear2(relu(linear1(x))).",
            ),
            (
                l2(F.gelu(h)),
                "It matches GELU: this lab uses ReLU, as the lecture and "
                "nn.TransformerEncoderLayer do.",
            ),
            (
                x + l2(F.relu(h)),
                "It adds the input x: the residual belongs to the block (EncoderBlock), "
                "FeedForward returns linear2(relu(linear1(x))) only.",
            ),
        ]
    return expected, wrong


_FF_HINT = "Expected linear2(relu(linear1(x))), applied to every token on its own."


def _expect_feed_forward(ff: nn.Module, d_model: int, d_ff: int, x: Tensor, what: str) -> None:
    l1, l2 = _ff_parts(ff, d_model, d_ff, what)
    expected, wrong = _ff_variants(l1, l2, x)
    with forbidden(_FEED_FORWARD_BAN):
        actual = call_student(ff, x.clone(), what=f"{what}(x)")
    compare(
        actual,
        expected,
        what=f"{what}(x) on an input of shape {tuple(x.shape)}",
        candidates=wrong,
        hint=_FF_HINT,
    )


def check_feed_forward(cls: Callable[..., nn.Module]) -> None:
    """Visible check of ``FeedForward(d_model, d_ff, dropout=0.0)``: layers, shapes, one input."""
    torch.manual_seed(0)
    ff = _instantiate(cls, 8, 32, what="FeedForward(8, 32)")
    ff.eval()
    _ff_parts(ff, 8, 32, "FeedForward(8, 32)")
    x = _randn(2, 5, 8, g=generator(1))
    out = call_student(ff, x.clone(), what="FeedForward(8, 32)(x)")
    expect_shape(out, (2, 5, 8), "FeedForward(8, 32)(x) for x of shape (2, 5, 8)")
    _expect_feed_forward(ff, 8, 32, x, "FeedForward(8, 32)")


def hidden_check_feed_forward(cls: Callable[..., nn.Module], seed: int = 0) -> None:
    """Hidden check: random sizes, 2-D and 3-D inputs, tokens processed independently."""
    g = generator(seed)
    for _ in range(2):
        d_model = int(torch.randint(3, 13, (1,), generator=g))
        d_ff = int(torch.randint(5, 40, (1,), generator=g))
        torch.manual_seed(seed)
        ff = _instantiate(cls, d_model, d_ff, what=f"FeedForward({d_model}, {d_ff})")
        ff.eval()
        name = f"FeedForward({d_model}, {d_ff})"
        _expect_feed_forward(ff, d_model, d_ff, _randn(3, 4, d_model, g=g, scale=2.0), name)
        _expect_feed_forward(ff, d_model, d_ff, _randn(6, d_model, g=g, scale=2.0), name)


def hidden_check_feed_forward_dropout(cls: Callable[..., nn.Module], seed: int = 0) -> None:
    """Hidden check: dropout acts in training mode only."""
    g = generator(seed)
    d_model, d_ff = 6, 24
    what = f"FeedForward({d_model}, {d_ff}, dropout=0.5)"
    torch.manual_seed(seed)
    ff = _instantiate(cls, d_model, d_ff, dropout=0.5, what=what)
    l1, l2 = _ff_parts(ff, d_model, d_ff, what)
    x = _randn(4, 8, d_model, g=g)
    expected, _ = _ff_variants(l1, l2, x)
    ff.train()
    torch.manual_seed(seed + 1)
    with forbidden(_FEED_FORWARD_BAN):
        a = call_student(ff, x.clone(), what=f"{what}(x) in training mode").detach()
        b = call_student(ff, x.clone(), what=f"{what}(x) in training mode").detach()
        ff.eval()
        c = call_student(ff, x.clone(), what=f"{what}(x) in eval mode").detach()
    if close(a, b) and close(a, expected):
        raise AssertionError(
            f"{what} in training mode gives the same output as without dropout: store "
            "nn.Dropout(dropout) and apply it in forward (after the ReLU, before linear2)."
        )
    if not close(c, expected):
        raise AssertionError(
            f"{what} in eval mode should equal linear2(relu(linear1(x))) exactly, but it is off by "
            f"up to {_max_err(c, expected):.3g}: use an nn.Dropout module (it switches off in "
            "eval mode), or F.dropout(..., training=self.training)."
        )


# --------------------------------------------------------------------------------------------------
# EncoderBlock
# --------------------------------------------------------------------------------------------------


def torch_encoder_layer(
    d_model: int, n_heads: int, d_ff: int, *, norm_first: bool = False, seed: int = 0
) -> nn.TransformerEncoderLayer:
    """PyTorch's encoder layer (ReLU, no dropout, batch first) with random norms, for comparisons.

    The layer norms get random weights and biases (torch initialises them to ones and zeros,
    which would hide a swapped or unused norm). The layer stays in training mode: with dropout 0
    that changes nothing but keeps torch off its fused inference path, which zeroes padded
    positions.
    """
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(
        d_model, n_heads, d_ff, dropout=0.0, batch_first=True, norm_first=norm_first
    )
    with torch.no_grad():
        for norm in (layer.norm1, layer.norm2):
            norm.weight.copy_(1.0 + 0.5 * torch.randn(d_model))
            norm.bias.copy_(0.5 * torch.randn(d_model))
        # Non-zero projection biases, so that a skipped bias shows.
        layer.self_attn.in_proj_bias.copy_(0.2 * torch.randn(3 * d_model))
        layer.self_attn.out_proj.bias.copy_(0.2 * torch.randn(d_model))
    return layer.train()


def _copy(dst: Any, src: Tensor, name: str) -> None:
    if not isinstance(dst, Tensor):
        raise AssertionError(
            f"your EncoderBlock has no tensor `{name}`: see the notebook for the attribute names "
            "the checks expect (self_attn, ff.linear1, ff.linear2, norm1, norm2)."
        )
    if dst.shape != src.shape:
        raise AssertionError(
            f"`{name}` in your EncoderBlock has shape {tuple(dst.shape)}, expected "
            f"{tuple(src.shape)}: check the sizes you pass to the sublayer."
        )
    dst.data.copy_(src.detach())


def load_torch_encoder_layer(block: nn.Module, layer: nn.TransformerEncoderLayer) -> nn.Module:
    """Copy the weights of ``nn.TransformerEncoderLayer`` into a student's ``EncoderBlock``.

    torch's ``self_attn.in_proj_weight`` stacks the query, key and value projections ``(3D, D)``;
    they go to ``self_attn.q_proj``, ``k_proj`` and ``v_proj``. ``linear1``/``linear2`` go to
    ``ff.linear1``/``ff.linear2`` and ``norm1``/``norm2`` to ``norm1``/``norm2``.

    Args:
        block: the student's block with ``self_attn``, ``ff``, ``norm1``, ``norm2``.
        layer: the torch layer to copy from.

    Returns:
        ``block``, with torch's weights.

    Raises:
        AssertionError: naming the attribute that is missing or has the wrong shape.
    """
    missing = [n for n in ("self_attn", "ff", "norm1", "norm2") if not hasattr(block, n)]
    if missing:
        raise AssertionError(
            f"your EncoderBlock has no attribute(s) {', '.join(missing)}: the checks load "
            "torch's weights into self.self_attn (MultiHeadAttention), self.ff (FeedForward with "
            "linear1, linear2), self.norm1 (attention sublayer) and self.norm2 (feed-forward "
            "sublayer)."
        )
    with torch.no_grad():
        attn = block.self_attn
        if isinstance(attn, nn.MultiheadAttention):
            if not attn.batch_first:
                raise AssertionError(
                    "your self_attn is nn.MultiheadAttention without batch_first=True: the "
                    "block's input is (B, T, D)."
                )
            attn.load_state_dict(layer.self_attn.state_dict())
        else:
            w_q, w_k, w_v = layer.self_attn.in_proj_weight.chunk(3, dim=0)  # 3 x (D, D)
            b_q, b_k, b_v = layer.self_attn.in_proj_bias.chunk(3, dim=0)  # 3 x (D,)
            for proj, w, b in (("q_proj", w_q, b_q), ("k_proj", w_k, b_k), ("v_proj", w_v, b_v)):
                lin = getattr(attn, proj, None)
                if lin is None:
                    raise AssertionError(
                        f"your self_attn has no `{proj}`: use the package's MultiHeadAttention "
                        "(q_proj, k_proj, v_proj, out_proj) or nn.MultiheadAttention."
                    )
                _copy(getattr(lin, "weight", None), w, f"self_attn.{proj}.weight")
                _copy(getattr(lin, "bias", None), b, f"self_attn.{proj}.bias")
            out = getattr(attn, "out_proj", None)
            _copy(
                getattr(out, "weight", None),
                layer.self_attn.out_proj.weight,
                "self_attn.out_proj.weight",
            )
            _copy(
                getattr(out, "bias", None), layer.self_attn.out_proj.bias, "self_attn.out_proj.bias"
            )
        for name in ("linear1", "linear2"):
            lin = getattr(block.ff, name, None)
            src = getattr(layer, name)
            _copy(getattr(lin, "weight", None), src.weight, f"ff.{name}.weight")
            _copy(getattr(lin, "bias", None), src.bias, f"ff.{name}.bias")
        for name in ("norm1", "norm2"):
            norm = getattr(block, name)
            src = getattr(layer, name)
            _copy(getattr(norm, "weight", None), src.weight, f"{name}.weight")
            _copy(getattr(norm, "bias", None), src.bias, f"{name}.bias")
    return block


def _block_variants(
    layer: nn.TransformerEncoderLayer, x: Tensor, keep: Tensor | None, norm_first: bool
) -> tuple[Tensor, list[tuple[Tensor, str]]]:
    """torch's output and the outputs of typical wrong blocks, built from torch's own sublayers.

    ``keep`` is the key padding mask in the kit's convention, ``(B, T)`` True at real tokens.
    """
    n1, n2 = layer.norm1, layer.norm2

    def sa(h: Tensor, mask: Tensor | None = keep, invert: bool = False) -> Tensor:
        kpm = None if mask is None else (mask if invert else ~mask)  # torch: True = ignore
        return layer.self_attn(h, h, h, key_padding_mask=kpm, need_weights=False)[0]

    def ff(h: Tensor) -> Tensor:
        return layer.linear2(F.relu(layer.linear1(h)))

    def post(h: Tensor, **kw: Any) -> Tensor:
        h = n1(h + sa(h, **kw))
        return n2(h + ff(h))

    def pre(h: Tensor, **kw: Any) -> Tensor:
        h = h + sa(n1(h), **kw)
        return h + ff(n2(h))

    src_kpm = None if keep is None else ~keep
    with torch.no_grad():
        expected = layer(x, src_key_padding_mask=src_kpm)
        wrong: list[tuple[Tensor, str]] = []
        if keep is not None:
            ignored = pre(x, mask=None) if norm_first else post(x, mask=None)
            inverted = pre(x, invert=True) if norm_first else post(x, invert=True)
            wrong += [
                (ignored, "It matches the block without the mask: pass mask to self_attn."),
                (
                    inverted,
                    "It matches the inverted mask: in this kit True means 'may attend' (a real "
                    "token). If you use nn.MultiheadAttention, its key_padding_mask wants the "
                    "opposite (~mask).",
                ),
            ]
        if norm_first:
            h = x + sa(n1(x))
            wrong += [
                (
                    post(x),
                    "With norm_first=True your block computes post-norm, norm(x + sublayer(x)): "
                    "pre-norm normalises the sublayer's input, x + sublayer(norm(x)).",
                ),
                (
                    ff(n2(sa(n1(x)))),
                    "It matches pre-norm without residuals: add the input back, "
                    "x = x + sublayer(norm(x)).",
                ),
                (
                    (lambda g: n2(g) + ff(n2(g)))(n1(x) + sa(n1(x))),
                    "The residual adds the normalised input: pre-norm keeps the residual path "
                    "un-normalised, x + sublayer(norm(x)), not norm(x) + sublayer(norm(x)).",
                ),
                (
                    (lambda g: g + ff(n2(g)))(n1(x) + sa(n1(x))),
                    "The attention residual adds the normalised input: keep the residual path "
                    "un-normalised, x + self_attn(norm1(x)).",
                ),
                (
                    n2(h) + ff(n2(h)),
                    "The feed-forward residual adds the normalised input: keep the residual path "
                    "un-normalised, x + ff(norm2(x)).",
                ),
                (
                    sa(n1(x)) + ff(n2(sa(n1(x)))),
                    "The attention sublayer has no residual: x = x + self_attn(norm1(x)).",
                ),
                (
                    ff(n2(h)),
                    "The feed-forward sublayer has no residual: x = x + ff(norm2(x)).",
                ),
                (
                    (lambda g: g + ff(n1(g)))(x + sa(n2(x))),
                    "It matches norm1 and norm2 swapped: norm1 belongs to the attention "
                    "sublayer, norm2 to the feed-forward sublayer.",
                ),
                (
                    n2(h + ff(n2(h))),
                    "It normalises the sublayer's output as well: pre-norm is "
                    "x + sublayer(norm(x)) and nothing more.",
                ),
            ]
        else:
            a = n1(x + sa(x))
            wrong += [
                (
                    pre(x),
                    "With norm_first=False your block computes pre-norm, x + sublayer(norm(x)): "
                    "the default is post-norm ('Add & Norm'), norm(x + sublayer(x)).",
                ),
                (
                    n2(ff(n1(sa(x)))),
                    "It matches post-norm without residuals, norm(sublayer(x)): add the input "
                    "before normalising, norm(x + sublayer(x)).",
                ),
                (
                    n2(ff(n1(sa(x))) + n1(sa(x))),
                    "The attention sublayer has no residual: x = norm1(x + self_attn(x)).",
                ),
                (
                    n2(ff(a)),
                    "The feed-forward sublayer has no residual: x = norm2(x + ff(x)).",
                ),
                (
                    (lambda g: n1(g + ff(g)))(n2(x + sa(x))),
                    "It matches norm1 and norm2 swapped: norm1 belongs to the attention "
                    "sublayer, norm2 to the feed-forward sublayer.",
                ),
                (
                    x + sa(x) + ff(x + sa(x)),
                    "It has no layer norm at all: post-norm applies norm1 after the attention "
                    "residual and norm2 after the feed-forward residual.",
                ),
                (
                    a + ff(a),
                    "The feed-forward residual is not normalised: x = norm2(x + ff(x)).",
                ),
            ]
    return expected, wrong


def _build_block(
    cls: Callable[..., nn.Module],
    d_model: int,
    n_heads: int,
    d_ff: int,
    *,
    norm_first: bool,
    dropout: float = 0.0,
    seed: int,
) -> tuple[nn.Module, nn.TransformerEncoderLayer, str]:
    what = f"EncoderBlock({d_model}, {n_heads}, {d_ff}, dropout={dropout}, norm_first={norm_first})"
    torch.manual_seed(seed)
    block = _instantiate(
        cls, d_model, n_heads, d_ff, dropout=dropout, norm_first=norm_first, what=what
    )
    layer = torch_encoder_layer(d_model, n_heads, d_ff, norm_first=norm_first, seed=seed)
    load_torch_encoder_layer(block, layer)
    block.eval()
    return block, layer, what


def _expect_block(
    block: nn.Module,
    layer: nn.TransformerEncoderLayer,
    x: Tensor,
    keep: Tensor | None,
    norm_first: bool,
    what: str,
) -> Tensor:
    expected, wrong = _block_variants(layer, x, keep, norm_first)
    mask = None if keep is None else keep[:, None, None, :]  # (B, 1, 1, T)
    ban = forbidden(_BLOCK_BAN)
    with ban, torch.no_grad():
        actual = call_student(block, x.clone(), mask=mask, what=f"{what}(x, mask)")
        again = call_student(block, x.clone(), mask=mask, what=f"{what}(x, mask)")
    if isinstance(actual, Tensor) and isinstance(again, Tensor) and not close(actual, again):
        raise AssertionError(
            f"{what} in eval mode gives a different output each call: dropout must switch off in "
            "eval mode. Use nn.Dropout modules, or F.dropout(..., training=self.training)."
        )
    form = "x + sublayer(norm(x))" if norm_first else "norm(x + sublayer(x))"
    compare(
        actual,
        expected,
        what=f"{what}(x{'' if keep is None else ', mask'}) on an input of shape {tuple(x.shape)}",
        candidates=wrong,
        hint=f"Expected {form} for the attention sublayer (norm1) and then the feed-forward "
        "sublayer (norm2), as nn.TransformerEncoderLayer computes it.",
    )
    return actual


def check_encoder_block(cls: Callable[..., nn.Module]) -> None:
    """Visible check of ``EncoderBlock``: attribute names, shapes, and post-norm against torch."""
    block, layer, what = _build_block(cls, 16, 4, 32, norm_first=False, seed=0)
    x = _randn(2, 5, 16, g=generator(2))
    with torch.no_grad():
        out = call_student(block, x.clone(), what=f"{what}(x)")
    expect_shape(out, (2, 5, 16), f"{what}(x) for x of shape (2, 5, 16)")
    _expect_block(block, layer, x, None, False, what)
    _instantiate(cls, 16, 4, 32, norm_first=True, what="EncoderBlock(16, 4, 32, norm_first=True)")


def _random_sizes(g: torch.Generator) -> tuple[int, int, int, int, int]:
    n_heads = randint(1, 3, g)
    d_model = n_heads * randint(2, 5, g)
    d_ff = randint(8, 32, g)
    batch = randint(1, 3, g)
    seq = randint(2, 7, g)
    return d_model, n_heads, d_ff, batch, seq


def _random_blocks(cls: Callable[..., nn.Module], seed: int, norm_first: bool) -> None:
    """Two blocks of random sizes (dropout 0, then 0.1, in eval mode) against torch's layer."""
    g = generator(seed)
    for trial in range(2):
        d_model, n_heads, d_ff, batch, seq = _random_sizes(g)
        block, layer, what = _build_block(
            cls,
            d_model,
            n_heads,
            d_ff,
            norm_first=norm_first,
            dropout=0.1 * trial,
            seed=seed + trial,
        )
        _expect_block(block, layer, _randn(batch, seq, d_model, g=g), None, norm_first, what)


def hidden_check_encoder_block_post_norm(cls: Callable[..., nn.Module], seed: int = 0) -> None:
    """Hidden check: post-norm blocks of random sizes against ``nn.TransformerEncoderLayer``."""
    _random_blocks(cls, seed, norm_first=False)


def hidden_check_encoder_block_pre_norm(cls: Callable[..., nn.Module], seed: int = 0) -> None:
    """Hidden check: pre-norm blocks (``norm_first=True``) against torch's pre-norm layer."""
    _random_blocks(cls, seed, norm_first=True)


def hidden_check_encoder_block_mask(cls: Callable[..., nn.Module], seed: int = 0) -> None:
    """Hidden check: a padding mask ``(B, 1, 1, T)`` in both norm placements; padding has no say."""
    g = generator(seed)
    for norm_first in (False, True):
        d_model, n_heads, d_ff, _, _ = _random_sizes(g)
        batch, seq = 3, 6
        lengths = torch.tensor([5, 3, 1])
        keep = torch.arange(seq)[None, :] < lengths[:, None]  # (B, T) True at real tokens
        block, layer, what = _build_block(
            cls, d_model, n_heads, d_ff, norm_first=norm_first, seed=seed
        )
        x = _randn(batch, seq, d_model, g=g)
        out = _expect_block(block, layer, x, keep, norm_first, what)
        # Changing what sits at padded positions must not change any real token's output.
        x2 = torch.where(keep[..., None], x, _randn(batch, seq, d_model, g=g, scale=5.0))
        with torch.no_grad():
            out2 = call_student(block, x2, mask=keep[:, None, None, :], what=f"{what}(x, mask)")
        err = _max_err(out[keep], out2[keep])
        if err > 1e-4:
            raise AssertionError(
                f"{what}: changing the padded tokens changed the outputs at real tokens by up to "
                f"{err:.3g}: padded keys must get zero attention weight (mask is True at real "
                "tokens, shape (B, 1, 1, T))."
            )


# --------------------------------------------------------------------------------------------------
# the trained encoder
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def accuracy_on_fresh_data(model: nn.Module, batches: Sequence[dict[str, Tensor]]) -> float:
    """Token accuracy of a tagging model on ``batches`` of tokens, padding_mask and targets.

    Positions whose target is ``-100`` do not count.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    correct = total = 0
    for batch in batches:
        tokens = batch["tokens"].to(device)
        mask = batch.get("padding_mask")
        logits = model(tokens, None if mask is None else mask.to(device))  # (B, T, C)
        targets = batch["targets"].to(device)
        scored = targets != -100
        correct += int((logits.argmax(-1)[scored] == targets[scored]).sum())
        total += int(scored.sum())
    model.train(was_training)
    if total == 0:
        raise ValueError("accuracy_on_fresh_data got batches without any scored target")
    return correct / total


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
    """Graded check of the trained encoder: built from the student's blocks, accurate on new data.

    Args:
        model: the trained ``EncoderClassifier`` (token head).
        block_cls: the student's ``EncoderBlock`` class; the model must contain its blocks.
        min_accuracy: token accuracy the model must reach on sequences it has never seen.
        task, seq_len, min_len, num_symbols: the task the notebook trains on.

    Returns:
        The measured token accuracy.
    """
    if not isinstance(model, nn.Module):
        raise AssertionError(
            f"`model` should be your trained EncoderClassifier, got {type(model).__name__}: did "
            "the training cell run?"
        )
    if not any(isinstance(m, block_cls) for m in model.modules()):
        raise AssertionError(
            "your model contains none of your EncoderBlocks: build it with "
            "EncoderClassifier(config, blocks=[EncoderBlock(...) for _ in range(n_layers)])."
        )
    batches = held_out_batches(task, seq_len=seq_len, min_len=min_len, num_symbols=num_symbols)
    try:
        acc = accuracy_on_fresh_data(model, batches)
    except AssertionError:
        raise
    except Exception as exc:
        raise AssertionError(
            f"running your model on new {task} sequences raised {type(exc).__name__}: {exc}"
        ) from exc
    if acc < min_accuracy:
        raise AssertionError(
            f"your encoder reaches {acc:.1%} token accuracy on new {task} sequences, expected at "
            f"least {min_accuracy:.0%}: check that the training cell ran to the end, that your "
            "blocks pass the checks above, and that the mask reaches self_attn."
        )
    return acc

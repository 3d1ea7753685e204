"""Hidden checks of lab 04 (the transformer block): float64 oracles written out from each case's
weights (:mod:`._blocks`, shared with lab 06), the outputs of the typical mistakes (in training
mode dropout's masks drawn from the case's seed in the order each placement draws them), the
drawn cases, and the visible checks' worked examples (:func:`fixtures`).

Reference: Vaswani et al., "Attention Is All You Need" (2017), sections 3.1, 5.3, 5.4; Xiong et
al., "On Layer Normalization in the Transformer Architecture" (2020); Loshchilov & Hutter,
"Decoupled Weight Decay Regularization" (2019).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab.checks import lab04
from transformer_lab.checks._common import expect_true, generator, randint
from transformer_lab.checks._generated import Oracle
from transformer_lab.checks._lightning import Schedule
from transformer_lab.checks.lab04 import IGNORE_INDEX, SPEC, BlockCase, ProbeModel, values_at
from transformer_lab.grading.hidden import fixture_entry
from transformer_lab.grading.hidden._blocks import feed_forward64, layer_norm64, multi_head64

#: Where layer norm takes its statistics (said by the mistakes that take them elsewhere).
PER_TOKEN = "per token, over the last dimension only (dim=-1, keepdim=True)"


def layer_norm_mistakes(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> dict[str, Tensor]:
    """Hint -> what a typical wrong ``layer_norm`` returns (float64)."""
    x, weight, bias = x.double(), weight.double(), bias.double()
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    x_hat = (x - mean) / torch.sqrt(var + eps)

    def normed(mean: Tensor, var: Tensor) -> Tensor:
        return (x - mean) / torch.sqrt(var + eps) * weight + bias

    out = {
        "It matches x_hat alone: multiply by weight and add bias at the end.": x_hat,
        "It matches weight * x_hat without the bias: add bias at the end.": x_hat * weight,
        "It matches (x_hat + bias) * weight: scale first, then shift.": (x_hat + bias) * weight,
        "It matches (x - mean) / (sqrt(var) + eps): eps belongs inside the square root.": (
            (x - mean) / (torch.sqrt(var) + eps) * weight + bias
        ),
    }
    if x.shape[-1] > 1:
        out[
            "It matches the unbiased variance (dividing by D - 1): layer norm uses the biased "
            "variance (torch.var needs correction=0)."
        ] = normed(mean, x.var(-1, keepdim=True))
    out[f"It matches the statistics over dim=0: take them {PER_TOKEN}."] = normed(
        x.mean(0, keepdim=True), x.var(0, unbiased=False, keepdim=True)
    )
    out[f"It matches one mean and variance for the whole tensor: take them {PER_TOKEN}."] = normed(
        x.mean(), x.var(unbiased=False)
    )
    return out


LAYER_NORM = Oracle(lab04.LAYER_NORM, layer_norm64, layer_norm_mistakes)
RAW_MOMENTS = (
    "Compute the variance from the centred values, ((x - mean) ** 2).mean(-1): "
    "mean(x ** 2) - mean(x) ** 2 cancels catastrophically in float32 when the mean is large."
)
#: Features around 1e4 with a spread of 1: float32 keeps three digits of the spread (so the
#: tolerance is 1e-2), E[x^2] - E[x]^2 keeps none. Judged after the ordinary cases, so that an
#: answer wrong here alone is named as the cancellation.
LARGE_MEAN = Oracle(
    dataclasses.replace(
        lab04.LAYER_NORM, named=lambda case: RAW_MOMENTS, **values_at(SPEC.tol("large_mean"))
    ),
    layer_norm64,
    layer_norm_mistakes,
)


def _ln_cases(g: torch.Generator) -> list[tuple[Tensor, Tensor, Tensor, float]]:
    cases = []
    for lead in ((), (randint(1, 5, g),), (2, randint(2, 6, g)), (2, 2, 3)):
        d = randint(2, 16, g)
        scale = float(torch.rand(1, generator=g)) * 4 + 0.5
        x = torch.randn(*lead, d, generator=g) * scale + 2.0
        cases.append((x, torch.randn(d, generator=g), torch.randn(d, generator=g), 1e-5))
    d = randint(3, 9, g)
    x = torch.randn(4, d, generator=g, dtype=torch.float64) * 2.0
    return [*cases, (x, *torch.randn(2, d, generator=g, dtype=torch.float64), 1e-5)]


hidden_check_layer_norm = LAYER_NORM.hidden(
    "hidden_check_layer_norm",
    _ln_cases,
    """Random shapes (1-D to 4-D), weights and biases, float32 and float64.""",
)


def hidden_check_layer_norm_numerics(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """eps inside the root, the biased variance, constant tokens, tiny spreads, large offsets."""
    g = generator(seed)
    LAYER_NORM.judge(
        fn,
        [
            # A large eps and a small spread tell eps inside the square root from outside it.
            (torch.randn(3, 6, generator=g) * 0.3, *torch.randn(2, 6, generator=g), 0.5),
            # Tokens whose spread (1e-3) is below sqrt(eps): eps matters even at its default.
            (torch.randn(3, 8, generator=g) * 1e-3, torch.ones(8), torch.zeros(8), 1e-5),
            # Two features: the biased and the unbiased variance differ by a factor of two.
            (torch.randn(4, 2, generator=g) * 2.0, torch.ones(2), torch.zeros(2), 1e-5),
            # A constant token has variance 0: the output is the bias, never NaN.
            (torch.full((2, 5), 3.0), *torch.randn(2, 5, generator=g), 1e-5),
        ],
    )
    x = torch.randn(3, 16, generator=g) + 1e4
    LARGE_MEAN.judge(fn, [(x, torch.ones(16), torch.zeros(16), 1e-5)])


def random_weights(
    d_model: int, d_ff: int, g: torch.Generator, *attentions: str, norms: bool = True
) -> dict[str, Tensor]:
    """Random float32 weights named as the kit's: of a ``FeedForward(d_model, d_ff)``, or of a
    block with these ``attentions`` (lab 06's decoder too), ``ff`` and a norm after each sub-layer
    whose gains and shifts are far from 1 and 0 (a swapped or unused norm shows; 1 and 0 with
    ``norms=False``)."""
    w: dict[str, Tensor] = {}
    prefix = "ff." if attentions else ""
    layers = {
        f"{a}.{n}_proj": (d_model, d_model) for a in attentions for n in ("q", "k", "v", "out")
    }
    layers |= {f"{prefix}linear1": (d_model, d_ff), f"{prefix}linear2": (d_ff, d_model)}
    for name, (n_in, n_out) in layers.items():
        w[f"{name}.weight"] = torch.randn(n_out, n_in, generator=g) / math.sqrt(n_in)
        w[f"{name}.bias"] = 0.2 * torch.randn(n_out, generator=g)
    for i in range(1, len(attentions) + 2) if attentions else ():
        w[f"norm{i}.weight"] = 1.0 + 0.5 * torch.randn(d_model, generator=g) * norms
        w[f"norm{i}.bias"] = 0.5 * torch.randn(d_model, generator=g) * norms
    return w


def linear64(w: Mapping[str, Tensor], name: str) -> tuple[Tensor, Tensor]:
    """The layer ``name``'s ``(weight, bias)`` in a block's weights ``w``, in float64."""
    return w[f"{name}.weight"].double(), w[f"{name}.bias"].double()


#: A module whose dropout never acts (no dropout, or none in training mode).
EVAL_IN_TRAINING = (
    "It gives the output of eval mode in training mode: dropout never acts. Apply nn.Dropout "
    "modules in forward (they act in training mode only)."
)


def _dropout_masks(
    seed: int, shapes: list[tuple[int, ...]], p: float, dtype: torch.dtype, seq_first: bool = False
) -> list[Tensor]:
    """The scaled masks ``F.dropout`` draws from ``seed`` for these shapes, in order; with
    ``seq_first`` the first in the memory order of a ``(T, B, ...)`` tensor seen transposed."""
    masks = []
    with lab04.seeded(seed):  # as the student's module ran
        for i, (b, t, *rest) in enumerate(shapes):
            ones = torch.ones(b, t, *rest, dtype=dtype)
            if seq_first and i == 0:
                ones = torch.ones(t, b, *rest, dtype=dtype).transpose(0, 1)
            masks.append(F.dropout(ones, p, training=True).double())
    return masks


def oracle_feed_forward(
    d_ff: int, p: float, w: Mapping[str, Tensor], x: Tensor, seed: Any
) -> Tensor:
    """``relu(x W1^T + b1) W2^T + b2`` in float64, the hidden units dropped from ``seed``."""
    hidden = None
    if seed is not None:
        (hidden,) = _dropout_masks(seed, [(*x.shape[:-1], d_ff)], p, x.dtype)
    return feed_forward64(x, linear64(w, "linear1"), linear64(w, "linear2"), hidden)


def feed_forward_mistakes(*case: Any) -> dict[str, Tensor]:
    """Hint -> what a typical wrong ``FeedForward`` returns (float64)."""
    d_ff, p, w, x, seed = case
    first, (w2, b2) = linear64(w, "linear1"), linear64(w, "linear2")
    pre = x.double() @ first[0].T + first[1]  # (..., F)
    good, lin = feed_forward64(x, first, (w2, b2)), pre @ w2.T + b2  # lin: no nonlinearity
    if seed is None:
        return {
            "It matches linear2(linear1(x)) with no nonlinearity: apply ReLU between them.": lin,
            "It matches relu(linear2(linear1(x))): the ReLU goes between the layers.": lin.relu(),
            "It matches GELU between the layers: this lab uses ReLU.": F.gelu(pre) @ w2.T + b2,
            "It adds the input x: the residual belongs to the block.": x.double() + good,
            "It drops units in eval mode too: dropout must switch off in eval mode. Use nn.Dropout "
            "modules (model.eval() switches them off) or F.dropout(..., training=self.training).": (
                oracle_feed_forward(d_ff, p, w, x, 0)  # as the check runs eval mode: from seed 0
            ),
        }
    (on_x,) = _dropout_masks(seed, [tuple(x.shape)], p, x.dtype)
    return {
        EVAL_IN_TRAINING: good,
        "It matches dropout on the output of linear2: FeedForward drops its hidden units (d_ff "
        "wide, after the ReLU).": good * on_x,
        "It matches dropout on the input x: drop the hidden units (after the ReLU).": (
            feed_forward64(x * on_x, first, (w2, b2))
        ),
    }


FEED_FORWARD = Oracle(lab04.FEED_FORWARD, oracle_feed_forward, feed_forward_mistakes)


def _ff_cases(g: torch.Generator) -> list[tuple[Any, ...]]:
    cases: list[tuple[Any, ...]] = []
    for _ in range(2):
        d_model, d_ff = randint(3, 12, g), randint(5, 40, g)
        w = random_weights(d_model, d_ff, g)
        for lead, scale in (((3, 4), 2.0), ((6,), 2.0), ((2, 2, 3), 1.0)):
            cases.append((d_ff, 0.0, w, torch.randn(*lead, d_model, generator=g) * scale, None))
    x = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    return [*cases, (7, 0.0, random_weights(5, 7, g), x, None)]


hidden_check_feed_forward = FEED_FORWARD.hidden(
    "hidden_check_feed_forward",
    _ff_cases,
    """Random sizes and weights; 2-D, 3-D and 4-D inputs; a float64 module; eval mode.""",
)


def hidden_check_feed_forward_dropout(cls: Callable[..., nn.Module], seed: int = 0) -> None:
    """Eval mode: no dropout; training mode: dropout on the hidden units only (one seed)."""
    g = generator(seed)
    cases = []
    for p in (0.5, 0.2):
        d_model, d_ff = randint(4, 10, g), randint(12, 30, g)
        x = torch.randn(3, 5, d_model, generator=g)
        cases.append((d_ff, p, random_weights(d_model, d_ff, g), x, seed + 17))
    FEED_FORWARD.judge(cls, [(*case[:-1], None) for case in cases])
    FEED_FORWARD.judge(cls, cases)


class _Pieces:
    """The sub-layers of an encoder block in float64, from a case's weights; ``bessel``: its
    norms divide by ``D - 1`` (``x.var()``'s default), a typical mistake."""

    def __init__(self, w: Mapping[str, Tensor], n_heads: int, bessel: bool = False) -> None:
        self.w, self.n_heads, self.bessel = w, n_heads, bessel

    def attention(self, h: Tensor, mask: Tensor | None) -> Tensor:
        """Multi-head self-attention of ``h (B, T, D)``; fully masked rows give zeros."""
        layers = tuple(linear64(self.w, f"self_attn.{n}_proj") for n in ("q", "k", "v", "out"))
        return multi_head64(h, h, h, layers, self.n_heads, mask)

    def feed_forward(self, h: Tensor, hidden_mask: Tensor | None = None) -> Tensor:
        first, second = linear64(self.w, "ff.linear1"), linear64(self.w, "ff.linear2")
        return feed_forward64(h, first, second, hidden_mask)

    def norm(self, index: int, h: Tensor) -> Tensor:
        gain, shift = linear64(self.w, f"norm{index}")
        k = (h.shape[-1] - 1) / h.shape[-1] if self.bessel else 1.0  # var(D - 1) = var(D) / k
        return layer_norm64(h, gain * math.sqrt(k), shift, 1e-5 * k)


def oracle_encoder_block(
    *args: Any, at: str | None = None, on_sum: bool = False, bessel: bool = False
) -> Tensor:
    """The block in float64, post- or pre-norm; in training mode dropout at ``at`` (default:
    torch's layer's "ahf": "a" the attention output, "h" the hidden units, "f" the feed-forward
    output), its masks drawn from ``seed`` in that order. Typical mistakes: ``on_sum``, dropout
    on the residual sum; ``bessel``, see :class:`_Pieces`."""
    c = BlockCase(*args)
    at = ("" if c.seed is None else "ahf") if at is None else at
    B, T, D = c.x.shape
    size = {"a": (B, T, D), "h": (B, T, c.d_ff), "f": (B, T, D)}
    seq_first = c.seq_first and at[:1] == "a" and not on_sum  # else drawn on a contiguous tensor
    masks = iter(_dropout_masks(c.seed or 0, [size[k] for k in at], c.p, c.x.dtype, seq_first))
    d1, hidden, d2 = (next(masks) if k in at else (None if k == "h" else 1.0) for k in "ahf")
    o, x = _Pieces(c.w, c.n_heads, bessel), c.x.double()

    def add(h: Tensor, sub: Tensor, drop: Any) -> Tensor:
        return drop * (h + sub) if on_sum else h + drop * sub

    if c.norm_first:
        x = add(x, o.attention(o.norm(1, x), c.mask), d1)
        return add(x, o.feed_forward(o.norm(2, x), hidden), d2)
    x = o.norm(1, add(x, o.attention(x, c.mask), d1))
    return o.norm(2, add(x, o.feed_forward(x, hidden), d2))


def encoder_block_mistakes(*args: Any) -> dict[str, Tensor]:
    """Hint -> what a typical wrong block returns (float64)."""
    c = BlockCase(*args)
    if c.seed is not None:
        return {
            EVAL_IN_TRAINING: oracle_encoder_block(*c, at=""),
            "It matches a block whose FeedForward has no dropout: give it the block's dropout.": (
                oracle_encoder_block(*c, at="af")
            ),
            "It matches a block without dropout on the attention output (dropout1).": (
                oracle_encoder_block(*c, at="hf")
            ),
            "It matches a block without dropout on the feed-forward output (dropout2).": (
                oracle_encoder_block(*c, at="ah")
            ),
            "It matches dropout applied to the residual sum: drop the sub-layer's output only, x "
            "+ dropout(sublayer(...)).": oracle_encoder_block(*c, on_sum=True),
        }
    o, mask, norm_first = _Pieces(c.w, c.n_heads), c.mask, c.norm_first
    x, ff = c.x.double(), o.feed_forward
    sa, n1, n2 = partial(o.attention, mask=mask), partial(o.norm, 1), partial(o.norm, 2)
    named: dict[str, Tensor] = {}
    if mask is not None:
        keep = mask.bool()[:, 0, 0, :]  # (B, T): the first query row, as the mistake reads it
        named |= {
            "It matches the block without the mask: pass mask on to self_attn.": (
                oracle_encoder_block(*c._replace(mask=None))
            ),
            "It matches the inverted mask: in this kit True means 'may attend' (a real token); "
            "nn.MultiheadAttention's masks want the opposite (~mask).": oracle_encoder_block(
                *c._replace(mask=~mask.bool())
            ),
            "It zeroes the outputs at padded positions: the mask only hides padded keys.": (
                oracle_encoder_block(*c) * keep[..., None]
            ),
        }
        if mask.shape[-2] > 1:
            named["It uses only the first query row of the mask: pass on the whole mask."] = (
                oracle_encoder_block(*c._replace(mask=mask.bool()[:, :, :1, :]))
            )
    swapped = "It matches norm1 and norm2 swapped: norm1 belongs to the attention sub-layer."
    if norm_first:
        h = x + sa(n1(x))
        a = n1(x) + sa(n1(x))
        named |= {
            "With norm_first=True your block computes post-norm: pre-norm is x + "
            "sublayer(norm(x)).": oracle_encoder_block(*c._replace(norm_first=False)),
            "It matches pre-norm without residuals: x = x + sublayer(norm(x)).": ff(n2(sa(n1(x)))),
            "The residual adds the normalised input: pre-norm keeps the residual path "
            "un-normalised, x + sublayer(norm(x)).": n2(a) + ff(n2(a)),
            swapped: (lambda b: b + ff(n1(b)))(x + sa(n2(x))),
            "It normalises the block's output as well: pre-norm is x + sublayer(norm(x)) only "
            "(the stack's final norm comes after the last block).": n2(h + ff(n2(h))),
        }
    else:
        a = n1(x + sa(x))
        named |= {
            "With norm_first=False your block computes pre-norm: the default is post-norm, "
            "norm(x + sublayer(x)).": oracle_encoder_block(*c._replace(norm_first=True)),
            "It matches post-norm without residuals: norm(x + sublayer(x)).": n2(ff(n1(sa(x)))),
            "The attention sub-layer has no residual: x = norm1(x + self_attn(x)).": (
                lambda b: n2(b + ff(b))
            )(n1(sa(x))),
            "The feed-forward sub-layer has no residual: x = norm2(x + ff(x)).": n2(ff(a)),
            swapped: (lambda b: n1(b + ff(b)))(n2(x + sa(x))),
            "It has no layer norm at all: post-norm applies norm1 and norm2 after the residuals.": (
                lambda b: b + ff(b)
            )(x + sa(x)),
            "It normalises the sub-layer's output, then adds x: Add & Norm adds first, "
            "norm(x + sublayer(x)).": (lambda b: b + n2(ff(b)))(x + n1(sa(x))),
        }
    named[
        "It matches layer norms that divide by D - 1 (Bessel's correction: x.var() is unbiased "
        "by default): use the biased variance (correction=0)."
    ] = oracle_encoder_block(*c, bessel=True)
    return named


BLOCK = Oracle(lab04.BLOCK, oracle_encoder_block, encoder_block_mistakes)


def _random_blocks(cls: Callable[..., nn.Module], seed: int, *, norm_first: bool) -> None:
    """Blocks of random sizes and weights: eval mode, float64, then training mode (dropout)."""
    g = generator(seed)
    evaluated, trained = [], []
    for dropout in (0.0, 0.3, 0.0):
        n_heads = randint(1, 3, g)
        # With dropout, at least 4 features: a post-norm block of width 2 normalises each token
        # to +-1 whatever was dropped, so training mode could not be told from eval mode.
        d_model = n_heads * max(randint(2, 5, g), -(-4 // n_heads) if dropout else 2)
        d_ff = randint(8, 32, g)
        w = random_weights(d_model, d_ff, g, "self_attn")
        dtype = torch.float64 if len(evaluated) == 2 else torch.float32
        batch, seq = randint(2, 3, g), randint(2, 7, g)
        x = torch.randn(batch, seq, d_model, generator=g, dtype=dtype)
        evaluated.append((n_heads, d_ff, norm_first, dropout, w, x, None, None))
        if dropout:
            keep = torch.ones(batch, seq, dtype=torch.bool)
            keep[-1, max(1, seq - 2) :] = False  # (B, T): the last sequence is padded
            trained.append((n_heads, d_ff, norm_first, dropout, w, x, keep[:, None, None, :]))
            evaluated.append((*trained[-1], None))
    BLOCK.judge(cls, evaluated)
    train = (seed + 5, lab04.sequence_first(cls))
    BLOCK.judge(cls, [(*case, *train) for case in trained])


def hidden_check_encoder_block_post_norm(cls: Callable[..., nn.Module], seed: int = 0) -> None:
    """Post-norm blocks of random sizes: eval mode, float64, training mode (dropout)."""
    _random_blocks(cls, seed, norm_first=False)


def hidden_check_encoder_block_pre_norm(cls: Callable[..., nn.Module], seed: int = 0) -> None:
    """Pre-norm blocks (``norm_first=True``) of random sizes: eval, float64, training mode."""
    _random_blocks(cls, seed, norm_first=True)


def outscoring_case(
    g: torch.Generator, n_heads: int, d_ff: int, keep: Tensor, *, norm_first: bool
) -> tuple[dict[str, Tensor], Tensor]:
    """Weights and ``x (B, T, D)`` where every padded key out-scores every real key, for every
    query (``6 e``; ``e`` alternates +-1): real tokens score 0, padded ones (``3 e``) at least
    ``6 sqrt(2)``. A mask ignored, inverted or applied after the softmax changes everything."""
    B, T = keep.shape
    d = 2 * n_heads * randint(1, 3, g)  # even head widths
    e = torch.tensor([1.0, -1.0]).repeat(d // 2)  # (D,)
    w = random_weights(d, d_ff, g, "self_attn")
    w |= {"self_attn.q_proj.weight": torch.zeros(d, d), "self_attn.q_proj.bias": 6.0 * e}
    w |= {"self_attn.k_proj.weight": torch.eye(d), "self_attn.k_proj.bias": torch.zeros(d)}
    if norm_first:
        w |= {"norm1.weight": torch.ones(d), "norm1.bias": torch.zeros(d)}
    z = torch.randn(B, T, d // 2, generator=g).repeat_interleave(2, -1)  # (B, T, D), pairs equal
    return w, torch.where(keep[..., None], z, 3.0 * e)


def _mask_cases(g: torch.Generator) -> list[tuple[Any, ...]]:
    cases: list[tuple[Any, ...]] = []
    for norm_first in (False, True):
        n_heads, d_ff, seq = randint(1, 2, g), randint(8, 24, g), randint(5, 8, g)
        keep = torch.arange(seq)[None, :] < torch.tensor([seq, seq - 2, 1])[:, None]  # (B, T)
        w, x = outscoring_case(g, n_heads, d_ff, keep, norm_first=norm_first)
        # The padded tokens moved: the real tokens' outputs must not change.
        moved = torch.where(keep[..., None], x, 5.0 * torch.randn(x.shape, generator=g))
        for x_in in (x, moved):
            cases.append((n_heads, d_ff, norm_first, 0.0, w, x_in, keep[:, None, None, :], None))
    # A general mask (B, 1, T, T): padding and a band around the diagonal; key 0 always allowed.
    keep = torch.arange(6)[None, :] < torch.tensor([6, 4])[:, None]  # (B, T)
    band = (torch.arange(6)[:, None] - torch.arange(6)).abs() <= 1  # (T, T)
    mask = keep[:, None, None, :] & band[None, None]  # (B, 1, T, T)
    mask[..., 0] = True
    w, x = random_weights(8, 16, g, "self_attn"), torch.randn(2, 6, 8, generator=g)
    return [*cases, (2, 16, False, 0.0, w, x, mask, None)]


def hidden_check_encoder_block_mask(cls: Callable[..., nn.Module], seed: int = 0) -> None:
    """Padding masks whose masked keys out-score the rest, the padded tokens moved (the real
    tokens' outputs stay), a general mask of shape ``(B, 1, T, T)``; post-norm, then pre-norm."""
    cases = _mask_cases(generator(seed))
    for norm_first in (False, True):
        BLOCK.judge(cls, [c for c in cases if BlockCase(*c).norm_first == norm_first])


def tagging_losses(model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of ``model`` on ``batch`` (the mean cross-entropy over the targets that are not
    -100) and hint -> a typical wrong one (float64 scalars)."""
    tokens, targets = batch["tokens"], batch["targets"]
    real = targets != IGNORE_INDEX

    def nll(logits: Tensor, labels: Tensor) -> Tensor:  # (B, T): -log p(label), clamped label
        logp = torch.log_softmax(logits.double(), dim=-1)  # (B, T, C)
        return -logp.gather(-1, labels.clamp(0, logits.shape[-1] - 1)[..., None])[..., 0]

    with torch.no_grad():
        logits, unmasked = model(tokens, batch["padding_mask"]), model(tokens)  # (B, T, C)
    as_class_0 = nll(logits, targets)
    per_token = torch.where(real, as_class_0, torch.zeros_like(as_class_0))
    per_sequence = per_token.sum(1) / real.sum(1).clamp(min=1)  # (B,)
    return per_token.sum() / real.sum(), {
        "It matches the mean over every position, padding included: average over the real "
        "tokens only (F.cross_entropy ignores the targets -100).": per_token.mean(),
        "It matches the sum over the real tokens: take their mean.": per_token.sum(),
        "It matches logits computed without the padding mask: pass batch['padding_mask'].": (
            (nll(unmasked, targets) * real).sum() / real.sum()
        ),
        "It matches the mean of each sequence's mean loss: average over all real tokens.": (
            per_sequence.mean()
        ),
        "It matches a loss that counts the padded positions as class 0: keep the targets -100.": (
            as_class_0.mean()
        ),
        "It matches the loss against batch['tokens']: the labels are batch['targets'].": (
            (nll(logits, tokens) * real).sum() / real.sum()
        ),
    }


def _tagging_batch(g: torch.Generator, vocab: int, lengths: Tensor) -> dict[str, Tensor]:
    """Tokens and targets of sequences of these lengths, padded (token 0, target -100)."""
    keep = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]  # (B, T)
    tokens = torch.randint(1, vocab, keep.shape, generator=g).masked_fill(~keep, 0)
    targets = torch.randint(0, vocab, keep.shape, generator=g).masked_fill(~keep, IGNORE_INDEX)
    return {"tokens": tokens, "padding_mask": keep, "targets": targets}


def hidden_check_training_step(cls: Callable[..., Any], seed: int = 0) -> None:
    """``training_step`` on random padded batches: loss over real tokens, logging, no kept graph."""
    g = generator(seed)
    for trial in range(2):
        vocab = randint(5, 12, g)  # tagging tasks predict token ids
        batch_size, seq = randint(3, 6, g), randint(4, 9, g)
        with lab04.seeded(seed + trial):
            model = ProbeModel(vocab, randint(3, 8, g), vocab)
        lengths = torch.randint(1, seq + 1, (batch_size,), generator=g)
        lengths[0] = seq
        batch = _tagging_batch(g, vocab, lengths)
        returned = lab04.training_step_check(cls, model, batch, tagging_losses(model, batch))
        returned.backward()  # Lightning will: the graph must reach the model's weights
        expect_true(
            model.head.weight.grad is not None,
            "the loss training_step returns does not depend on the model's weights: compute it "
            "from self.model(...)'s logits.",
        )


def _cosine(lr: float, step: int, start: int, length: int) -> float:
    return lr * 0.5 * (1.0 + math.cos(math.pi * (step - start) / length))


def oracle_learning_rates(lr: float, warmup_steps: int, total_steps: int) -> Tensor:
    """Learning rate of steps ``0 .. total_steps - 1``: linear warm-up, then a cosine to 0."""
    w, n = warmup_steps, total_steps
    rates = [lr * (s + 1) / w if s < w else _cosine(lr, s, w, n - w) for s in range(n)]
    return torch.tensor(rates, dtype=torch.float64)


def schedule_mistakes(lr: float, warmup_steps: int, total_steps: int) -> dict[str, Tensor]:
    """Hint -> the learning rates a typical wrong schedule gives (float64)."""
    w, n = warmup_steps, total_steps
    good = oracle_learning_rates(lr, w, n).tolist()

    def rates(after: Callable[[int], float], warmup: Callable[[int], float] = good.__getitem__):
        values = [warmup(s) if s < w else after(s) for s in range(n)]
        return torch.tensor(values, dtype=torch.float64)

    out = {
        "It has no warm-up: the first steps climb linearly, lr * (step + 1) / warmup_steps.": (
            rates(lambda s: _cosine(lr, s, 0, n), lambda s: _cosine(lr, s, 0, n))
        ),
        "It stays at lr after the warm-up: decay it with a cosine to 0 at total_steps.": rates(
            lambda s: lr
        ),
        "It decays linearly after the warm-up: use a cosine.": rates(
            lambda s: lr * (n - s) / (n - w)
        ),
        "Its cosine is too long: its length is total_steps - warmup_steps (T_max).": rates(
            lambda s: _cosine(lr, s, w, n)
        ),
    }
    if w > 1:
        out["Its warm-up starts at 0: step s uses lr * (s + 1) / warmup_steps."] = rates(
            good.__getitem__, lambda s: lr * s / w
        )
        out[
            "Its warm-up is one step too long: LinearLR(start_factor=1 / warmup_steps, "
            "total_iters=warmup_steps - 1) makes step warmup_steps - 1 use the full lr."
        ] = rates(good.__getitem__, lambda s: lr * (1 / w + (1 - 1 / w) * s / w))
    return out


def hidden_check_configure_optimizers(cls: Callable[..., Any], seed: int = 0) -> None:
    """Random hyper-parameters and models: AdamW's groups, the schedule at every step."""
    g = generator(seed)
    for trial in range(2):
        lr = float(10 ** (-3 + 1.5 * torch.rand(1, generator=g)))
        weight_decay = round(float(0.01 + 0.2 * torch.rand(1, generator=g)), 3)
        warmup = randint(1, 6, g) if trial else randint(2, 6, g)
        schedule = Schedule(lr, warmup, warmup + randint(3, 15, g))
        with lab04.seeded(seed + trial):
            model = ProbeModel(randint(5, 20, g), randint(2, 8, g), randint(2, 9, g))
        rates = oracle_learning_rates(*schedule), schedule_mistakes(*schedule)
        lab04.optimizers_check(cls, model, schedule, weight_decay, rates)


def fixtures() -> dict[str, dict[str, Any]]:
    """The stored examples of :mod:`transformer_lab.checks.lab04`, keyed by what they show."""
    g = generator(404)

    # layer_norm: two rows with weight 1 and bias 0, a 3-D input, a 4-D one with eps=1e-3
    rows = torch.tensor([[1.0, 2.0, 3.0, 4.0], [-2.0, 0.0, 0.0, 6.0]])
    norms = [(rows, torch.ones(4), torch.zeros(4), 1e-5)]
    for shape, eps in (((2, 3, 5), 1e-5), ((2, 3, 4, 6), 1e-3)):
        x = torch.randn(*shape, generator=g) * 3.0 + 1.0
        norms.append((x, *torch.randn(2, shape[-1], generator=g), eps))
    out = LAYER_NORM.fixtures("check_layer_norm", norms)

    # FeedForward(4, 6) on a 3-D input, FeedForward(8, 16, dropout=0.5) on a 2-D one, eval mode;
    # FeedForward(8, 32, dropout=0.5) in training mode, its mask drawn from seed 7
    ff = [(6, 0.0, random_weights(4, 6, g), torch.randn(2, 3, 4, generator=g) * 1.5, None)]
    ff.append((16, 0.5, random_weights(8, 16, g), torch.randn(5, 8, generator=g), None))
    ff.append((32, 0.5, random_weights(8, 32, g), torch.randn(2, 5, 8, generator=g), 7))
    out |= FEED_FORWARD.fixtures("check_feed_forward", ff)

    # EncoderBlock(8, 2, 16), post- and pre-norm, without and with a padding mask; then
    # EncoderBlock(12, 3, 20) with a padding mask
    w, x = random_weights(8, 16, g, "self_attn"), torch.randn(2, 5, 8, generator=g)
    keep = torch.arange(5)[None, :] < torch.tensor([5, 3])[:, None]  # (B, T)
    blocks = [
        (2, 16, norm_first, 0.0, w, x, mask, None)
        for norm_first in (False, True)
        for mask in (None, keep[:, None, None, :])
    ]
    w, x = random_weights(12, 20, g, "self_attn"), torch.randn(3, 6, 12, generator=g)
    keep = torch.arange(6)[None, :] < torch.tensor([6, 4, 2])[:, None]  # (B, T)
    blocks.append((3, 20, False, 0.0, w, x, keep[:, None, None, :], None))
    out |= BLOCK.fixtures("check_encoder_block", blocks)

    # EncoderBlock(8, 2, 32, dropout=0.5) with a padding mask, post- and pre-norm, in eval mode
    # and in training mode (seed 11) for either memory order of the attention's output
    keep = torch.arange(6)[None, :] < torch.tensor([6, 4])[:, None]  # (B, T)
    w, x = random_weights(8, 32, g, "self_attn", norms=False), torch.randn(2, 6, 8, generator=g)
    dropped = [(2, 32, nf, 0.5, w, x, keep[:, None, None, :]) for nf in (False, True)]
    trained = [(*case, 11, seq_first) for seq_first in (False, True) for case in dropped]
    evaluated = [(*case, None) for case in dropped]
    out |= BLOCK.fixtures("check_encoder_block_dropout", [*evaluated, *trained])

    # training_step: a ProbeModel's weights and a padded batch
    with lab04.seeded(44):
        probe = ProbeModel(6, 4, 6)
    batch = _tagging_batch(g, 6, torch.tensor([5, 3, 2]))
    stored = {**batch, **probe.state_dict()}
    out |= {f"training_step {k}": fixture_entry(v.double()) for k, v in stored.items()}
    out["training_step loss"] = fixture_entry(*tagging_losses(probe, batch))

    # configure_optimizers' schedule
    out["configure_optimizers learning rates (lr=0.01, warmup_steps=4, total_steps=12)"] = (
        fixture_entry(oracle_learning_rates(0.01, 4, 12), schedule_mistakes(0.01, 4, 12))
    )
    return out


__all__ = ["fixtures", *(n for n in dir() if n.startswith("hidden_check_"))]  # dir(): sorted

"""Hidden checks of lab 04 (the transformer block): float64 oracles written out from each case's
weights (:mod:`._blocks`, shared with lab 06) with keyword options: a typical mistake's output is
the oracle run with the options its spec record gives (in training mode dropout's masks drawn
from the case's seed in the order each placement draws them); the drawn cases, and the visible
checks' worked examples (:func:`fixtures`).

Reference: Vaswani et al., "Attention Is All You Need" (2017), sections 3.1, 5.3, 5.4; Xiong et
al., "On Layer Normalization in the Transformer Architecture" (2020); Loshchilov & Hutter,
"Decoupled Weight Decay Regularization" (2019).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab.checks import lab04
from transformer_lab.checks._common import expect_true, generator, randint
from transformer_lab.checks._generated import Oracle, floats_at
from transformer_lab.checks._lightning import Schedule
from transformer_lab.checks.lab04 import IGNORE_INDEX, SPEC, BlockCase, ProbeModel
from transformer_lab.grading.hidden import fixture_entry
from transformer_lab.grading.hidden._blocks import (
    attention64,
    feed_forward64,
    layer_norm64,
    linear64,
    random_weights,
)


def oracle_layer_norm(
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    eps: float,
    *,
    over: str = "token",
    unbiased: bool = False,
    eps_outside: bool = False,
    affine: str = "after",
) -> Tensor | None:
    """Layer norm in float64: per token, the biased variance, eps inside the root, then
    ``weight * x_hat + bias``; the options make the mistakes (statistics ``over`` dim 0 or
    ``"all"``, ``affine`` ``"none"``, ``"scale"`` or ``"shift_first"``; None where a variance
    of one feature cannot be unbiased)."""
    if unbiased and x.shape[-1] == 1:
        return None
    x, weight, bias = x.double(), weight.double(), bias.double()
    dims = {"token": -1, "dim0": 0, "all": tuple(range(x.dim()))}[over]
    mean, var = x.mean(dims, keepdim=True), x.var(dims, correction=int(unbiased), keepdim=True)
    x_hat = (x - mean) / (var.sqrt() + eps if eps_outside else torch.sqrt(var + eps))
    scaled = {"after": x_hat * weight + bias, "scale": x_hat * weight, "none": x_hat}
    return scaled.get(affine, (x_hat + bias) * weight)  # "shift_first"


LAYER_NORM = Oracle.of(lab04.LAYER_NORM, "layer_norm", oracle_layer_norm)
#: Features around 1e4 with a spread of 1: float32 keeps three digits of the spread (so the
#: tolerance is 1e-2), E[x^2] - E[x]^2 keeps none. Judged after the ordinary cases, so that an
#: answer wrong here alone is named as the cancellation.
LARGE_MEAN = LAYER_NORM.at(
    named=lambda case: SPEC.mistake("layer_norm ln_raw_moments").hint,
    **floats_at(SPEC.tol("large_mean")),
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
    d_ff: int,
    p: float,
    w: Mapping[str, Tensor],
    x: Tensor,
    seed: Any,
    *,
    act: str = "relu",
    residual: bool = False,
    drop: str = "hidden",
    eval_drops: bool = False,
) -> Tensor:
    """``relu(x W1^T + b1) W2^T + b2`` in float64, the hidden units dropped from ``seed``; the
    options make the mistakes: ``act`` ``"none"``, ``"gelu"`` or ``"end"`` (after linear2), the
    input added, dropout ``drop`` on ``"none"``, the ``"output"`` or the ``"input"``, dropout
    in eval mode too (from seed 0, as the check runs eval mode)."""
    seed = 0 if seed is None and eval_drops else seed
    mask: Any = 1.0
    if seed is not None and drop != "none":
        width = d_ff if drop == "hidden" else x.shape[-1]
        (mask,) = _dropout_masks(seed, [(*x.shape[:-1], width)], p, x.dtype)
    (w1, b1), (w2, b2) = linear64(w, "linear1"), linear64(w, "linear2")
    h = (x.double() * (mask if drop == "input" else 1.0)) @ w1.T + b1  # (..., F)
    h = {"relu": h.relu(), "gelu": F.gelu(h)}.get(act, h) * (mask if drop == "hidden" else 1.0)
    out = (h @ w2.T + b2) * (mask if drop == "output" else 1.0)
    return out.relu() if act == "end" else out + x.double() * residual


FEED_FORWARD = Oracle.of(
    lab04.FEED_FORWARD,
    "FeedForward",
    oracle_feed_forward,
    (
        "It matches dropout on the input x: drop the hidden units (after the ReLU).",
        {"drop": "input"},
    ),
)


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


def oracle_encoder_block(
    *args: Any,
    at: str | None = None,
    on_sum: bool = False,
    bessel: bool = False,
    norm_first: bool | None = None,
    form: str | None = None,
    skip: str = "af",
    swap: bool = False,
    norms: bool = True,
    mask: str = "",
    zero_pad: bool = False,
) -> Tensor:
    """The block in float64, post- or pre-norm; in training mode dropout at ``at`` (default:
    torch's layer's "ahf": "a" the attention output, "h" the hidden units, "f" the feed-forward
    output), its masks drawn from ``seed`` in that order. The options make the mistakes (one of
    blocks whose ``norm_first`` differs gives the right output): dropout ``on_sum`` (of the
    residual), norms that divide by ``D - 1`` (``bessel``), the ``form`` "post", "pre",
    "post_normed" (x + norm(sublayer(x))), "pre_normed" (the residual from the normed input) or
    "pre_final" (a norm at the end), residuals around the sub-layers in ``skip`` only, the norms
    swapped or none, the ``mask`` "none", "inverted" or its "first_row", padding zeroed."""
    c = BlockCase(*args)
    if norm_first is not None and norm_first != c.norm_first:
        return oracle_encoder_block(*c)
    at = ("" if c.seed is None else "ahf") if at is None else at
    B, T, D = c.x.shape
    size = {"a": (B, T, D), "h": (B, T, c.d_ff), "f": (B, T, D)}
    seq_first = c.seq_first and at[:1] == "a" and not on_sum  # else drawn on a contiguous tensor
    masks = iter(_dropout_masks(c.seed or 0, [size[k] for k in at], c.p, c.x.dtype, seq_first))
    d1, hidden, d2 = (next(masks) if k in at else (None if k == "h" else 1.0) for k in "ahf")
    x, keys = c.x.double(), c.mask
    if keys is not None and mask:
        keys = {"none": None, "inverted": ~keys.bool(), "first_row": keys.bool()[:, :, :1]}[mask]
    form = form or ("pre" if c.norm_first else "post")

    def attention(h: Tensor) -> Tensor:  # fully masked rows give zeros
        return attention64(c.w, "self_attn", h, h, c.n_heads, keys)

    def ff(h: Tensor, drop: Tensor | None = None) -> Tensor:
        return feed_forward64(h, linear64(c.w, "ff.linear1"), linear64(c.w, "ff.linear2"), drop)

    def norm(i: int, h: Tensor) -> Tensor:
        gain, shift = linear64(c.w, f"norm{3 - i if swap else i}")
        k = (D - 1) / D if bessel else 1.0  # var(D - 1) = var(D) / k
        return layer_norm64(h, gain * math.sqrt(k), shift, 1e-5 * k) if norms else h

    def add(h: Tensor, sub: Tensor, drop: Any, k: str) -> Tensor:
        h = h if k in skip else torch.zeros_like(h)
        return drop * (h + sub) if on_sum else h + drop * sub

    if form == "post":
        x = norm(1, add(x, attention(x), d1, "a"))
        out = norm(2, add(x, ff(x, hidden), d2, "f"))
    elif form == "post_normed":
        x = x + norm(1, attention(x))
        out = x + norm(2, ff(x))
    elif form == "pre_normed":
        x = norm(1, x)
        x = norm(2, x + attention(x))
        out = x + ff(x)
    else:  # "pre", "pre_final"
        x = add(x, attention(norm(1, x)), d1, "a")
        out = add(x, ff(norm(2, x), hidden), d2, "f")
        out = norm(2, out) if form == "pre_final" else out
    return out * c.mask.bool()[:, 0, 0, :, None] if zero_pad and c.mask is not None else out


#: Options of the block's oracle that place dropout: records giving them are the mistakes of
#: training mode, the others those of eval mode.
DROPOUT_OPTIONS = {"at", "on_sum"}
_BLOCK_RECORDS = SPEC.parts["EncoderBlock"].options_for(oracle_encoder_block)
#: Training mode's mistakes: dropout that never acts (the block then gives eval mode's output:
#: FeedForward's record words it), then the spec's records that place dropout elsewhere.
_TRAINING = [
    (SPEC.mistake("feed_forward FFDropoutNeverApplied").hint, {"at": ""}),
    *((hint, kw) for hint, kw in _BLOCK_RECORDS if kw.keys() & DROPOUT_OPTIONS),
]
_EVAL = [(hint, kw) for hint, kw in _BLOCK_RECORDS if not kw.keys() & DROPOUT_OPTIONS]


def encoder_block_mistakes(*args: Any) -> dict[str, Tensor]:
    """Hint -> what a typical wrong block returns (float64): in training mode the dropout
    mistakes, else the spec's others."""
    named = _TRAINING if BlockCase(*args).seed is not None else _EVAL
    return {hint: oracle_encoder_block(*args, **options) for hint, options in named}


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


def oracle_tagging_loss(
    model: nn.Module,
    batch: dict[str, Tensor],
    *,
    over: str = "real",
    unmasked: bool = False,
    labels: str = "targets",
) -> Tensor:
    """The mean cross-entropy of ``model`` on ``batch`` over the targets that are not -100
    (float64); the options make the mistakes: the mean ``over`` "all" positions, the "sum", each
    "sequence"'s mean, padding as "class_0"; logits ``unmasked``; the tokens as ``labels``."""
    real = batch["targets"] != IGNORE_INDEX
    with torch.no_grad():
        logits = model(batch["tokens"], None if unmasked else batch["padding_mask"])  # (B, T, C)
    logp = torch.log_softmax(logits.double(), dim=-1)  # (B, T, C)
    label = batch[labels].clamp(0, logits.shape[-1] - 1)  # (B, T): padding as class 0
    as_class_0 = -logp.gather(-1, label[..., None])[..., 0]  # (B, T)
    per_token = torch.where(real, as_class_0, torch.zeros_like(as_class_0))
    means = {"all": per_token.mean(), "sum": per_token.sum(), "class_0": as_class_0.mean()}
    means["sequence"] = (per_token.sum(1) / real.sum(1).clamp(min=1)).mean()  # (B,) averaged
    return means.get(over, per_token.sum() / real.sum())


def tagging_losses(model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of ``model`` on ``batch`` and hint -> a typical wrong one (the spec's records)."""
    records = SPEC.parts["TaggingModule"].options_for(oracle_tagging_loss)
    named = {h: oracle_tagging_loss(model, batch, **kw) for h, kw in records}
    return oracle_tagging_loss(model, batch), named


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


def oracle_learning_rates(
    lr: float,
    warmup_steps: int,
    total_steps: int,
    *,
    warmup: str = "linear",
    decay: str = "cosine",
) -> Tensor:
    """Learning rate of steps ``0 .. total_steps - 1`` (float64): a linear warm-up, step ``s``
    at ``lr * (s + 1) / warmup_steps``, then a cosine from ``lr`` to 0 at ``total_steps``. The
    options make the mistakes: the ``warmup`` "none" (the cosine from step 0 over every step),
    "from_zero" (``lr * s / warmup_steps``) or "one_long" (torch's ``LinearLR`` over
    ``warmup_steps`` iterations, not ``warmup_steps - 1``); the ``decay`` "constant" (``lr``),
    "linear" or "long_cosine" (a cosine of length ``total_steps``)."""
    w, n = warmup_steps, total_steps
    rises: dict[str, Callable[[int], float]] = {
        "linear": lambda s: lr * (s + 1) / w,
        "from_zero": lambda s: lr * s / w,
        "one_long": lambda s: lr * (1 / w + (1 - 1 / w) * s / w),
        "none": lambda s: _cosine(lr, s, 0, n),
    }
    falls: dict[str, Callable[[int], float]] = {
        "cosine": lambda s: _cosine(lr, s, w, n - w),
        "constant": lambda s: lr,
        "linear": lambda s: lr * (n - s) / (n - w),
        "long_cosine": lambda s: _cosine(lr, s, w, n),
    }
    rise = rises[warmup]
    fall = rise if warmup == "none" else falls[decay]
    return torch.tensor([rise(s) if s < w else fall(s) for s in range(n)], dtype=torch.float64)


#: The spec's wrong schedules. Those of the warm-up's start and length are tried only where the
#: warm-up has more than one step: a one-step warm-up one step too long is the right schedule,
#: and one starting at 0 only zeroes step 0.
_SCHEDULES = SPEC.parts["TaggingModule"].options_for(oracle_learning_rates)
_LONG_WARMUP_ONLY = ("from_zero", "one_long")


def schedule_mistakes(lr: float, warmup_steps: int, total_steps: int) -> dict[str, Tensor]:
    """Hint -> the learning rates a typical wrong schedule gives (float64)."""
    return {
        hint: oracle_learning_rates(lr, warmup_steps, total_steps, **options)
        for hint, options in _SCHEDULES
        if warmup_steps > 1 or options.get("warmup") not in _LONG_WARMUP_ONLY
    }


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

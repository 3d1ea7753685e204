"""Lab 04 checks against a catalogue of typical mistakes and of correct variants (no nbgrader).

Each wrong implementation below is one a student plausibly writes. The tests assert exactly which
checks it fails (visible and hidden) and that each message names the mistake; correct variants
written differently (var_mean, einsum, loops, float64, nn.MultiheadAttention, functional dropout,
LambdaLR instead of SequentialLR...) must pass every check. A function that calls PyTorch's or
the kit's version earns nothing, and ``NotImplementedError`` says "not implemented yet".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from check_support import assert_fails, run_checks
from matplotlib.figure import Figure
from torch import Tensor, nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, SequentialLR

from transformer_lab import blocks
from transformer_lab.attention import MultiHeadAttention
from transformer_lab.checks import lab04
from transformer_lab.grading.hidden import lab04 as hidden04

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- layer_norm

LN_CHECKS: dict[str, Callable[[Any], None]] = {
    "visible": lab04.check_layer_norm,
    "hidden": lambda fn: hidden04.hidden_check_layer_norm(fn, seed=401),
    "numerics": lambda fn: hidden04.hidden_check_layer_norm_numerics(fn, seed=402),
}


def ln_mean_var(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return weight * (x - mean) / torch.sqrt(var + eps) + bias


def ln_var_mean(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
    return torch.addcmul(bias, weight, (x - mean) * torch.rsqrt(var + eps))


def ln_einsum(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    d = x.shape[-1]
    centred = x - torch.einsum("...d->...", x)[..., None] / d
    var = torch.einsum("...d,...d->...", centred, centred)[..., None] / d
    return centred / (var + eps).sqrt() * weight + bias


def ln_loops(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    rows = x.reshape(-1, x.shape[-1])  # (N, D)
    out = torch.empty_like(rows)
    for i, row in enumerate(rows):
        mean = sum(row.tolist()) / len(row)
        var = sum((v - mean) ** 2 for v in row.tolist()) / len(row)
        out[i] = (row - mean) / math.sqrt(var + eps) * weight + bias
    return out.reshape(x.shape)


def ln_in_float64(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    return ln_mean_var(x.double(), weight.double(), bias.double(), eps).to(x.dtype)


def ln_std(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    std = torch.sqrt(x.var(-1, correction=0, keepdim=True) + eps)
    return (x - x.mean(-1, keepdim=True)) / std * weight + bias


def ln_wrong_axis(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    mean = x.mean(0, keepdim=True)
    var = x.var(0, unbiased=False, keepdim=True)
    return weight * (x - mean) / torch.sqrt(var + eps) + bias


def ln_whole_tensor(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    return weight * (x - x.mean()) / torch.sqrt(x.var(unbiased=False) + eps) + bias


def ln_eps_outside(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    mean = x.mean(-1, keepdim=True)
    std = x.std(-1, unbiased=False, keepdim=True)
    return weight * (x - mean) / (std + eps) + bias


def ln_unbiased(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True)  # torch.var defaults to the unbiased estimate
    return weight * (x - mean) / torch.sqrt(var + eps) + bias


def ln_no_affine(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)


def ln_no_bias(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    return ln_no_affine(x, weight, bias, eps) * weight


def ln_shift_then_scale(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    return (ln_no_affine(x, weight, bias, eps) + bias) * weight


def ln_raw_moments(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    mean = x.mean(-1, keepdim=True)
    var = (x**2).mean(-1, keepdim=True) - mean**2
    return weight * (x - mean) / torch.sqrt(var + eps) + bias


def ln_no_keepdim(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    mean = x.mean(-1)
    var = x.var(-1, unbiased=False)
    return weight * (x - mean) / torch.sqrt(var + eps) + bias


def ln_calls_torch(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def ln_uses_module(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    norm = nn.LayerNorm(x.shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight.copy_(weight)
        norm.bias.copy_(bias)
    return norm(x)


def ln_group_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    d = x.shape[-1]
    return F.group_norm(x.reshape(-1, d), 1, weight, bias, eps).reshape(x.shape)


def ln_batch_norm_of_transpose(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5
) -> Tensor:
    rows = x.reshape(-1, x.shape[-1])  # (N, D): each token is one "channel" of a (1, N, D) batch
    normed = F.batch_norm(rows[None], None, None, training=True, eps=eps)[0]
    return (normed * weight + bias).reshape(x.shape)


def ln_kit(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    return blocks.layer_norm(x, weight, bias, eps)


def ln_not_implemented(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    raise NotImplementedError()


@pytest.mark.parametrize(
    "fn", [ln_mean_var, ln_var_mean, ln_einsum, ln_loops, ln_in_float64, ln_std]
)
def test_correct_layer_norms_pass_every_check(fn: Callable[..., Tensor]) -> None:
    assert run_checks(LN_CHECKS, fn) == dict.fromkeys(LN_CHECKS, "")


LN_MISTAKES = [
    (ln_wrong_axis, ["visible", "hidden", "numerics"], "the last dimension"),
    (ln_whole_tensor, ["visible", "hidden", "numerics"], "per token, over the last"),
    (ln_eps_outside, ["visible", "numerics"], "inside the square root"),
    (ln_unbiased, ["visible", "hidden", "numerics"], "biased variance"),
    (ln_no_affine, ["visible", "hidden", "numerics"], "multiply by weight and add bias"),
    (ln_no_bias, ["visible", "hidden", "numerics"], "without the bias"),
    (ln_shift_then_scale, ["visible", "hidden", "numerics"], "scale first, then shift"),
    (ln_raw_moments, ["numerics"], "centred values"),
    (ln_no_keepdim, ["visible", "hidden", "numerics"], "keepdim=True"),
]


@pytest.mark.parametrize(("fn", "failing", "words"), LN_MISTAKES)
def test_layer_norm_mistakes_fail_with_a_message_naming_them(
    fn: Callable[..., Tensor], failing: list[str], words: str
) -> None:
    assert_fails(LN_CHECKS, fn, failing, words)


@pytest.mark.parametrize(
    "fn", [ln_calls_torch, ln_uses_module, ln_group_norm, ln_batch_norm_of_transpose, ln_kit]
)
def test_layer_norms_that_call_a_normalisation_earn_nothing(fn: Callable[..., Tensor]) -> None:
    # F.group_norm(x.reshape(-1, D), 1) computes layer norm exactly: the op family refuses it.
    outcomes = run_checks(LN_CHECKS, fn)
    assert all("does not allow" in msg for msg in outcomes.values()), outcomes
    x = torch.randn(3, 5)
    torch.testing.assert_close(fn(x, torch.ones(5), torch.zeros(5)), ln_mean_var(x, 1, 0))


def test_layer_norm_not_implemented_says_so() -> None:
    outcomes = run_checks(LN_CHECKS, ln_not_implemented)
    assert all("not implemented yet" in msg for msg in outcomes.values()), outcomes


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_layer_norm_hidden_checks_pass_for_every_seed(seed: int) -> None:
    hidden04.hidden_check_layer_norm(ln_var_mean, seed=seed)
    hidden04.hidden_check_layer_norm_numerics(ln_var_mean, seed=seed)


# ---------------------------------------------------------------- FeedForward

FF_CHECKS: dict[str, Callable[[Any], None]] = {
    "visible": lab04.check_feed_forward,
    "hidden": lambda cls: hidden04.hidden_check_feed_forward(cls, seed=421),
    "dropout": lambda cls: hidden04.hidden_check_feed_forward_dropout(cls, seed=422),
}


class FeedForward(nn.Module):
    """Correct: nn.Linear, nn.ReLU and nn.Dropout modules."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.act = nn.ReLU()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.act(self.linear1(x))))


class FFFunctional(FeedForward):
    """Correct, written differently: clamp for ReLU, functional dropout with the training flag."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__(d_model, d_ff, dropout)
        self.p = dropout

    def forward(self, x: Tensor) -> Tensor:
        h = torch.clamp(x @ self.linear1.weight.T + self.linear1.bias, min=0)
        return self.linear2(F.dropout(h, self.p, training=self.training))


class FFDropoutBeforeRelu(FeedForward):
    """Correct: ReLU and dropout commute (dropout only zeroes and scales by a positive factor)."""

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(F.relu(self.dropout(self.linear1(x))))


class FFNoActivation(FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.linear1(x)))


class FFActivationAtEnd(FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.linear2(self.dropout(self.linear1(x))))


class FFGelu(FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(F.gelu(self.linear1(x))))


class FFWithResidual(FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return x + super().forward(x)


class FFHiddenSizeDModel(FeedForward):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__(d_model, d_model, dropout)


class FFDropoutNeverApplied(FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(F.relu(self.linear1(x)))


class FFDropoutAlwaysOn(FFFunctional):
    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(F.dropout(F.relu(self.linear1(x)), self.p))  # training=True always


class FFDropoutOnOutput(FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.linear2(F.relu(self.linear1(x))))


class FFDropoutOnInput(FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(F.relu(self.linear1(self.dropout(x))))


class FFSequential(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class FFNotAModule:
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        self.linear1 = nn.Linear(d_model, d_ff)


class FFKit(FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        kit = blocks.FeedForward(x.shape[-1], self.linear1.out_features)
        kit.load_state_dict({k: v for k, v in self.state_dict().items() if "linear" in k})
        return kit(x)


class FFNotImplemented(FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        raise NotImplementedError()


@pytest.mark.parametrize("cls", [FeedForward, FFFunctional, FFDropoutBeforeRelu])
def test_correct_feed_forwards_pass_every_check(cls: type) -> None:
    assert run_checks(FF_CHECKS, cls) == dict.fromkeys(FF_CHECKS, "")


FF_MISTAKES = [
    (FFNoActivation, ["visible", "hidden", "dropout"], "no nonlinearity"),
    (FFActivationAtEnd, ["visible", "hidden", "dropout"], "goes between the layers"),
    (FFGelu, ["visible", "hidden", "dropout"], "GELU"),
    (FFWithResidual, ["visible", "hidden", "dropout"], "residual belongs to the block"),
    (FFHiddenSizeDModel, ["visible", "hidden", "dropout"], "d_ff"),
    (FFDropoutNeverApplied, ["visible", "dropout"], "output of eval mode"),
    (FFDropoutAlwaysOn, ["visible", "dropout"], "eval mode"),
    (FFDropoutOnOutput, ["visible", "dropout"], "d_ff"),
    (FFSequential, ["visible", "hidden", "dropout"], "no parameter `linear1.weight`"),
    (FFNotAModule, ["visible", "hidden", "dropout"], "nn.Module"),
]


@pytest.mark.parametrize(("cls", "failing", "words"), FF_MISTAKES)
def test_feed_forward_mistakes_fail_with_a_message_naming_them(
    cls: type, failing: list[str], words: str
) -> None:
    assert_fails(FF_CHECKS, cls, failing, words)


def test_hidden_dropout_check_names_the_misplaced_dropouts() -> None:
    outcomes = run_checks(FF_CHECKS, FFDropoutOnOutput)
    assert "dropout on the output of linear2" in outcomes["dropout"]
    outcomes = run_checks(FF_CHECKS, FFDropoutOnInput)
    assert sorted(n for n, m in outcomes.items() if m) == ["dropout", "visible"]
    assert "dropout on the input x" in outcomes["dropout"]


def test_feed_forward_that_calls_the_kit_earns_nothing() -> None:
    outcomes = run_checks(FF_CHECKS, FFKit)
    assert all("does not allow" in msg for msg in outcomes.values()), outcomes
    outcomes = run_checks(FF_CHECKS, blocks.FeedForward)
    assert all("does not allow" in msg for msg in outcomes.values()), outcomes


def test_feed_forward_not_implemented_says_so() -> None:
    outcomes = run_checks(FF_CHECKS, FFNotImplemented)
    assert all("not implemented yet" in msg for msg in outcomes.values()), outcomes


def test_the_feed_forward_oracle_is_torchs_layer_in_training_mode() -> None:
    """Same seed, same dropout mask: the oracle is nn.TransformerEncoderLayer's FF."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 24, dropout=0.5, batch_first=True).train()
    w = {k: v for k, v in layer.state_dict().items() if k.startswith("linear")}
    x = torch.randn(2, 5, 8)
    torch.manual_seed(3)
    theirs = layer.linear2(layer.dropout(layer.activation(layer.linear1(x))))
    ours = hidden04.oracle_feed_forward(24, 0.5, w, x, 3)
    torch.testing.assert_close(ours, theirs.double(), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- EncoderBlock


class Attention(nn.Module):
    """A correct multi-head attention in the kit's layout (q/k/v/out projections, True = attend)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        B, T, D = query.shape
        S, H = key.shape[1], self.n_heads
        q = self.q_proj(query).view(B, T, H, D // H).transpose(1, 2)  # (B, H, T, Dh)
        k = self.k_proj(key).view(B, S, H, D // H).transpose(1, 2)  # (B, H, S, Dh)
        v = self.v_proj(value).view(B, S, H, D // H).transpose(1, 2)  # (B, H, S, Dh)
        scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(D // H)  # (B, H, T, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return self.out_proj(out), weights


class BesselNorm(nn.LayerNorm):
    """Wrong: a layer norm dividing by D - 1 (``x.var()``'s default, Bessel's correction)."""

    def forward(self, x: Tensor) -> Tensor:
        var = x.var(-1, keepdim=True)  # unbiased
        return (x - x.mean(-1, keepdim=True)) / torch.sqrt(var + self.eps) * self.weight + self.bias


class Block(nn.Module):
    """A correct encoder block; ``mistake`` switches in one typical error."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        *,
        mistake: str | None = None,
        attention: str = "kit",
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.mistake = mistake
        self.attention = attention
        self.n_heads = n_heads
        if attention == "torch":
            self.self_attn: nn.Module = nn.MultiheadAttention(
                d_model, n_heads, dropout=dropout, batch_first=True
            )
        elif attention == "own":
            self.self_attn = Attention(d_model, n_heads)
        else:
            self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        ff_dropout = 0.0 if mistake in ("ff_without_dropout", "no_dropout") else dropout
        self.ff = FeedForward(d_model, d_ff, ff_dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = self.norm1 if mistake == "shared_norm" else nn.LayerNorm(d_model)
        if mistake == "bessel_norm":
            self.norm1, self.norm2 = BesselNorm(d_model), BesselNorm(d_model)
        p = 0.0 if mistake == "no_dropout" else dropout
        self.dropout1 = nn.Dropout(p)
        self.dropout2 = nn.Dropout(p)

    def _sa(self, h: Tensor, mask: Tensor | None) -> Tensor:
        m = self.mistake
        if m == "mask_ignored":
            mask = None
        if m == "mask_inverted" and mask is not None:
            mask = ~mask
        if m == "mask_first_row" and mask is not None:
            mask = mask[:, :, :1, :]
        if self.attention == "torch":
            B, T, _ = h.shape
            attn_mask = None
            if mask is not None:  # (B*H, T, S), True = may NOT attend
                attn_mask = ~mask.expand(B, self.n_heads, T, T).reshape(B * self.n_heads, T, T)
            out = self.self_attn(h, h, h, attn_mask=attn_mask, need_weights=False)[0]
        else:
            out = self.self_attn(h, h, h, mask=mask)[0]
        if m in ("no_dropout1", "dropout_after_sum"):
            return out
        if m == "dropout_always_on":
            return F.dropout(out, self.dropout1.p)
        return self.dropout1(out)

    def _ff(self, h: Tensor) -> Tensor:
        out = self.ff(h)
        if self.mistake in ("no_dropout2", "dropout_after_sum"):
            return out
        return self.dropout2(out)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        m = self.mistake
        norm_first = self.norm_first
        if m == "always_post":
            norm_first = False
        if m == "always_pre":
            norm_first = True
        n1, n2 = (self.norm2, self.norm1) if m == "norms_swapped" else (self.norm1, self.norm2)
        if norm_first:
            if m == "pre_residual_of_normed":
                h = n1(x)
                x = h + self._sa(h, mask)
                h = n2(x)
                return h + self._ff(h)
            if m == "no_residual":
                x = self._sa(n1(x), mask)
                return self._ff(n2(x))
            if m == "dropout_after_sum":
                x = self.dropout1(x + self._sa(n1(x), mask))
                return self.dropout2(x + self._ff(n2(x)))
            x = x + self._sa(n1(x), mask)
            out = x + self._ff(n2(x))
            if m == "final_norm_inside":
                out = n2(out)
            return out
        if m == "no_residual":
            x = n1(self._sa(x, mask))
            return n2(self._ff(x))
        if m == "no_norms":
            x = x + self._sa(x, mask)
            return x + self._ff(x)
        if m == "norm_then_add":
            x = x + n1(self._sa(x, mask))
            return x + n2(self._ff(x))
        if m == "dropout_after_sum":
            x = n1(self.dropout1(x + self._sa(x, mask)))
            return n2(self.dropout2(x + self._ff(x)))
        residual = 0.0 if m == "no_attention_residual" else x
        x = n1(residual + self._sa(x, mask))
        out = n2(self._ff(x)) if m == "no_ff_residual" else n2(x + self._ff(x))
        if m == "zero_padding" and mask is not None:
            out = out * mask[:, 0, 0, :, None]
        return out


class BlockSharedDropout(Block):
    """Correct, written differently: one nn.Dropout used for both sub-layers, F.layer_norm norms
    held in a small module of its own, and the residual written with torch.add."""

    class Norm(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))
            self.bias = nn.Parameter(torch.zeros(d))

        def forward(self, x: Tensor) -> Tensor:
            return ln_var_mean(x, self.weight, self.bias)

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False) -> None:  # fmt: skip
        super().__init__(d_model, n_heads, d_ff, dropout, norm_first)
        self.norm1, self.norm2 = self.Norm(d_model), self.Norm(d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        def attend(h: Tensor) -> Tensor:
            return self.drop(self.self_attn(h, h, h, mask)[0])

        if self.norm_first:
            x = torch.add(x, attend(self.norm1(x)))
            return torch.add(x, self.drop(self.ff(self.norm2(x))))
        x = self.norm1(torch.add(x, attend(x)))
        return self.norm2(torch.add(x, self.drop(self.ff(x))))


def block_with(**options: Any) -> Callable[..., nn.Module]:
    def make(*args: Any, **kwargs: Any) -> nn.Module:
        return Block(*args, **kwargs, **options)

    return make


class BlockWrappingTorch(nn.TransformerEncoderLayer):
    """Wrong: hands the work to torch's own layer (and has torch's attribute names)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False) -> None:  # fmt: skip
        super().__init__(d_model, n_heads, d_ff, dropout, batch_first=True, norm_first=norm_first)


class BlockWithTorchInside(Block):
    """Wrong: the kit's attribute names, but the computation is torch's layer."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False) -> None:  # fmt: skip
        super().__init__(d_model, n_heads, d_ff, dropout, norm_first)
        self.inner = nn.TransformerEncoderLayer(
            d_model, n_heads, d_ff, dropout, batch_first=True, norm_first=norm_first
        )

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return self.inner(x)


class BlockWithKitBlockInside(Block):
    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        kit = blocks.EncoderBlock(x.shape[-1], self.n_heads, self.ff.linear1.out_features)
        return kit(x, mask)


class BlockNotImplemented(Block):
    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        raise NotImplementedError()


BLOCK_CHECKS: dict[str, Callable[[Any], None]] = {
    "visible": lab04.check_encoder_block,
    "dropout": lab04.check_encoder_block_dropout,
    "post": lambda cls: hidden04.hidden_check_encoder_block_post_norm(cls, seed=431),
    "pre": lambda cls: hidden04.hidden_check_encoder_block_pre_norm(cls, seed=432),
    "mask": lambda cls: hidden04.hidden_check_encoder_block_mask(cls, seed=433),
}


@pytest.mark.parametrize(
    "cls",
    [
        Block,
        block_with(attention="own"),
        block_with(attention="torch"),
        BlockSharedDropout,
    ],
    ids=["kit_attention", "own_attention", "nn_multihead_attention", "shared_dropout"],
)
def test_correct_blocks_pass_every_check(cls: Callable[..., nn.Module]) -> None:
    assert run_checks(BLOCK_CHECKS, cls) == dict.fromkeys(BLOCK_CHECKS, "")


_ALL_BUT_PRE = ["visible", "dropout", "post", "mask"]
_ALL_BUT_POST = ["visible", "dropout", "pre", "mask"]
_TRAINING = ["dropout", "post", "pre"]  # the checks that run blocks in training mode


BLOCK_MISTAKES = [
    ("no_residual", [*_ALL_BUT_PRE, "pre"], "without residuals"),
    ("no_attention_residual", _ALL_BUT_PRE, "attention sub-layer has no residual"),
    ("no_ff_residual", _ALL_BUT_PRE, "feed-forward sub-layer has no residual"),
    ("always_post", _ALL_BUT_POST, "norm_first=True your block computes post-norm"),
    ("always_pre", _ALL_BUT_PRE, "norm_first=False your block computes pre-norm"),
    ("norms_swapped", ["visible", "post", "pre", "mask"], "norm1 and norm2 swapped"),
    ("pre_residual_of_normed", _ALL_BUT_POST, "residual adds the normalised input"),
    ("no_norms", _ALL_BUT_PRE, "no layer norm at all"),
    ("norm_then_add", _ALL_BUT_PRE, "Add & Norm adds first"),
    ("final_norm_inside", _ALL_BUT_POST, "normalises the block's output"),
    ("mask_ignored", [*_ALL_BUT_PRE, "pre"], "without the mask"),
    ("mask_inverted", [*_ALL_BUT_PRE, "pre"], "inverted mask"),
    ("zero_padding", _ALL_BUT_PRE, "zeroes the outputs at padded positions"),
    ("mask_first_row", ["mask"], "first query row of the mask"),
    ("shared_norm", [*_ALL_BUT_PRE, "pre"], "one and the same LayerNorm"),
    ("bessel_norm", [*_ALL_BUT_PRE, "pre"], "Bessel's correction"),
    ("ff_without_dropout", _TRAINING, "FeedForward has no dropout"),
    ("no_dropout1", _TRAINING, "without dropout on the attention output"),
    ("no_dropout2", _TRAINING, "without dropout on the feed-forward output"),
    ("dropout_after_sum", _TRAINING, "dropout applied to the residual sum"),
    ("no_dropout", _TRAINING, "gives the output of eval mode"),
]


@pytest.mark.parametrize(("mistake", "failing", "words"), BLOCK_MISTAKES)
def test_block_mistakes_fail_with_a_message_naming_them(
    mistake: str, failing: list[str], words: str
) -> None:
    outcomes = run_checks(BLOCK_CHECKS, block_with(mistake=mistake))
    assert sorted(n for n, msg in outcomes.items() if msg) == sorted(failing), outcomes
    for name in failing:
        if name != "dropout":  # both forms in one diagnosis: a mistake of each may go unnamed
            assert words in outcomes[name], (name, outcomes[name])


@pytest.mark.parametrize(
    ("mistake", "words"),
    [
        *((m, words) for m, failing, words in BLOCK_MISTAKES if failing == _TRAINING),
        ("dropout_always_on", "eval mode"),
    ],
)
def test_dropout_mistakes_fail_the_training_mode_checks_only(mistake: str, words: str) -> None:
    outcomes = run_checks(BLOCK_CHECKS, block_with(mistake=mistake))
    failing = sorted(n for n, msg in outcomes.items() if msg)
    assert failing == _TRAINING, outcomes
    for name in ("post", "pre"):
        assert words in outcomes[name], (name, outcomes[name])


def test_dropout_mistakes_are_caught_with_torchs_attention_too() -> None:
    outcomes = run_checks(BLOCK_CHECKS, block_with(attention="torch", mistake="no_dropout1"))
    assert sorted(n for n, msg in outcomes.items() if msg) == ["dropout", "post", "pre"]
    assert "without dropout on the attention output" in outcomes["post"]


@pytest.mark.parametrize(
    "cls", [BlockWrappingTorch, BlockWithTorchInside, BlockWithKitBlockInside, blocks.EncoderBlock]
)
def test_blocks_that_call_a_ready_layer_earn_nothing(cls: type) -> None:
    outcomes = run_checks(BLOCK_CHECKS, cls)
    assert all("does not allow" in msg or "no attribute" in msg for msg in outcomes.values()), (
        outcomes
    )


def test_block_with_wrong_attribute_names_is_told_the_names() -> None:
    class Renamed(Block):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.ffn = self.ff
            del self.ff

        def _ff(self, h: Tensor) -> Tensor:
            return self.dropout2(self.ffn(h))

    outcomes = run_checks(BLOCK_CHECKS, Renamed)
    assert all("no attribute(s) ff" in msg and "self.ff" in msg for msg in outcomes.values())


def test_block_not_implemented_says_so() -> None:
    outcomes = run_checks(BLOCK_CHECKS, BlockNotImplemented)
    assert all("not implemented yet" in msg for msg in outcomes.values()), outcomes


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_block_hidden_checks_pass_for_every_seed(seed: int) -> None:
    hidden04.hidden_check_encoder_block_post_norm(Block, seed=seed)
    hidden04.hidden_check_encoder_block_pre_norm(Block, seed=seed)
    hidden04.hidden_check_encoder_block_mask(Block, seed=seed)


def _torch_layer_like(w: dict[str, Tensor], n_heads: int, norm_first: bool, p: float) -> nn.Module:
    """torch's encoder layer holding the weights ``w`` (kit layout), attention dropout off."""
    d, d_ff = w["norm1.weight"].shape[0], w["ff.linear1.weight"].shape[0]
    layer = nn.TransformerEncoderLayer(
        d, n_heads, d_ff, p, batch_first=True, norm_first=norm_first
    )  # fmt: skip
    layer.self_attn.dropout = 0.0
    qkv = {
        f"self_attn.in_proj_{kind}": torch.cat([w[f"self_attn.{n}_proj.{kind}"] for n in "qkv"])
        for kind in ("weight", "bias")
    }
    layer.load_state_dict(
        qkv
        | {k.removeprefix("ff."): v for k, v in w.items() if "_proj." not in k or "out_proj" in k}
    )
    return layer


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("attention", ["kit", "torch"])
def test_the_oracle_is_torchs_encoder_layer(norm_first: bool, attention: str) -> None:
    """The hidden oracle (float64, written out) reproduces nn.TransformerEncoderLayer, in eval
    mode and, with one seed, in training mode: the dropout masks fall where torch's layer puts
    them."""
    w = hidden04.random_weights(12, 20, torch.Generator().manual_seed(0), "self_attn")
    layer = _torch_layer_like(w, 3, norm_first, 0.4)
    x = torch.randn(3, 6, 12)
    keep = torch.arange(6)[None, :] < torch.tensor([6, 4, 2])[:, None]
    case = (3, 20, norm_first, 0.4, w, x, keep[:, None, None, :])
    with torch.no_grad():
        layer.eval()
        theirs = layer(x, src_key_padding_mask=~keep)
    oracle = hidden04.oracle_encoder_block(*case, None)
    real = keep  # torch's eval fast path leaves padded positions undefined (zero)
    torch.testing.assert_close(oracle[real], theirs[real].double(), atol=1e-5, rtol=1e-5)
    # Training mode, one seed: dropout falls where torch's layer puts it. Dropout draws its mask
    # in memory order, and nn.MultiheadAttention returns a transposed view: with the kit's
    # attention the student's block (contiguous) is the thing to compare with.
    if attention == "torch":
        with torch.no_grad():
            layer.train()
            torch.manual_seed(9)
            theirs = layer(x, src_key_padding_mask=~keep)
    else:  # the student's block as the checks run it (the attention's own dropout off)
        block = Block(12, 3, 20, 0.4, norm_first, attention=attention)
        lab04.load_weights(block, w, "the block")
        kwargs = {"mask": case[-1]}
        theirs = lab04.run_module(block, "the block", x, kwargs, ban=lab04.BLOCK_BAN, seed=9)
    expected = hidden04.oracle_encoder_block(*case, 9, attention == "torch")
    torch.testing.assert_close(expected, theirs.double(), atol=1e-5, rtol=1e-5)


def test_oracles_agree_with_the_kit() -> None:
    torch.manual_seed(1)
    x, w, b = torch.randn(4, 3, 7), torch.randn(7), torch.randn(7)
    torch.testing.assert_close(
        hidden04.layer_norm64(x, w, b), blocks.layer_norm(x.double(), w.double(), b.double())
    )
    kit = blocks.EncoderBlock(8, 2, 16, norm_first=True).eval()
    weights = hidden04.random_weights(8, 16, torch.Generator().manual_seed(1), "self_attn")
    lab04.load_weights(kit, weights, "the kit's block")
    mask = (torch.arange(5)[None, :] < torch.tensor([5, 2])[:, None])[:, None, None, :]
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        torch.testing.assert_close(
            hidden04.oracle_encoder_block(2, 16, True, 0.0, weights, x, mask, None),
            kit(x, mask).double(),
            atol=1e-5,
            rtol=1e-5,
        )


def test_masked_keys_out_score_the_real_ones_in_the_mask_check() -> None:
    """The mask check's inputs make every padded key the best-scoring key: a mask that is
    ignored, inverted or applied after the softmax changes the output completely."""
    g = torch.Generator().manual_seed(0)
    for norm_first in (False, True):
        keep = torch.arange(6)[None, :] < torch.tensor([6, 4, 1])[:, None]
        w, x = hidden04.outscoring_case(g, 2, 16, keep, norm_first=norm_first)
        block = Block(x.shape[-1], 2, 16, norm_first=norm_first)
        lab04.load_weights(block, w, "the block")
        with torch.no_grad():
            h = block.norm1(x) if norm_first else x
            _, weights = block.self_attn(h, h, h)  # no mask: the padded keys take the weight
        padded = ~keep[:, None, None, :]  # (B, 1, 1, S)
        rows = (weights * padded).sum(-1)  # (B, H, T): the weight each query gives to padding
        assert float(rows[1:].min()) > 0.99  # the sequences with padding: nearly all of it


# ---------------------------------------------------------------- TaggingModule


class TaggingModule(L.LightningModule):
    """The notebook's solution: SequentialLR of LinearLR and CosineAnnealingLR."""

    def __init__(self, model: nn.Module, lr: float = 3e-3, weight_decay: float = 0.01,
                 warmup_steps: int = 20, total_steps: int = 200) -> None:  # fmt: skip
        super().__init__()
        self.model = model
        self.save_hyperparameters(ignore=["model"])

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        return self.model(tokens, padding_mask)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Any:
        logits = self(batch["tokens"], batch["padding_mask"])  # (B, T, C)
        loss = F.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())
        self.log("train_loss", loss.detach(), prog_bar=True)
        return loss

    def _groups(self) -> list[dict[str, Any]]:
        params = [p for p in self.parameters() if p.requires_grad]
        decay = self.hparams.weight_decay
        return [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]

    def _scheduler(self, optimizer: torch.optim.Optimizer) -> Any:
        w, total = self.hparams.warmup_steps, self.hparams.total_steps
        warmup = LinearLR(optimizer, start_factor=1 / w, total_iters=w - 1)
        cosine = CosineAnnealingLR(optimizer, T_max=total - w)
        return SequentialLR(optimizer, [warmup, cosine], milestones=[w])

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self._groups(), lr=self.hparams.lr)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": self._scheduler(optimizer), "interval": "step"},
        }


def _lambda(w: int, total: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < w:
            return (step + 1) / w
        return 0.5 * (1 + math.cos(math.pi * (step - w) / (total - w)))

    return factor


class ModuleLambda(TaggingModule):
    """Correct, written differently: transpose for the loss, {"loss": ...}, LambdaLR, ndim."""

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Any:
        logits = self.model(batch["tokens"], padding_mask=batch["padding_mask"])
        loss = F.cross_entropy(logits.transpose(1, 2), batch["targets"], ignore_index=-100)
        self.log("train_loss", loss)  # Lightning detaches it (enable_graph=False)
        return {"loss": loss}

    def configure_optimizers(self) -> Any:
        named = list(self.model.named_parameters())
        decay = self.hparams.weight_decay
        optimizer = torch.optim.AdamW(
            [
                {"params": [p for _, p in named if p.ndim > 1], "weight_decay": decay},
                {"params": [p for _, p in named if p.ndim <= 1], "weight_decay": 0.0},
            ],
            lr=self.hparams.lr,
        )
        hp = self.hparams
        scheduler = LambdaLR(optimizer, _lambda(hp.warmup_steps, hp.total_steps))
        return [optimizer], [{"scheduler": scheduler, "interval": "step", "frequency": 1}]


class ModuleMistake(TaggingModule):
    """The solution with one typical mistake."""

    mistake = ""

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Any:
        m = self.mistake
        logits = self.model(batch["tokens"], None if m == "no_mask" else batch["padding_mask"])
        flat, targets = logits.flatten(0, 1), batch["targets"].flatten()
        if m == "mean_over_padding":
            loss = F.cross_entropy(flat, targets, reduction="none").mean()
        elif m == "sum":
            loss = F.cross_entropy(flat, targets, reduction="sum")
        elif m == "per_sequence":
            per = F.cross_entropy(logits.transpose(1, 2), batch["targets"], reduction="none")
            real = (batch["targets"] != -100).float()
            loss = ((per * real).sum(1) / real.sum(1)).mean()
        elif m == "clamped_targets":
            loss = F.cross_entropy(flat, targets.clamp(min=0))
        elif m == "tokens_as_targets":
            tokens = batch["tokens"].masked_fill(~batch["padding_mask"], -100).flatten()
            loss = F.cross_entropy(flat, tokens)
        else:
            loss = F.cross_entropy(flat, targets)
        if m == "kit":
            from transformer_lab.training.modules import token_cross_entropy

            loss = token_cross_entropy(logits, batch["targets"], -100)
        logged: Any = loss.detach()
        if m == "log_item":
            logged = loss.item()
        if m != "no_log":
            name = "loss" if m == "log_name" else "train_loss"
            options = {"enable_graph": True} if m == "enable_graph" else {}
            self.log(name, loss if m == "enable_graph" else logged, **options)
        if m == "keeps_graph":
            self.history = [*getattr(self, "history", []), loss]
        if m == "returns_item":
            return loss.item()
        if m == "returns_detached":
            return loss.detach()
        return loss

    def configure_optimizers(self) -> Any:
        m = self.mistake
        hp = self.hparams
        groups = self._groups()
        if m == "decay_everything":
            groups = [{"params": list(self.parameters()), "weight_decay": hp.weight_decay}]
        elif m == "decay_by_name":
            named = list(self.named_parameters())
            weights = [p for n, p in named if n.endswith("weight")]
            others = [p for n, p in named if not n.endswith("weight")]
            groups = [
                {"params": weights, "weight_decay": hp.weight_decay},
                {"params": others, "weight_decay": 0.0},
            ]
        elif m == "no_decay":
            groups = [{"params": list(self.parameters()), "weight_decay": 0.0}]
        elif m == "subset":
            groups = groups[:1]
        if m == "adam":
            optimizer: torch.optim.Optimizer = torch.optim.Adam(groups, lr=hp.lr)
        else:
            optimizer = torch.optim.AdamW(groups, lr=hp.lr)
        w, total = hp.warmup_steps, hp.total_steps
        if m == "no_scheduler":
            return optimizer
        if m == "per_epoch":
            return {"optimizer": optimizer, "lr_scheduler": self._scheduler(optimizer)}
        rules = {
            "no_warmup": lambda s: 0.5 * (1 + math.cos(math.pi * s / total)),
            "warmup_from_zero": lambda s: s / w if s < w else _lambda(w, total)(s),
            "constant_after": lambda s: (s + 1) / w if s < w else 1.0,
            "linear_decay": lambda s: (s + 1) / w if s < w else (total - s) / (total - w),
            "long_cosine": lambda s: (
                (s + 1) / w if s < w else 0.5 * (1 + math.cos(math.pi * (s - w) / total))
            ),
        }
        if m in rules:
            scheduler: Any = LambdaLR(optimizer, rules[m])
        elif m == "linear_lr_too_long":
            warmup = LinearLR(optimizer, start_factor=1 / w, total_iters=w)
            cosine = CosineAnnealingLR(optimizer, T_max=total - w)
            scheduler = SequentialLR(optimizer, [warmup, cosine], milestones=[w])
        elif m == "kit":
            from transformer_lab.training.schedule import warmup_cosine_scheduler

            scheduler = warmup_cosine_scheduler(optimizer, w, total)
        else:
            scheduler = self._scheduler(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }


def module_with(mistake: str) -> type:
    return type(f"Module_{mistake}", (ModuleMistake,), {"mistake": mistake})


class ModuleNotImplemented(TaggingModule):
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Any:
        raise NotImplementedError()

    def configure_optimizers(self) -> Any:
        raise NotImplementedError()


def _kit_module() -> type:
    from transformer_lab.training.modules import ClassifierModule, OptimConfig

    class KitModule(ClassifierModule):
        """Wrong: the kit's ClassifierModule behind the notebook's constructor."""

        def __init__(self, model: nn.Module, lr: float = 3e-3, weight_decay: float = 0.01,
                     warmup_steps: int = 20, total_steps: int = 200) -> None:  # fmt: skip
            optim = OptimConfig(lr=lr, weight_decay=weight_decay, warmup_steps=warmup_steps,
                                total_steps=total_steps, min_lr_ratio=0.0)  # fmt: skip
            super().__init__(model=model, optim=optim)
            self.config = None

        def _num_classes(self) -> int:
            return 5

    return KitModule


TRAIN_CHECKS: dict[str, Callable[[Any], None]] = {
    "visible": lab04.check_training_step,
    "hidden": lambda cls: hidden04.hidden_check_training_step(cls, seed=441),
}
OPTIM_CHECKS: dict[str, Callable[[Any], None]] = {
    "visible": lab04.check_configure_optimizers,
    "hidden": lambda cls: hidden04.hidden_check_configure_optimizers(cls, seed=442),
}
MODULE_CHECKS = {
    **{f"train_{k}": v for k, v in TRAIN_CHECKS.items()},
    **{f"optim_{k}": v for k, v in OPTIM_CHECKS.items()},
}


@pytest.mark.parametrize("cls", [TaggingModule, ModuleLambda])
def test_correct_modules_pass_every_check(cls: type) -> None:
    assert run_checks(MODULE_CHECKS, cls) == dict.fromkeys(MODULE_CHECKS, "")


TRAINING_STEP_MISTAKES = [
    ("mean_over_padding", ["visible", "hidden"], "padding included"),
    ("sum", ["visible", "hidden"], "the sum over the real tokens"),
    ("no_mask", ["visible", "hidden"], "without the padding mask"),
    ("per_sequence", ["visible", "hidden"], "each sequence's mean loss"),
    ("clamped_targets", ["visible", "hidden"], "counts the padded positions as class 0"),
    ("tokens_as_targets", ["visible", "hidden"], "batch['targets']"),
    ("returns_item", ["visible", "hidden"], "not loss.item()"),
    ("returns_detached", ["visible", "hidden"], "without its autograd graph"),
    ("no_log", ["visible", "hidden"], "logged nothing"),
    ("log_name", ["visible", "hidden"], "under the name 'train_loss'"),
    ("log_item", ["visible", "hidden"], "makes the CPU wait for the GPU"),
    ("enable_graph", ["visible", "hidden"], "keeps the step's whole autograd graph"),
    ("keeps_graph", ["visible", "hidden"], "self.history[0] holds a tensor with its autograd"),
    ("kit", ["visible", "hidden"], "does not allow"),
]


@pytest.mark.parametrize(("mistake", "failing", "words"), TRAINING_STEP_MISTAKES)
def test_training_step_mistakes_fail_with_a_message_naming_them(
    mistake: str, failing: list[str], words: str
) -> None:
    assert_fails(TRAIN_CHECKS, module_with(mistake), failing, words)


#: configure_optimizers' mistakes: each fails the visible and the hidden check, naming it.
OPTIMIZERS_MISTAKES = [
    ("adam", ["visible", "hidden"], "decays the weights directly"),
    (
        "decay_everything",
        ["visible", "hidden"],
        {"visible": "norm.weight (1-D) has weight_decay=0.1", "hidden": "norm.weight (1-D)"},
    ),
    ("decay_by_name", ["visible", "hidden"], "norm.weight (1-D) has weight_decay"),
    ("no_decay", ["visible", "hidden"], "embed.weight (2-D) has weight_decay=0"),
    ("subset", ["visible", "hidden"], "does not update norm.weight, norm.bias, head.bias"),
    ("no_scheduler", ["visible", "hidden"], "without a learning-rate schedule"),
    ("per_epoch", ["visible", "hidden"], "every 1 epoch(s)"),
    ("no_warmup", ["visible", "hidden"], "It has no warm-up"),
    ("warmup_from_zero", ["visible", "hidden"], "Its warm-up starts at 0"),
    ("constant_after", ["visible", "hidden"], "It stays at lr after the warm-up"),
    ("linear_decay", ["visible", "hidden"], "It decays linearly"),
    ("long_cosine", ["visible", "hidden"], "Its cosine is too long"),
    ("linear_lr_too_long", ["visible", "hidden"], "Its warm-up is one step too long"),
]


@pytest.mark.parametrize(("mistake", "failing", "words"), OPTIMIZERS_MISTAKES)
def test_configure_optimizers_mistakes_fail_with_a_message_naming_them(
    mistake: str, failing: list[str], words: str | dict[str, str]
) -> None:
    assert_fails(OPTIM_CHECKS, module_with(mistake), failing, words)


def test_configure_optimizers_calling_the_kit_earns_nothing() -> None:
    """(Catalogued as ``training_step kit``: the module calls the kit in both methods.)"""
    assert_fails(OPTIM_CHECKS, module_with("kit"), ["visible", "hidden"], "does not allow")


def test_the_kits_classifier_module_earns_nothing() -> None:
    outcomes = run_checks(MODULE_CHECKS, _kit_module())
    assert all("does not allow" in msg for msg in outcomes.values()), outcomes


def test_module_not_implemented_says_so() -> None:
    outcomes = run_checks(MODULE_CHECKS, ModuleNotImplemented)
    assert all("not implemented yet" in msg for msg in outcomes.values()), outcomes


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_module_hidden_checks_pass_for_every_seed(seed: int) -> None:
    hidden04.hidden_check_training_step(ModuleLambda, seed=seed)
    hidden04.hidden_check_configure_optimizers(TaggingModule, seed=seed)


def test_the_oracle_schedule_is_torchs_linear_then_cosine() -> None:
    module = TaggingModule(lab04.ProbeModel(), lr=0.02, warmup_steps=5, total_steps=17)
    conf = module.configure_optimizers()
    rates = lab04.learning_rates(conf["optimizer"], conf["lr_scheduler"]["scheduler"], 17)
    torch.testing.assert_close(rates, hidden04.oracle_learning_rates(0.02, 5, 17))


def test_a_student_module_trains_with_lightning(tmp_path: Path) -> None:
    """The module the checks accept is one Lightning's Trainer runs (step-wise schedule)."""
    from lightning.pytorch.loggers import CSVLogger

    from transformer_lab.data import SyntheticDataModule

    torch.manual_seed(0)
    data = SyntheticDataModule(
        "sort", seq_len=6, min_len=3, num_train=128, num_val=32, batch_size=32
    )
    module = TaggingModule(lab04.ProbeModel(13, 8, 13), lr=0.01, warmup_steps=2, total_steps=6)
    trainer = L.Trainer(max_steps=6, logger=CSVLogger(tmp_path), limit_val_batches=0,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, log_every_n_steps=1)  # fmt: skip
    trainer.fit(module, datamodule=data)
    # Stepped once per optimizer step, the cosine has reached 0 after total_steps steps (once
    # per epoch, it would still be at the second warm-up value).
    assert trainer.lr_scheduler_configs[0].scheduler.get_last_lr()[0] == pytest.approx(0.0)


# ---------------------------------------------------------------- the trained encoder


class _Tagger(nn.Module):
    """A stand-in model that answers the sort task perfectly, or copies its input."""

    def __init__(self, solve: bool) -> None:
        super().__init__()
        self.solve = solve
        self.block = Block(4, 1, 8)
        self.vocab = 13

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        out = tokens
        if self.solve:
            # Padding (id 0) sorts first; roll each row so the real tokens come first, sorted.
            ordered = tokens.sort(dim=-1).values
            pads = (tokens == 0).sum(-1)
            idx = (torch.arange(tokens.shape[1])[None, :] + pads[:, None]) % tokens.shape[1]
            out = ordered.gather(1, idx)
        return F.one_hot(out, self.vocab).float()  # (B, T, V)


def test_held_out_batches_are_the_sort_task() -> None:
    batches = lab04.held_out_batches("sort", seq_len=8, min_len=4, n=300)
    assert [b["tokens"].shape[0] for b in batches] == [128, 128, 44]
    b = batches[0]
    real = b["targets"] != -100
    assert torch.equal(real, b["padding_mask"])
    assert bool((b["targets"][:, 1:] >= b["targets"][:, :-1])[real[:, 1:]].all())


def test_trained_encoder_check_measures_accuracy() -> None:
    assert lab04.check_trained_encoder(_Tagger(True), Block, min_accuracy=0.99) == 1.0
    with pytest.raises(AssertionError, match=r"token accuracy on new sort sequences"):
        lab04.check_trained_encoder(_Tagger(False), Block, min_accuracy=0.9)
    with pytest.raises(AssertionError, match=r"\(_Tagger\) should be .* made of your EncoderB"):
        lab04.check_trained_encoder(_Tagger(True), FFSequential, min_accuracy=0.5)
    with pytest.raises(AssertionError, match=r"\(NoneType\) .* did the training cell run"):
        lab04.check_trained_encoder(None, Block, min_accuracy=0.5)  # type: ignore[arg-type]


# ---------------------------------------------------------------- fixtures and figures


def test_the_stored_examples_are_what_the_hidden_checks_compute() -> None:
    from transformer_lab.grading.fixtures import check_fixtures

    assert check_fixtures(REPO, ["04_transformer_block"]) == []


def test_encoder_block_diagram_draws_both_placements() -> None:
    from transformer_lab.diagrams import encoder_block_diagram

    fig = encoder_block_diagram()
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    titles = " ".join(ax.get_title() for ax in fig.axes)
    assert "post-norm" in titles and "pre-norm" in titles
    texts = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "LayerNorm1(x + SelfAttention(x))" in texts
    assert "x + SelfAttention(LayerNorm1(x))" in texts

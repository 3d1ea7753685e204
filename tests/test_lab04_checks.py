"""Lab 04 checks against a catalogue of typical mistakes (no nbgrader, CPU, fast).

Each wrong implementation below is one a student plausibly writes. The test asserts that the check
meant to catch it fails and that its message names the mistake; correct but differently written
implementations (var_mean vs mean/var, einsum vs matmul, nn.MultiheadAttention vs the kit's own
attention) must pass every check.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab.checks import lab04

# --------------------------------------------------------------------------------------------------
# layer_norm: correct variants and mistakes
# --------------------------------------------------------------------------------------------------


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


def ln_not_implemented(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    raise NotImplementedError()


LN_CHECKS: dict[str, Callable[..., None]] = {
    "visible": lab04.check_layer_norm,
    "hidden": lab04.hidden_check_layer_norm,
    "numerics": lab04.hidden_check_layer_norm_numerics,
}


@pytest.mark.parametrize("fn", [ln_mean_var, ln_var_mean, ln_einsum])
@pytest.mark.parametrize("check", list(LN_CHECKS))
def test_correct_layer_norms_pass(fn: Callable[..., Tensor], check: str) -> None:
    LN_CHECKS[check](fn)


@pytest.mark.parametrize(
    ("fn", "check", "message"),
    [
        (ln_wrong_axis, "visible", r"last dimension"),
        (ln_whole_tensor, "visible", r"last dimension"),
        (ln_eps_outside, "numerics", r"eps belongs inside the square root"),
        (ln_unbiased, "visible", r"biased variance"),
        (ln_unbiased, "numerics", r"biased variance"),
        (ln_no_affine, "visible", r"multiply by weight and add bias"),
        (ln_no_bias, "visible", r"without the bias"),
        (ln_shift_then_scale, "visible", r"scale first, then shift"),
        (ln_raw_moments, "numerics", r"centred values"),
        (ln_no_keepdim, "visible", r"raised RuntimeError"),
        (ln_calls_torch, "hidden", r"does not allow"),
        (ln_uses_module, "hidden", r"does not allow"),
        (ln_not_implemented, "visible", r"not implemented yet"),
    ],
)
def test_layer_norm_mistakes_are_named(fn: Callable[..., Tensor], check: str, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        LN_CHECKS[check](fn)


@pytest.mark.parametrize("fn", [ln_eps_outside, ln_raw_moments])
def test_subtle_layer_norm_mistakes_only_lose_the_numerics_cell(fn: Callable[..., Tensor]) -> None:
    lab04.check_layer_norm(fn)
    lab04.hidden_check_layer_norm(fn)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_layer_norm_hidden_checks_pass_for_every_seed(seed: int) -> None:
    lab04.hidden_check_layer_norm(ln_mean_var, seed=seed)
    lab04.hidden_check_layer_norm_numerics(ln_mean_var, seed=seed)


# --------------------------------------------------------------------------------------------------
# FeedForward
# --------------------------------------------------------------------------------------------------


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


class FeedForwardFunctional(FeedForward):
    """Correct, written differently: clamp for ReLU, functional dropout with the training flag."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__(d_model, d_ff, dropout)
        self.p = dropout

    def forward(self, x: Tensor) -> Tensor:
        h = torch.clamp(x @ self.linear1.weight.T + self.linear1.bias, min=0)
        return self.linear2(F.dropout(h, self.p, training=self.training))


class FFNoActivation(FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.linear1(x)))


class FFActivationAtEnd(FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.linear2(self.dropout(self.linear1(x))))


class FFGelu(FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(F.gelu(self.linear1(x)))


class FFWithResidual(FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return x + super().forward(x)


class FFHiddenSizeDModel(FeedForward):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__(d_model, d_model, dropout)


class FFDropoutNeverApplied(FeedForward):
    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(F.relu(self.linear1(x)))


class FFDropoutAlwaysOn(FeedForward):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__(d_model, d_ff, dropout)
        self.p = dropout

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(F.dropout(F.relu(self.linear1(x)), self.p))  # training=True always


class FFSequential(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class FFNotAModule:
    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        self.linear1 = nn.Linear(d_model, d_ff)


FF_CHECKS: dict[str, Callable[..., None]] = {
    "visible": lab04.check_feed_forward,
    "hidden": lab04.hidden_check_feed_forward,
    "dropout": lab04.hidden_check_feed_forward_dropout,
}


@pytest.mark.parametrize("cls", [FeedForward, FeedForwardFunctional])
@pytest.mark.parametrize("check", list(FF_CHECKS))
def test_correct_feed_forwards_pass(cls: type, check: str) -> None:
    FF_CHECKS[check](cls)


@pytest.mark.parametrize(
    ("cls", "check", "message"),
    [
        (FFNoActivation, "visible", r"no nonlinearity.*ReLU"),
        (FFActivationAtEnd, "visible", r"goes between the layers"),
        (FFGelu, "visible", r"GELU"),
        (FFWithResidual, "visible", r"residual belongs to the block"),
        (FFHiddenSizeDModel, "visible", r"linear1 maps 8 -> 8 features.*d_ff"),
        (FFDropoutNeverApplied, "dropout", r"same output as without dropout"),
        (FFDropoutAlwaysOn, "dropout", r"eval mode"),
        (FFSequential, "visible", r"no nn.Linear attribute `linear1`"),
        (FFNotAModule, "visible", r"nn.Module"),
    ],
)
def test_feed_forward_mistakes_are_named(cls: type, check: str, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        FF_CHECKS[check](cls)


def test_dropout_mistakes_keep_the_other_feed_forward_points() -> None:
    for cls in (FFDropoutNeverApplied, FFDropoutAlwaysOn):
        lab04.check_feed_forward(cls)
        lab04.hidden_check_feed_forward(cls)


# --------------------------------------------------------------------------------------------------
# EncoderBlock
# --------------------------------------------------------------------------------------------------


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
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # fully masked rows: zeros
        out = (weights @ v).transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return self.out_proj(out), weights


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
        torch_attention: bool = False,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.mistake = mistake
        self.torch_attention = torch_attention
        if torch_attention:
            self.self_attn: nn.Module = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
        else:
            self.self_attn = Attention(d_model, n_heads)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def _sa(self, h: Tensor, mask: Tensor | None) -> Tensor:
        if self.mistake == "mask_ignored":
            mask = None
        if self.mistake == "mask_inverted" and mask is not None:
            mask = ~mask
        if self.torch_attention:
            kpm = None if mask is None else ~mask[:, 0, 0, :]  # (B, S), True = ignore
            out = self.self_attn(h, h, h, key_padding_mask=kpm, need_weights=False)[0]
        else:
            out = self.self_attn(h, h, h, mask=mask)[0]
        return self.dropout1(out)

    def _ff(self, h: Tensor) -> Tensor:
        if self.mistake == "dropout_always_on":
            return F.dropout(self.ff(h), 0.1)  # training=True whatever the mode
        return self.dropout2(self.ff(h))

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
            x = x + self._sa(n1(x), mask)
            return x + self._ff(n2(x))
        if m == "no_residual":
            x = n1(self._sa(x, mask))
            return n2(self._ff(x))
        if m == "no_norms":
            x = x + self._sa(x, mask)
            return x + self._ff(x)
        residual = 0.0 if m == "no_attention_residual" else x
        x = n1(residual + self._sa(x, mask))
        if m == "no_ff_residual":
            return n2(self._ff(x))
        return n2(x + self._ff(x))


def block_with(**options: Any) -> Callable[..., nn.Module]:
    def make(*args: Any, **kwargs: Any) -> nn.Module:
        return Block(*args, **kwargs, **options)

    return make


class BlockWrappingTorch(nn.TransformerEncoderLayer):
    """Wrong: hands the work to torch's own layer (and has torch's attribute names)."""

    def __init__(
        self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False
    ) -> None:
        super().__init__(d_model, n_heads, d_ff, dropout, batch_first=True, norm_first=norm_first)


class BlockWithTorchInside(Block):
    """Wrong: the kit's attribute names, but the computation is torch's layer."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0,
                 norm_first: bool = False) -> None:  # fmt: skip
        super().__init__(d_model, n_heads, d_ff, dropout, norm_first, torch_attention=True)
        self.inner = nn.TransformerEncoderLayer(
            d_model, n_heads, d_ff, dropout, batch_first=True, norm_first=norm_first
        )

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        return self.inner(x)


BLOCK_CHECKS: dict[str, Callable[..., None]] = {
    "visible": lab04.check_encoder_block,
    "post": lab04.hidden_check_encoder_block_post_norm,
    "pre": lab04.hidden_check_encoder_block_pre_norm,
    "mask": lab04.hidden_check_encoder_block_mask,
}


@pytest.mark.parametrize("torch_attention", [False, True])
@pytest.mark.parametrize("check", list(BLOCK_CHECKS))
def test_correct_blocks_pass(torch_attention: bool, check: str) -> None:
    BLOCK_CHECKS[check](block_with(torch_attention=torch_attention))


@pytest.mark.parametrize(
    ("mistake", "check", "message"),
    [
        ("no_residual", "visible", r"without residuals"),
        ("no_residual", "pre", r"pre-norm without residuals"),
        ("no_attention_residual", "visible", r"attention sublayer has no residual"),
        ("no_ff_residual", "visible", r"feed-forward sublayer has no residual"),
        ("always_post", "pre", r"norm_first=True your block computes post-norm"),
        ("always_pre", "visible", r"norm_first=False your block computes pre-norm"),
        ("norms_swapped", "visible", r"norm1 and norm2 swapped"),
        ("norms_swapped", "pre", r"norm1 and norm2 swapped"),
        ("pre_residual_of_normed", "pre", r"residual adds the normalised input"),
        ("no_norms", "visible", r"no layer norm at all"),
        ("mask_ignored", "mask", r"without the mask"),
        ("mask_inverted", "mask", r"inverted mask"),
        ("dropout_always_on", "post", r"different output each call.*eval mode"),
    ],
)
def test_block_mistakes_are_named(mistake: str, check: str, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        BLOCK_CHECKS[check](block_with(mistake=mistake))


@pytest.mark.parametrize("mistake", ["mask_ignored", "mask_inverted"])
def test_mask_mistakes_keep_the_unmasked_points(mistake: str) -> None:
    for check in ("visible", "post", "pre"):
        BLOCK_CHECKS[check](block_with(mistake=mistake))


def test_post_norm_only_block_keeps_the_post_norm_points() -> None:
    lab04.check_encoder_block(block_with(mistake="always_post"))
    lab04.hidden_check_encoder_block_post_norm(block_with(mistake="always_post"))


def test_mask_ignored_is_also_caught_by_the_padding_property() -> None:
    """Even without the oracle, changing padded tokens must not move real tokens' outputs."""
    block = Block(8, 2, 16, mistake="mask_ignored").eval()
    keep = torch.tensor([[True, True, False, False]])
    x = torch.randn(1, 4, 8)
    x2 = x.clone()
    x2[0, 2:] += 3.0
    with torch.no_grad():
        a = block(x, keep[:, None, None, :])
        b = block(x2, keep[:, None, None, :])
    assert not torch.allclose(a[0, :2], b[0, :2], atol=1e-4)


@pytest.mark.parametrize("cls", [BlockWrappingTorch, BlockWithTorchInside])
def test_blocks_that_wrap_torchs_layer_fail(cls: type) -> None:
    with pytest.raises(AssertionError, match=r"no attribute|does not allow"):
        lab04.check_encoder_block(cls)


def test_block_with_wrong_attribute_names_is_told_the_names() -> None:
    class Renamed(Block):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.ffn = self.ff
            del self.ff

        def _ff(self, h: Tensor) -> Tensor:
            return self.ffn(h)

    with pytest.raises(AssertionError, match=r"no attribute\(s\) ff.*self.ff"):
        lab04.check_encoder_block(Renamed)


def test_loader_matches_torchs_layer_exactly() -> None:
    """The weight copy is what the block checks stand on: it must reproduce torch's layer."""
    layer = lab04.torch_encoder_layer(12, 3, 20, norm_first=False, seed=5)
    block = lab04.load_torch_encoder_layer(Block(12, 3, 20), layer).eval()
    x = torch.randn(2, 7, 12)
    with torch.no_grad():
        torch.testing.assert_close(block(x), layer(x))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_hidden_checks_pass_for_every_seed(seed: int) -> None:
    for check in ("post", "pre", "mask"):
        BLOCK_CHECKS[check](Block, seed=seed)


# --------------------------------------------------------------------------------------------------
# the trained-encoder check
# --------------------------------------------------------------------------------------------------


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
    with pytest.raises(AssertionError, match=r"none of your EncoderBlocks"):
        lab04.check_trained_encoder(_Tagger(True), FFSequential, min_accuracy=0.5)
    with pytest.raises(AssertionError, match=r"did the training cell run"):
        lab04.check_trained_encoder(None, Block, min_accuracy=0.5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# the package's own implementations: usable as parts, refused as answers
# --------------------------------------------------------------------------------------------------


def test_block_built_on_the_kits_attention_passes() -> None:
    """The notebook's solution uses the package's MultiHeadAttention (written in lab 03)."""
    from transformer_lab.attention import MultiHeadAttention

    class KitBlock(Block):
        def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0,
                     norm_first: bool = False) -> None:  # fmt: skip
            super().__init__(d_model, n_heads, d_ff, dropout, norm_first)
            self.self_attn = MultiHeadAttention(d_model, n_heads)

    for check in BLOCK_CHECKS.values():
        check(KitBlock)


@pytest.mark.parametrize(
    ("name", "checks"),
    [
        ("layer_norm", LN_CHECKS),
        ("FeedForward", FF_CHECKS),
        ("EncoderBlock", BLOCK_CHECKS),
    ],
)
def test_the_packages_own_implementation_earns_nothing(
    name: str, checks: dict[str, Callable[..., None]]
) -> None:
    from transformer_lab import blocks

    answer = getattr(blocks, name)
    for check in checks.values():
        with pytest.raises(AssertionError, match=r"does not allow"):
            check(answer)

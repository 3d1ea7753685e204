"""Transformer building blocks: layer norm, the position-wise feed-forward net, encoder and decoder
blocks, and loaders that copy weights from PyTorch's own layers.

An encoder block is self-attention then a feed-forward net, each wrapped in a residual connection
and a layer norm. Post-norm (``norm_first=False``, "Add & Norm" as in the lecture and the paper)
normalises after the residual sum; pre-norm (``norm_first=True``, as in GPT-2) normalises the
input of each sub-layer and leaves the residual stream untouched, which trains more stably in deep
stacks. A decoder block adds cross-attention to the encoder's output (the "memory") between its
masked self-attention and its feed-forward net.

The blocks use the same parameter layout as ``nn.TransformerEncoderLayer`` and
``nn.TransformerDecoderLayer`` (batch_first), so :func:`load_torch_encoder_layer` and
:func:`load_torch_decoder_layer` can copy weights over and the tests compare outputs.

Shape letters: ``B`` batch, ``T`` target time, ``S`` source (memory) time, ``D`` model width,
``H`` heads, ``F`` feed-forward width.

References: Vaswani et al., "Attention Is All You Need", 2017, section 3.1 and 3.3;
Ba et al., "Layer Normalization", 2016; Xiong et al., "On Layer Normalization in the Transformer
Architecture", 2020 (pre- vs post-norm).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab.attention import MultiHeadAttention, load_torch_weights
from transformer_lab.graded import graded

__all__ = [
    "ACTIVATIONS",
    "DecoderBlock",
    "EncoderBlock",
    "FeedForward",
    "LayerNorm",
    "layer_norm",
    "load_torch_decoder_layer",
    "load_torch_encoder_layer",
]


@graded("04_transformer_block")
def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float = 1e-5) -> Tensor:
    """Layer normalisation over the last dim, written out.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the biased (population) variance,
    each token normalised on its own (unlike batch norm, nothing is shared across the batch).

    Args:
        x: ``(..., D)``.
        weight: gain ``(D,)`` or None (no scaling).
        bias: shift ``(D,)`` or None (no shift).
        eps: added to the variance for stability.

    Returns:
        Same shape as ``x``.
    """
    mean = x.mean(dim=-1, keepdim=True)
    var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
    y = (x - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


class LayerNorm(nn.Module):
    """Layer norm with a learned gain and (optionally) bias, computed by :func:`layer_norm`.

    Parameter names (``weight``, ``bias``) match ``nn.LayerNorm``, so state dicts load across.

    Args:
        d_model: normalised width ``D``.
        eps: added to the variance.
        bias: learn a shift (GPT-style models can drop it).
        fused: compute with ``F.layer_norm`` (one kernel, same result) instead of the
            written-out function; used where speed matters (the GPT).
    """

    def __init__(
        self, d_model: int, eps: float = 1e-5, bias: bool = True, fused: bool = False
    ) -> None:
        super().__init__()
        if d_model <= 0:
            raise ValueError(f"d_model={d_model} must be positive")
        self.d_model = d_model
        self.eps = eps
        self.fused = fused
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        """Normalise ``x`` of shape ``(..., D)``."""
        if self.fused:
            return F.layer_norm(x, (self.d_model,), self.weight, self.bias, self.eps)
        return layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}, bias={self.bias is not None}, fused={self.fused}"


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


@graded("04_transformer_block")
class FeedForward(nn.Module):
    """Position-wise feed-forward net: ``linear2(dropout(act(linear1(x))))``.

    The same two-layer MLP is applied to every token independently; it is where most of a
    Transformer's parameters live (``2 * D * F`` with ``F = 4 D`` usually).

    Args:
        d_model: input/output width ``D``.
        d_ff: hidden width ``F``.
        dropout: dropout on the hidden activations.
        activation: "relu" (the paper), "gelu" or "gelu_tanh" (GPT-2's approximation).
        bias: biases in both linear layers.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        dropout: float = 0.0,
        activation: str = "relu",
        bias: bool = True,
    ) -> None:
        super().__init__()
        if d_model <= 0 or d_ff <= 0:
            raise ValueError(f"d_model={d_model} and d_ff={d_ff} must be positive")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation={activation!r} is not one of {sorted(ACTIVATIONS)}")
        self.activation = activation
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """``(..., D) -> (..., D)``."""
        return self.linear2(self.dropout(ACTIVATIONS[self.activation](self.linear1(x))))


@graded("04_transformer_block")
class EncoderBlock(nn.Module):
    """Self-attention and feed-forward sub-layers with residuals and layer norms.

    Post-norm: ``x = norm1(x + attn(x)); x = norm2(x + ff(x))``.
    Pre-norm:  ``x = x + attn(norm1(x)); x = x + ff(norm2(x))``.

    Sub-modules are named as in ``nn.TransformerEncoderLayer`` (``self_attn``, ``norm1``...)
    so :func:`load_torch_encoder_layer` can copy its weights over.

    Args:
        d_model: model width ``D``.
        n_heads: attention heads ``H``.
        d_ff: feed-forward width ``F``.
        dropout: dropout on attention weights, the feed-forward hidden layer and both residual
            branches (as in ``nn.TransformerEncoderLayer``).
        norm_first: pre-norm if True, post-norm ("Add & Norm") if False.
        activation: feed-forward activation.
        eps: layer norm epsilon.
        bias: biases in the linear layers and layer norms.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        *,
        activation: str = "relu",
        eps: float = 1e-5,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout, activation, bias=bias)
        self.norm1 = LayerNorm(d_model, eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps, bias=bias)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Apply the block.

        Args:
            x: ``(B, T, D)``.
            mask: bool attention mask broadcasting to ``(B, H, T, T)``, True = may attend
                (e.g. ``padding[:, None, None, :]`` to hide padded keys).

        Returns:
            ``(B, T, D)``.
        """
        if self.norm_first:
            x = x + self._self_attention(self.norm1(x), mask)
            return x + self.dropout2(self.ff(self.norm2(x)))
        x = self.norm1(x + self._self_attention(x, mask))
        return self.norm2(x + self.dropout2(self.ff(x)))

    def _self_attention(self, x: Tensor, mask: Tensor | None) -> Tensor:
        out, _ = self.self_attn(x, x, x, mask, need_weights=False)
        return self.dropout1(out)


@graded("06_decoder_training")
class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention to the encoder memory, then feed-forward.

    Post-norm: ``x = norm1(x + self_attn(x)); x = norm2(x + cross_attn(x, memory));
    x = norm3(x + ff(x))``; pre-norm normalises each sub-layer's input instead.

    Sub-modules follow ``nn.TransformerDecoderLayer`` (which calls the cross-attention
    ``multihead_attn``), so :func:`load_torch_decoder_layer` can copy its weights over.

    Args:
        d_model: model width ``D``.
        n_heads: attention heads ``H`` (both attentions).
        d_ff: feed-forward width ``F``.
        dropout: as in :class:`EncoderBlock`.
        norm_first: pre-norm if True.
        activation: feed-forward activation.
        eps: layer norm epsilon.
        bias: biases in the linear layers and layer norms.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        *,
        activation: str = "relu",
        eps: float = 1e-5,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout, activation, bias=bias)
        self.norm1 = LayerNorm(d_model, eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps, bias=bias)
        self.norm3 = LayerNorm(d_model, eps, bias=bias)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
    ) -> Tensor:
        """Apply the block.

        Args:
            x: decoder states ``(B, T, D)``.
            memory: encoder output ``(B, S, D)``.
            self_mask: bool mask broadcasting to ``(B, H, T, T)``; pass a causal mask (combined
                with target padding) so position ``t`` cannot see later targets.
            memory_mask: bool mask broadcasting to ``(B, H, T, S)``, usually the source padding
                ``src_padding[:, None, None, :]``.

        Returns:
            ``(B, T, D)``.
        """
        if self.norm_first:
            x = x + self._self_attention(self.norm1(x), self_mask)
            x = x + self._cross_attention(self.norm2(x), memory, memory_mask)
            return x + self.dropout3(self.ff(self.norm3(x)))
        x = self.norm1(x + self._self_attention(x, self_mask))
        x = self.norm2(x + self._cross_attention(x, memory, memory_mask))
        return self.norm3(x + self.dropout3(self.ff(x)))

    def _self_attention(self, x: Tensor, mask: Tensor | None) -> Tensor:
        out, _ = self.self_attn(x, x, x, mask, need_weights=False)
        return self.dropout1(out)

    def _cross_attention(self, x: Tensor, memory: Tensor, mask: Tensor | None) -> Tensor:
        out, _ = self.cross_attn(x, memory, memory, mask, need_weights=False)
        return self.dropout2(out)


def _torch_activation_name(layer: nn.Module) -> str | None:
    act = getattr(layer, "activation", None)
    if act is F.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
        return "gelu"
    if isinstance(act, nn.GELU) and act.approximate == "tanh":
        return "gelu_tanh"
    return None


def _check_layer(ours: EncoderBlock | DecoderBlock, theirs: nn.Module) -> None:
    if ours.norm_first != theirs.norm_first:
        raise ValueError(
            f"norm_first differs: torch layer norm_first={theirs.norm_first}, "
            f"ours norm_first={ours.norm_first}"
        )
    act = _torch_activation_name(theirs)
    if act != ours.ff.activation:
        raise ValueError(f"activation differs: torch layer {act!r}, ours {ours.ff.activation!r}")
    if not getattr(theirs.self_attn, "batch_first", False):
        raise ValueError("the torch layer must be built with batch_first=True")


@torch.no_grad()
def _copy_linear(dst: nn.Linear, src: nn.Linear) -> None:
    if dst.weight.shape != src.weight.shape:
        raise ValueError(
            f"linear shape {tuple(src.weight.shape)} != ours {tuple(dst.weight.shape)}"
        )
    dst.weight.copy_(src.weight)
    if dst.bias is not None and src.bias is not None:
        dst.bias.copy_(src.bias)


@torch.no_grad()
def _copy_norm(dst: LayerNorm, src: nn.LayerNorm) -> None:
    dst.weight.copy_(src.weight)
    if dst.bias is not None and src.bias is not None:
        dst.bias.copy_(src.bias)
    dst.eps = src.eps


def _load_shared(ours: EncoderBlock | DecoderBlock, theirs: nn.Module) -> None:
    """Copy what encoder and decoder layers share: self-attention, feed-forward, norms 1 and 2."""
    _check_layer(ours, theirs)
    load_torch_weights(ours.self_attn, theirs.self_attn)
    _copy_linear(ours.ff.linear1, theirs.linear1)
    _copy_linear(ours.ff.linear2, theirs.linear2)
    _copy_norm(ours.norm1, theirs.norm1)
    _copy_norm(ours.norm2, theirs.norm2)


def load_torch_encoder_layer(ours: EncoderBlock, theirs: nn.TransformerEncoderLayer) -> None:
    """Copy an ``nn.TransformerEncoderLayer`` (batch_first) into an :class:`EncoderBlock`.

    Raises:
        ValueError: if norm placement, activation or sizes differ.
    """
    _load_shared(ours, theirs)


def load_torch_decoder_layer(ours: DecoderBlock, theirs: nn.TransformerDecoderLayer) -> None:
    """Copy an ``nn.TransformerDecoderLayer`` (batch_first) into a :class:`DecoderBlock`.

    Torch calls the cross-attention ``multihead_attn``.

    Raises:
        ValueError: if norm placement, activation or sizes differ.
    """
    _load_shared(ours, theirs)
    load_torch_weights(ours.cross_attn, theirs.multihead_attn)
    _copy_norm(ours.norm3, theirs.norm3)

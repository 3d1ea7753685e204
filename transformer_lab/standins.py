"""Stand-ins for locked answers, built from PyTorch's own modules and kernels.

While a lab is open, the student package holds no kit answer of it. Later labs and the kit's
machinery still need attention, masks and blocks, so :func:`transformer_lab.answers.install`
puts one of these where a locked answer was when the student has not saved their own. Each has
the kit's interface and computes with PyTorch's implementation (``F.scaled_dot_product_attention``,
``F.multi_head_attention_forward``, ``nn.TransformerEncoderLayer``,
``nn.Transformer.generate_square_subsequent_mask``, ``F.layer_norm``, the feed-forward and head
reshapes inside ``nn.TransformerEncoderLayer`` and ``F.multi_head_attention_forward``), so it
reveals nothing PyTorch does not. Lab 04's training pieces, which every kit LightningModule
calls (lab 08 trains one), are PyTorch's too: ``F.cross_entropy`` with ``ignore_index`` for the
loss, a plain ``self.log`` per value for the logging, ``torch.optim.AdamW`` with PyTorch's own
``LinearLR`` warm-up then ``CosineAnnealingLR`` (chained by ``SequentialLR``) for the optimizer.
Where PyTorch has no such piece (tokenizers, decoding, sampling, scale arithmetic) there is no
stand-in; the one exception is a placeholder for the sinusoidal encoding that every later model
needs: fixed pseudo-random position codes, which are no sinusoids and say so.

A stand-in that is not installed is refused inside every check's ban
(:func:`transformer_lab.judge.bans.forbidden`), so none can pass the lab that asks for it.

:data:`STAND_INS` maps the kit's dotted name to its stand-in.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "STAND_INS",
    "StandInEncoderBlock",
    "StandInFeedForward",
    "StandInMultiHeadAttention",
    "torch_attention",
]


def _position_codes(
    seq_len: int,
    d_model: int,
    base: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """Fixed pseudo-random position codes in [-1, 1) (placeholder for lab 01's encoding).

    PyTorch has no sinusoidal encoding, so this is no sinusoid: each position gets its own
    fixed code (the same at every length), enough for the later labs' models to tell positions
    apart and train; figures about the sinusoids' geometry need the student's own answer.
    """
    if d_model <= 0 or d_model % 2:
        raise ValueError(f"d_model={d_model} must be even and positive")
    if seq_len < 0:
        raise ValueError(f"seq_len={seq_len} must be >= 0")
    t = torch.arange(seq_len, dtype=torch.int64, device=device)[:, None]  # (T, 1)
    d = torch.arange(d_model, dtype=torch.int64, device=device)[None, :]  # (1, D)
    hashed = (t * 2654435761 + d * 40503 + 12345) % 65536  # (T, D), a fixed hash per cell
    return (hashed.to(torch.float64) / 32768.0 - 1.0).to(dtype)


def _softmax(x: Tensor, dim: int = -1) -> Tensor:
    """``torch.softmax`` (stand-in for lab 02's ``softmax``)."""
    return torch.softmax(x, dim=dim)


def _attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """PyTorch's fused attention, with its weights (stand-in for lab 02's answer).

    The weights are the fused kernel applied to identity values (each key's value is its own
    one-hot row); a query that may attend nothing gets zero weights and a zero output.
    """
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"query width {q.shape[-1]} != key width {k.shape[-1]}")
    S = k.shape[-2]
    eye = torch.eye(S, dtype=q.dtype, device=q.device).expand(*k.shape[:-1], S)  # (..., S, S)
    allowed = None
    if mask is not None:
        row_ok = mask.any(dim=-1, keepdim=True)  # (..., T, 1)
        allowed = mask | ~row_ok
    weights = F.scaled_dot_product_attention(q, k, eye, attn_mask=allowed)  # (..., T, S)
    if mask is not None:
        weights = torch.where(mask, weights, 0.0)  # masked keys get exactly 0
    mixed = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    return mixed @ v, weights


def _masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Stand-in for lab 05's ``masked_attention``: PyTorch's attention under a required mask."""
    if mask is None:
        raise ValueError("masked_attention needs a mask (True = may attend); got None")
    return _attention(q, k, v, mask)


def _causal_mask(T: int, device: torch.device | str | None = None) -> Tensor:
    """``nn.Transformer.generate_square_subsequent_mask`` as a bool mask, True = may attend."""
    if T < 0:
        raise ValueError(f"T={T} must be >= 0")
    blocked = nn.Transformer.generate_square_subsequent_mask(T, device=device)  # 0 or -inf
    return blocked == 0


def _split_heads(x: Tensor, n_heads: int) -> Tensor:
    """``(B, T, D) -> (B, H, T, D // H)``, the reshape inside ``F.multi_head_attention_forward``."""
    if x.shape[-1] % n_heads != 0:
        raise ValueError(f"d_model={x.shape[-1]} is not divisible by n_heads={n_heads}")
    return x.unflatten(-1, (n_heads, -1)).movedim(-2, 1)  # (B, H, T, Dh)


def _merge_heads(x: Tensor) -> Tensor:
    """``(B, H, T, Dh) -> (B, T, H * Dh)``: :func:`_split_heads` undone."""
    return x.movedim(1, -2).flatten(-2)  # (B, T, D)


def _sequence_loss(logits: Tensor, targets: Tensor, pad_id: int) -> Tensor:
    """Mean cross-entropy over the non-padding targets: ``F.cross_entropy``'s ``ignore_index``."""
    flat = logits.float().flatten(0, -2)  # (B*T, V)
    return F.cross_entropy(flat, targets.flatten(), ignore_index=pad_id)


class StandInFeedForward(nn.Module):
    """The feed-forward sub-layer of ``nn.TransformerEncoderLayer`` (its own ``_ff_block``)."""

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
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.dropout2 = nn.Identity()  # the layer's residual dropout is the block's business
        self.activation = {"relu": F.relu, "gelu": F.gelu}.get(activation) or (
            lambda x: F.gelu(x, approximate="tanh")
        )

    def forward(self, x: Tensor) -> Tensor:
        """``(..., D) -> (..., D)``."""
        return nn.TransformerEncoderLayer._ff_block(self, x)  # type: ignore[arg-type]


class _OneHead:
    num_heads = 1  # what ``nn.MultiheadAttention.merge_masks`` reads of its module


def _combine_masks(padding: Tensor | None, causal: Tensor | None) -> Tensor:
    """``nn.MultiheadAttention.merge_masks`` of a padding and a causal mask: ``(B, 1, T, T)``
    bool, True = may attend (stand-in for lab 05's ``combine_masks``)."""
    if padding is None and causal is None:
        raise ValueError("combine_masks needs a padding mask, a causal mask or both")
    if causal is None:
        n = padding.shape[-1]  # keys
        causal = torch.ones(n, n, dtype=torch.bool, device=padding.device)
    if padding is None:
        return causal.expand(1, 1, *causal.shape)  # (1, 1, T, T)
    blocked = float("-inf")
    attn = torch.zeros(causal.shape, device=causal.device).masked_fill(~causal, blocked)
    keys = torch.zeros(padding.shape, device=padding.device).masked_fill(~padding, blocked)
    query = torch.empty(*padding.shape, 0, device=padding.device)  # (B, T, 0): shapes only
    merged, _ = nn.MultiheadAttention.merge_masks(_OneHead(), attn, keys, query)  # type: ignore[arg-type]
    return merged == 0  # (B, 1, T, T)


def _layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float = 1e-5) -> Tensor:
    """``F.layer_norm`` over the last dimension (stand-in for lab 04's ``layer_norm``)."""
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


class StandInMultiHeadAttention(nn.Module):
    """``F.multi_head_attention_forward`` with the kit's interface and parameter names.

    A kit class built on it that projects in its own way (the GPT's ``CausalSelfAttention``,
    whose ``project`` uses one fused ``qkv_proj``) gets PyTorch's attention over the heads its
    ``project`` returns instead.

    Args:
        d_model: model width ``D``.
        n_heads: heads ``H``; must divide ``d_model``.
        bias: biases in the four projections.
        dropout: dropout on the attention weights (training only).
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model <= 0 or n_heads <= 0 or d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.dropout = d_model, n_heads, dropout
        self.head_dim = self.d_model // self.n_heads  # Dh
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = True,
        *,
        is_causal: bool = False,
        kv_cache: object | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """``(out (B, T, D), weights (B, H, T, S) or None)``; ``mask`` True = may attend."""
        if kv_cache is not None:
            raise NotImplementedError(
                "PyTorch's multi-head attention has no KV cache: decoding with a cache needs "
                "your MultiHeadAttention (lab 03_multi_head_attention)"
            )
        if is_causal:
            mask = _causal_mask(query.shape[1], device=query.device)
        if type(self).project is not StandInMultiHeadAttention.project:
            q, k, v = self.project(query, key, value)  # (B, H, T, Dh), (B, H, S, Dh) x 2
            out, weights = _attention(q, k, v, mask, dropout_p=self.dropout * self.training)
            return self.out_proj(_merge_heads(out)), weights if need_weights else None
        biases = [p.bias for p in (self.q_proj, self.k_proj, self.v_proj)]
        return torch_attention(
            query,
            key,
            value,
            mask,
            n_heads=self.n_heads,
            out_proj=self.out_proj,
            need_weights=need_weights,
            dropout_p=self.dropout * self.training,
            separate=(self.q_proj.weight, self.k_proj.weight, self.v_proj.weight),
            in_proj_bias=None if biases[0] is None else torch.cat(biases),
        )

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The three projections, split into heads as ``F.multi_head_attention_forward`` does:
        ``q (B, H, T, Dh)``, ``k (B, H, S, Dh)``, ``v (B, H, S, Dh)``."""
        return (
            _split_heads(self.q_proj(query), self.n_heads),
            _split_heads(self.k_proj(key), self.n_heads),
            _split_heads(self.v_proj(value), self.n_heads),
        )


def torch_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    *,
    n_heads: int,
    out_proj: nn.Linear,
    need_weights: bool = True,
    dropout_p: float = 0.0,
    separate: tuple[Tensor, Tensor, Tensor] | None = None,
    in_proj_weight: Tensor | None = None,
    in_proj_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """``F.multi_head_attention_forward`` on batch-first inputs with the kit's mask convention.

    Args:
        query, key, value: ``(B, T, D)``, ``(B, S, D)``, ``(B, S, D)``.
        mask: bool broadcasting to ``(B, H, T, S)``, True = may attend; a query that may attend
            nothing gets zero from every head.
        n_heads: heads ``H``.
        out_proj: the output projection.
        separate: the three ``(D, D)`` projection weights, or ``in_proj_weight`` (packed, torch's
            own layout) instead.

    Returns:
        ``(out (B, T, D), weights (B, H, T, S) or None)``.
    """
    B, T, D = query.shape
    S = key.shape[1]
    blocked = None
    row_ok = None
    full = None
    if mask is not None:
        full = mask.expand(B, n_heads, T, S)  # (B, H, T, S)
        row_ok = full.any(dim=-1, keepdim=True)  # (B, H, T, 1)
        blocked = ~(full | ~row_ok).reshape(B * n_heads, T, S)  # (B*H, T, S)
    q_w, k_w, v_w = separate if separate is not None else (None, None, None)
    out, weights = F.multi_head_attention_forward(
        query.transpose(0, 1),  # (T, B, D)
        key.transpose(0, 1),
        value.transpose(0, 1),
        D,
        n_heads,
        in_proj_weight,
        in_proj_bias,
        None,
        None,
        False,
        dropout_p,
        out_proj.weight,
        out_proj.bias,
        training=dropout_p > 0.0,
        need_weights=need_weights,
        attn_mask=blocked,
        use_separate_proj_weight=separate is not None,
        q_proj_weight=q_w,
        k_proj_weight=k_w,
        v_proj_weight=v_w,
        average_attn_weights=False,
    )
    out = out.transpose(0, 1)  # (B, T, D)
    if row_ok is not None:
        # A query no head may attend gets zero from every head: only out_proj's bias.
        empty = ~row_ok.any(dim=1)  # (B, T, 1)
        nothing = torch.zeros_like(out) if out_proj.bias is None else out_proj.bias
        out = torch.where(empty, nothing, out)
        if weights is not None:
            weights = torch.where(full, weights, 0.0)
    return out, weights


class StandInEncoderBlock(nn.TransformerEncoderLayer):
    """``nn.TransformerEncoderLayer`` (batch first) with the kit's ``EncoderBlock`` interface."""

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
        super().__init__(
            d_model,
            n_heads,
            d_ff,
            dropout,
            activation=activation,
            layer_norm_eps=eps,
            batch_first=True,
            norm_first=norm_first,
            bias=bias,
        )
        self.n_heads = n_heads

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:  # type: ignore[override]
        """``(B, T, D) -> (B, T, D)``; ``mask`` bool broadcasting to ``(B, H, T, T)``."""
        if mask is None:
            return super().forward(x)
        B, T, _ = x.shape
        full = mask.expand(B, self.n_heads, T, T)  # (B, H, T, T)
        row_ok = full.any(dim=-1, keepdim=True)
        blocked = ~(full | ~row_ok).reshape(B * self.n_heads, T, T)  # (B*H, T, T)
        return super().forward(x, src_mask=blocked)


def _token_cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor:
    """``F.cross_entropy`` over every position, ``ignore_index`` skipped, in float32 (stand-in for
    lab 04's ``token_cross_entropy``): logits ``(..., V)``, targets ``(...)``, a scalar."""
    return F.cross_entropy(
        logits.flatten(0, -2).float(),  # (N, V): every position a row
        targets.flatten(),  # (N,)
        ignore_index=ignore_index,
    )


def _log_metrics(
    module: Any, stage: str, loss: Tensor, batch_size: int, metrics: Any | None = None
) -> None:
    """Lightning's ``self.log``, once per value (stand-in for lab 04's ``log_metrics``).

    ``{stage}_loss`` (``train_loss`` at every training step; validation and test losses and the
    stage's metrics averaged over the epoch), all shown in the progress bar.
    """
    training = stage == "train"
    values = {f"{stage}_loss": loss, **(dict(metrics.items()) if metrics is not None else {})}
    for name, value in values.items():
        module.log(
            name,
            value,
            on_step=training,
            on_epoch=not training,
            prog_bar=True,
            batch_size=batch_size,
        )


def _build_optimizer(
    model: nn.Module, optim: Any, estimated_steps: float | None = None
) -> dict[str, Any]:
    """``torch.optim.AdamW`` over every parameter and PyTorch's own warm-up then cosine schedule
    (stand-in for lab 04's ``build_optimizer``), in Lightning's per-step form.

    ``LinearLR`` rises from ``1 / (warmup + 1)`` of the rate to all of it over the warm-up, then
    ``CosineAnnealingLR`` falls to ``min_lr_ratio`` of it at the run's last step, chained by
    ``SequentialLR``. Unlike the kit's, weight decay applies to every parameter (PyTorch's
    default use of AdamW), biases and norms included.

    Raises:
        ValueError: neither ``optim.total_steps`` nor a finite ``estimated_steps`` is given.
    """
    from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

    length = estimated_steps if optim.total_steps is None else optim.total_steps
    if length is None or not math.isfinite(length):
        raise ValueError(
            f"estimated_steps={estimated_steps}: the learning-rate schedule needs a finite "
            "length: set max_steps or max_epochs of the Trainer, or optim.total_steps"
        )
    steps = max(1, int(length))
    rise = min(optim.warmup_steps, steps - 1)  # a run shorter than the warm-up still decays
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params,
        lr=optim.lr,
        betas=tuple(optim.betas),
        weight_decay=optim.weight_decay,
        fused=getattr(optim, "fused", None),
    )
    cosine = CosineAnnealingLR(optimizer, T_max=steps - rise, eta_min=optim.lr * optim.min_lr_ratio)
    scheduler: Any = cosine
    if rise > 0:
        linear = LinearLR(optimizer, start_factor=1.0 / (rise + 1), total_iters=rise)
        scheduler = SequentialLR(optimizer, [linear, cosine], milestones=[rise])
    return {
        "optimizer": optimizer,
        "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
    }


#: kit dotted name -> its stand-in.
STAND_INS: dict[str, object] = {
    "transformer_lab.positional.sinusoidal_encoding": _position_codes,
    "transformer_lab.attention.softmax": _softmax,
    "transformer_lab.attention.scaled_dot_product_attention": _attention,
    "transformer_lab.attention.masked_attention": _masked_attention,
    "transformer_lab.attention.MultiHeadAttention": StandInMultiHeadAttention,
    "transformer_lab.masks.causal_mask": _causal_mask,
    "transformer_lab.masks.combine_masks": _combine_masks,
    "transformer_lab.blocks.layer_norm": _layer_norm,
    "transformer_lab.blocks.EncoderBlock": StandInEncoderBlock,
    "transformer_lab.blocks.FeedForward": StandInFeedForward,
    "transformer_lab.attention.split_heads": _split_heads,
    "transformer_lab.attention.merge_heads": _merge_heads,
    "transformer_lab.training.modules.token_cross_entropy": _token_cross_entropy,
    "transformer_lab.training.modules.log_metrics": _log_metrics,
    "transformer_lab.training.schedule.build_optimizer": _build_optimizer,
}

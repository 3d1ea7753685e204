"""Positional encodings: the sinusoidal table, its relative-shift matrices and a learned table.

Self-attention treats its input as a set; adding a position-dependent vector to each token
embedding is what lets a Transformer tell "dog bites man" from "man bites dog". This module holds
the sinusoidal encoding of the lecture (positions counted from 0),

    PE[p, 2i]   = sin(p / base**(2i / d)),
    PE[p, 2i+1] = cos(p / base**(2i / d)),

the block-diagonal rotation ``M(k)`` with ``PE[p + k] == PE[p] @ M(k)`` (why a fixed offset is a
linear map of the encoding), and two ``nn.Module`` wrappers that add positions to embeddings.

Reference: Vaswani et al., "Attention Is All You Need", NeurIPS 2017, section 3.5.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from transformer_lab.graded import graded

__all__ = [
    "LearnedPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "relative_shift_matrix",
    "sinusoidal_encoding",
]


def _check_even(d_model: int) -> None:
    if d_model <= 0 or d_model % 2 != 0:
        raise ValueError(
            f"d_model={d_model} must be a positive even number: sin and cos fill pairs of columns"
        )


def _frequencies(d_model: int, base: float, dtype: torch.dtype, device=None) -> Tensor:
    """Angular frequency of each sin/cos pair, ``1 / base**(2i/d)``, shape ``(d_model // 2,)``."""
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=device)
    # exp/log form keeps the large powers of base accurate.
    return torch.exp(-two_i * (math.log(base) / d_model)).to(dtype)


@graded("01_positional_encoding")
def sinusoidal_encoding(
    seq_len: int,
    d_model: int,
    base: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """The sinusoidal position table of the lecture.

    Args:
        seq_len: number of positions ``T`` (positions ``0 .. T-1``).
        d_model: model width ``D``; must be even.
        base: wavelength base (10000 in the paper).
        dtype: dtype of the result (computed in float64, then cast).
        device: device of the result.

    Returns:
        Tensor of shape ``(T, D)`` with ``PE[p, 2i] = sin(p w_i)``, ``PE[p, 2i+1] = cos(p w_i)``,
        ``w_i = base**(-2i/D)``.

    Raises:
        ValueError: if ``d_model`` is odd or not positive, or ``seq_len`` is negative.
    """
    _check_even(d_model)
    if seq_len < 0:
        raise ValueError(f"seq_len={seq_len} must be >= 0")
    positions = torch.arange(seq_len, dtype=torch.float64, device=device)  # (T,)
    angles = positions[:, None] * _frequencies(d_model, base, torch.float64, device)  # (T, D/2)
    pe = torch.empty(seq_len, d_model, dtype=torch.float64, device=device)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe.to(dtype)


@graded("01_positional_encoding")
def relative_shift_matrix(
    offset: int | float,
    d_model: int,
    base: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The linear map that moves a sinusoidal encoding ``offset`` positions forward.

    In the row convention, ``sinusoidal_encoding(...)[p + offset] == PE[p] @ M``. ``M`` is block
    diagonal: the block for pair ``i`` is the 2x2 rotation ``[[cos(k w_i), -sin(k w_i)],
    [sin(k w_i), cos(k w_i)]]`` acting on the row ``[sin(p w_i), cos(p w_i)]``; it depends on
    the offset ``k`` only, never on ``p``.

    Args:
        offset: the shift ``k`` (may be negative).
        d_model: model width ``D``; must be even.
        base: wavelength base, as in :func:`sinusoidal_encoding`.
        dtype: dtype of the result.

    Returns:
        Tensor of shape ``(D, D)``.

    Raises:
        ValueError: if ``d_model`` is odd or not positive.
    """
    _check_even(d_model)
    angles = float(offset) * _frequencies(d_model, base, torch.float64)  # (D/2,)
    cos, sin = torch.cos(angles), torch.sin(angles)
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    even = torch.arange(0, d_model, 2)
    m[even, even] = cos
    m[even, even + 1] = -sin
    m[even + 1, even] = sin
    m[even + 1, even + 1] = cos
    return m.to(dtype)


def _check_length(seq_len: int, max_len: int) -> None:
    if seq_len > max_len:
        raise ValueError(
            f"sequence length {seq_len} exceeds max_len={max_len} of the positional encoding"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal table to a batch of embeddings.

    The table is a non-persistent buffer: it follows ``.to(device)`` but is not saved in
    checkpoints, since it is a pure function of ``(max_len, d_model, base)``.

    Args:
        d_model: model width ``D`` (even).
        max_len: longest sequence the module accepts.
        base: wavelength base.
        dropout: dropout applied after the addition (as in the paper).
    """

    pe: Tensor

    def __init__(
        self, d_model: int, max_len: int = 512, base: float = 10000.0, dropout: float = 0.0
    ) -> None:
        super().__init__()
        if max_len <= 0:
            raise ValueError(f"max_len={max_len} must be positive")
        self.d_model = d_model
        self.max_len = max_len
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model, base), persistent=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """Add positions ``0 .. T-1``.

        Args:
            x: embeddings ``(B, T, D)`` (or ``(T, D)``).

        Returns:
            ``x + PE[:T]``, same shape as ``x``.
        """
        seq_len = x.shape[-2]
        _check_length(seq_len, self.max_len)
        return self.dropout(x + self.pe[:seq_len].to(x.dtype))


class LearnedPositionalEncoding(nn.Module):
    """Adds a trained embedding per position (as in BERT and GPT-2).

    Args:
        d_model: model width ``D``.
        max_len: number of positions with a trained vector.
        dropout: dropout applied after the addition.
    """

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.0) -> None:
        super().__init__()
        if max_len <= 0 or d_model <= 0:
            raise ValueError(f"max_len={max_len} and d_model={d_model} must be positive")
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, mean=0.0, std=0.02)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        """Add the vectors of positions ``offset .. offset+T-1``.

        Args:
            x: embeddings ``(B, T, D)`` (or ``(T, D)``).
            offset: index of the first position: how many positions a KV cache already holds
                in incremental decoding. An int is checked against ``max_len``; a one-element
                tensor (a compiled decode step keeps positions on the device) is not, since
                checking would copy it back to the CPU at every step.

        Returns:
            Same shape as ``x``.

        Raises:
            ValueError: if an int ``offset`` puts the last position past ``max_len``.
        """
        seq_len = x.shape[-2]
        if isinstance(offset, Tensor):
            positions = offset + torch.arange(seq_len, device=x.device)  # (T,)
            table = self.embedding(positions)  # (T, D)
        else:
            _check_length(offset + seq_len, self.max_len)
            table = self.embedding.weight[offset : offset + seq_len]  # (T, D): rows of the table
        return self.dropout(x + table)

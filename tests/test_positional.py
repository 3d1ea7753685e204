"""Tests for transformer_lab.positional: the formula, the shift matrices and the modules."""

from __future__ import annotations

import math

import pytest
import torch

from transformer_lab.positional import (
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    relative_shift_matrix,
    sinusoidal_encoding,
)


def test_sinusoidal_matches_formula_entrywise() -> None:
    seq_len, d = 7, 6
    pe = sinusoidal_encoding(seq_len, d, dtype=torch.float64)
    assert pe.shape == (seq_len, d)
    for p in range(seq_len):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert pe[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert pe[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)


def test_sinusoidal_position_zero_and_custom_base() -> None:
    pe = sinusoidal_encoding(3, 4, base=100.0, dtype=torch.float64)
    torch.testing.assert_close(pe[0], torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64))
    # second pair has frequency 1/100**(2/4) = 0.1
    assert pe[2, 2].item() == pytest.approx(math.sin(0.2))
    assert pe.dtype == torch.float64
    assert sinusoidal_encoding(3, 4).dtype == torch.float32


@pytest.mark.parametrize("d_model", [3, 5, 0])
def test_sinusoidal_rejects_odd_or_zero_width(d_model: int) -> None:
    with pytest.raises(ValueError, match=f"d_model={d_model}"):
        sinusoidal_encoding(4, d_model)
    with pytest.raises(ValueError, match=f"d_model={d_model}"):
        relative_shift_matrix(1, d_model)


@pytest.mark.parametrize("offset", [1, 3, -2, 0])
@pytest.mark.parametrize("d_model", [2, 8, 16])
def test_relative_shift_moves_every_position(offset: int, d_model: int) -> None:
    pe = sinusoidal_encoding(40, d_model, dtype=torch.float64)
    m = relative_shift_matrix(offset, d_model, dtype=torch.float64)
    assert m.shape == (d_model, d_model)
    lo, hi = max(0, -offset), 40 - max(0, offset)
    torch.testing.assert_close(pe[lo:hi] @ m, pe[lo + offset : hi + offset])


def test_relative_shift_is_orthogonal_and_composes() -> None:
    m2 = relative_shift_matrix(2, 8, dtype=torch.float64)
    m3 = relative_shift_matrix(3, 8, dtype=torch.float64)
    m5 = relative_shift_matrix(5, 8, dtype=torch.float64)
    torch.testing.assert_close(m2 @ m3, m5)
    torch.testing.assert_close(m2 @ m2.T, torch.eye(8, dtype=torch.float64))
    # block diagonal: nothing outside the 2x2 blocks
    mask = torch.block_diag(*[torch.ones(2, 2)] * 4).bool()
    assert torch.all(m5[~mask] == 0)


def test_sinusoidal_module_adds_table_per_position() -> None:
    module = SinusoidalPositionalEncoding(d_model=8, max_len=10)
    assert "pe" not in module.state_dict()  # non-persistent buffer
    assert "pe" in dict(module.named_buffers())
    x = torch.zeros(2, 5, 8)
    out = module(x)
    torch.testing.assert_close(out[0], sinusoidal_encoding(5, 8))
    torch.testing.assert_close(out[1], sinusoidal_encoding(5, 8))
    # every position gets a different vector (not one vector broadcast to all tokens)
    assert not torch.allclose(out[0, 1], out[0, 2])


def test_modules_reject_too_long_sequences() -> None:
    module = SinusoidalPositionalEncoding(d_model=4, max_len=6)
    with pytest.raises(ValueError, match=r"7.*max_len=6"):
        module(torch.zeros(1, 7, 4))
    learned = LearnedPositionalEncoding(d_model=4, max_len=6)
    with pytest.raises(ValueError, match=r"7.*max_len=6"):
        learned(torch.zeros(1, 7, 4))
    with pytest.raises(ValueError, match=r"8.*max_len=6"):
        learned(torch.zeros(1, 3, 4), offset=5)


def test_learned_module_uses_position_vectors_and_trains() -> None:
    learned = LearnedPositionalEncoding(d_model=4, max_len=6)
    x = torch.zeros(1, 3, 4)
    torch.testing.assert_close(learned(x)[0], learned.embedding.weight[:3])
    torch.testing.assert_close(learned(x, offset=2)[0], learned.embedding.weight[2:5])
    learned(x).sum().backward()
    assert learned.embedding.weight.grad is not None
    assert learned.embedding.weight.grad[:3].abs().sum() > 0
    assert learned.embedding.weight.grad[3:].abs().sum() == 0


def test_learned_module_takes_a_device_offset_for_compiled_decoding() -> None:
    learned = LearnedPositionalEncoding(d_model=4, max_len=6)
    x = torch.randn(2, 1, 4)
    for p in range(6):
        torch.testing.assert_close(learned(x, offset=torch.tensor([p])), learned(x, offset=p))
    torch.testing.assert_close(
        learned(x, offset=torch.tensor([3]))[0, 0], x[0, 0] + learned.embedding.weight[3]
    )

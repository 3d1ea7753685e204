"""Tests for transformer_lab.masks: builders, validation, fully masked rows, causality probe."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from transformer_lab.attention import MultiHeadAttention, attend, masked_attention
from transformer_lab.masks import (
    causal_mask,
    check_mask,
    combine_masks,
    depends_on_future,
    padding_mask,
)


def test_causal_mask_values() -> None:
    m = causal_mask(3)
    assert m.dtype == torch.bool
    expected = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, expected)


def test_padding_mask_values_and_errors() -> None:
    m = padding_mask(torch.tensor([3, 1, 0]), 4)
    expected = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(m, expected)
    with pytest.raises(ValueError, match=r"lengths=\[2, 5\].*max_len=4"):
        padding_mask([2, 5], 4)


def test_combine_masks_shape_and_values() -> None:
    pad = padding_mask([2, 3], 3)
    m = combine_masks(pad, causal_mask(3))
    assert m.shape == (2, 1, 3, 3)
    # batch 0: key 2 is padding, so no query may see it
    assert not m[0, 0, :, 2].any()
    assert torch.equal(m[1, 0], causal_mask(3))
    assert torch.equal(m[0, 0, 2], torch.tensor([True, True, False]))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 4\)"):
        combine_masks(pad, causal_mask(4))
    with pytest.raises(ValueError, match="float32"):
        combine_masks(pad.float(), causal_mask(3))


def test_check_mask_errors_name_shapes_and_dtype() -> None:
    with pytest.raises(ValueError, match=r"torch.float32"):
        check_mask(torch.ones(3, 3), (2, 4, 3, 3))
    with pytest.raises(ValueError, match=r"\(3, 2\).*\(2, 4, 3, 3\)"):
        check_mask(torch.ones(3, 2, dtype=torch.bool), (2, 4, 3, 3))
    # a mask that would enlarge the scores is rejected too
    with pytest.raises(ValueError, match=r"\(5, 1, 3, 3\)"):
        check_mask(torch.ones(5, 1, 3, 3, dtype=torch.bool), (1, 4, 3, 3))
    ok = torch.ones(2, 1, 1, 3, dtype=torch.bool)
    assert check_mask(ok, (2, 4, 3, 3)) is ok


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fully_masked_row_gives_zero_not_nan(dtype: torch.dtype) -> None:
    q = (torch.randn(2, 3, 4) * 30).to(dtype)
    k = (torch.randn(2, 5, 4) * 30).to(dtype)
    v = torch.randn(2, 5, 4).to(dtype)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False  # query 1 may attend nothing
    mask[2, 3:] = False
    out, w = masked_attention(q, k, v, mask)
    assert not torch.isnan(out).any() and not torch.isnan(w).any()
    assert (w[:, 1] == 0).all() and (out[:, 1] == 0).all()
    torch.testing.assert_close(w[:, [0, 2]].sum(-1).float(), torch.ones(2, 2), atol=1e-3, rtol=1e-3)
    assert (w[:, 2, 3:] == 0).all()
    fast, _ = attend(q, k, v, mask, need_weights=False)  # the fused kernel, same rule
    assert not torch.isnan(fast).any()
    assert (fast[:, 1] == 0).all()
    torch.testing.assert_close(fast.float(), out.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_fully_masked_sequence_is_finite(need_weights: bool) -> None:
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 4, 8)
    pad = padding_mask([0, 4], 4)
    out, _ = mha(x, x, x, mask=pad[:, None, None, :], need_weights=need_weights)
    assert torch.isfinite(out).all()


def test_depends_on_future_detects_leaks() -> None:
    x = torch.randn(2, 6, 3)
    assert not depends_on_future(lambda t: t.cumsum(dim=1), x)
    assert depends_on_future(lambda t: t.flip(1).cumsum(dim=1).flip(1), x)
    assert depends_on_future(lambda t: t + t.mean(dim=1, keepdim=True), x)
    assert not depends_on_future(lambda t: t * 2, x)


def test_depends_on_future_with_attention() -> None:
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 5, 8)
    causal = causal_mask(5)
    assert not depends_on_future(lambda t: mha(t, t, t, mask=causal)[0], x)
    assert depends_on_future(lambda t: mha(t, t, t)[0], x)
    # only the last position leaks: still caught
    leaky = causal.clone()
    leaky[3, 4] = True
    assert depends_on_future(lambda t: mha(t, t, t, mask=leaky)[0], x)


def test_depends_on_future_with_tokens() -> None:
    emb = torch.nn.Embedding(7, 4)
    tokens = torch.randint(0, 7, (2, 5))
    assert not depends_on_future(lambda t: emb(t).cumsum(1), tokens, vocab_size=7)
    assert depends_on_future(lambda t: emb(t).sum(1, keepdim=True).expand(-1, 5, -1), tokens)


def test_masked_attention_needs_a_mask_and_equals_scaled_dot_product_attention() -> None:
    from transformer_lab.attention import scaled_dot_product_attention

    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    mask = torch.rand(3, 5) > 0.5
    out, w = masked_attention(q, k, v, mask)
    ref_out, ref_w = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)
    with pytest.raises(ValueError, match="needs a mask"):
        masked_attention(q, k, v, None)  # type: ignore[arg-type]


def test_masks_module_does_not_import_attention() -> None:
    """masks sits below attention: importing it alone must not load the attention module."""
    code = (
        "import sys, transformer_lab.masks; "
        "assert 'transformer_lab.attention' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_lab05_functions_are_marked_graded() -> None:
    from transformer_lab.graded import GRADED

    for name in ("causal_mask", "padding_mask", "combine_masks", "depends_on_future"):
        assert GRADED[f"transformer_lab.masks.{name}"] == "05_masking"
    assert GRADED["transformer_lab.attention.masked_attention"] == "05_masking"

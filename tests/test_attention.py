"""Tests for transformer_lab.attention against torch's own attention and between our three forms."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.attention import (
    KVCache,
    MultiHeadAttention,
    attend,
    load_torch_weights,
    merge_heads,
    scaled_dot_product_attention,
    self_attention_loop,
    self_attention_matrix,
    softmax,
    split_heads,
)
from transformer_lab.masks import causal_mask, padding_mask

F64 = torch.float64


def test_softmax_matches_torch_and_is_stable() -> None:
    x = torch.randn(3, 5, 7, dtype=F64)
    for dim in (0, 1, -1):
        torch.testing.assert_close(softmax(x, dim=dim), torch.softmax(x, dim=dim))
    big = torch.tensor([1000.0, 1001.0, 1002.0])
    out = softmax(big)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.softmax(big - 1000.0, dim=-1))


def test_softmax_of_all_minus_inf_row_is_zero() -> None:
    x = torch.tensor([[0.0, 1.0], [-math.inf, -math.inf]])
    out = softmax(x)
    torch.testing.assert_close(out[1], torch.zeros(2))
    torch.testing.assert_close(out[0].sum(), torch.tensor(1.0))


def _weights(D: int = 6, Dk: int = 4, Dv: int = 5, bias: bool = True):
    g = torch.Generator().manual_seed(1)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=F64)

    return (
        r(D, Dk),
        r(Dk) if bias else None,
        r(D, Dk),
        r(Dk) if bias else None,
        r(D, Dv),
        r(Dv) if bias else None,
    )


@pytest.mark.parametrize("bias", [True, False])
def test_loop_matrix_batched_and_torch_agree(bias: bool) -> None:
    X = torch.randn(5, 6, dtype=F64)
    W_q, b_q, W_k, b_k, W_v, b_v = _weights(bias=bias)
    loop = self_attention_loop(X, W_q, b_q, W_k, b_k, W_v, b_v)
    matrix = self_attention_matrix(X, W_q, b_q, W_k, b_k, W_v, b_v)
    assert loop.shape == (5, 5)
    torch.testing.assert_close(loop, matrix)
    Q = X @ W_q + (b_q if bias else 0)
    K = X @ W_k + (b_k if bias else 0)
    V = X @ W_v + (b_v if bias else 0)
    batched, w = scaled_dot_product_attention(Q[None], K[None], V[None])
    torch.testing.assert_close(batched[0], matrix)
    torch.testing.assert_close(F.scaled_dot_product_attention(Q, K, V), matrix)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 5, dtype=F64))


def test_scaling_is_one_over_sqrt_dk() -> None:
    q = torch.tensor([[[2.0, 0.0, 0.0, 0.0]]], dtype=F64)
    k = torch.tensor([[[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]], dtype=F64)
    v = torch.eye(2, dtype=F64)[None]
    _, w = scaled_dot_product_attention(q, k, v)
    # scores are 2/sqrt(4) = 1 and 0
    expected = torch.softmax(torch.tensor([1.0, 0.0], dtype=F64), -1)
    torch.testing.assert_close(w[0, 0], expected)


@pytest.mark.parametrize("leading", [(), (3,), (2, 3)])
def test_sdpa_any_leading_dims_with_mask_matches_torch(leading: tuple[int, ...]) -> None:
    q = torch.randn(*leading, 4, 8, dtype=F64)
    k = torch.randn(*leading, 6, 8, dtype=F64)
    v = torch.randn(*leading, 6, 3, dtype=F64)
    mask = torch.rand(4, 6) > 0.3
    mask[:, 0] = True  # no fully masked row: torch would give NaN there
    out, w = scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref)
    assert (w[..., ~mask] == 0).all()
    torch.testing.assert_close(attend(q, k, v, mask, need_weights=False)[0], ref)


def test_sdpa_gradcheck_float64() -> None:
    q = torch.randn(1, 2, 3, 4, dtype=F64, requires_grad=True)
    k = torch.randn(1, 2, 3, 4, dtype=F64, requires_grad=True)
    v = torch.randn(1, 2, 3, 4, dtype=F64, requires_grad=True)
    mask = causal_mask(3)
    assert torch.autograd.gradcheck(
        lambda a, b, c: scaled_dot_product_attention(a, b, c)[0], (q, k, v)
    )
    assert torch.autograd.gradcheck(
        lambda a, b, c: scaled_dot_product_attention(a, b, c, mask)[0], (q, k, v)
    )


def test_mha_gradcheck_float64() -> None:
    mha = MultiHeadAttention(4, 2).double()
    x = torch.randn(1, 3, 4, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: mha(t, t, t, causal_mask(3))[0], (x,))


def test_split_and_merge_heads_roundtrip_and_layout() -> None:
    x = torch.arange(2 * 3 * 6, dtype=torch.float32).view(2, 3, 6)
    h = split_heads(x, 3)
    assert h.shape == (2, 3, 3, 2)
    # head 1 of token 2 in batch 0 holds columns 2:4 of that token
    torch.testing.assert_close(h[0, 1, 2], x[0, 2, 2:4])
    torch.testing.assert_close(merge_heads(h), x)


def test_split_heads_rejects_indivisible_width() -> None:
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by n_heads=4"):
        split_heads(torch.zeros(1, 2, 10), 4)
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by n_heads=4"):
        MultiHeadAttention(10, 4)


def _pair(d_model: int = 8, n_heads: int = 2, bias: bool = True):
    theirs = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True).double()
    ours = MultiHeadAttention(d_model, n_heads, bias=bias).double()
    load_torch_weights(ours, theirs)
    return ours, theirs


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_matches_torch_without_mask(bias: bool, need_weights: bool) -> None:
    ours, theirs = _pair(bias=bias)
    q = torch.randn(2, 4, 8, dtype=F64)
    kv = torch.randn(2, 5, 8, dtype=F64)
    out, w = ours(q, kv, kv, need_weights=need_weights)
    ref, ref_w = theirs(q, kv, kv, average_attn_weights=False)
    torch.testing.assert_close(out, ref)
    if need_weights:
        assert w.shape == (2, 2, 4, 5)
        torch.testing.assert_close(w, ref_w)
        _, ref_avg = theirs(q, kv, kv)
        torch.testing.assert_close(w.mean(dim=1), ref_avg)
    else:
        assert w is None


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_matches_torch_with_causal_and_padding_masks(need_weights: bool) -> None:
    ours, theirs = _pair()
    x = torch.randn(3, 5, 8, dtype=F64)
    causal = causal_mask(5)
    # torch's boolean attn_mask means "NOT allowed": invert ours
    out, w = ours(x, x, x, mask=causal, need_weights=need_weights)
    ref, ref_w = theirs(x, x, x, attn_mask=~causal, average_attn_weights=False)
    torch.testing.assert_close(out, ref)
    if need_weights:
        torch.testing.assert_close(w, ref_w)
    pad = padding_mask([5, 3, 1], 5)  # (B, S), True at real tokens
    out, w = ours(x, x, x, mask=pad[:, None, None, :], need_weights=need_weights)
    ref, ref_w = theirs(x, x, x, key_padding_mask=~pad, average_attn_weights=False)
    torch.testing.assert_close(out, ref)
    if need_weights:
        torch.testing.assert_close(w, ref_w)


def test_mha_rejects_bad_masks() -> None:
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match="boolean"):
        mha(x, x, x, mask=torch.ones(5, 5))
    with pytest.raises(ValueError, match=r"\(4, 5\).*\(2, 2, 5, 5\)"):
        mha(x, x, x, mask=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(4, 5\).*\(2, 2, 5, 5\)"):
        mha(x, x, x, mask=torch.ones(4, 5, dtype=torch.bool), need_weights=False)


def test_load_torch_weights_rejects_mismatch() -> None:
    with pytest.raises(ValueError, match=r"embed_dim=8, num_heads=4.*d_model=8, n_heads=2"):
        load_torch_weights(MultiHeadAttention(8, 2), nn.MultiheadAttention(8, 4))
    with pytest.raises(ValueError, match="bias"):
        load_torch_weights(MultiHeadAttention(8, 2, bias=False), nn.MultiheadAttention(8, 2))


def test_mha_heads_are_independent() -> None:
    """Zeroing head 0's value projection leaves head 1's output slice unchanged."""
    mha = MultiHeadAttention(4, 2).double()
    with torch.no_grad():
        mha.out_proj.weight.copy_(torch.eye(4))
        mha.out_proj.bias.zero_()
    x = torch.randn(1, 3, 4, dtype=F64)
    before, _ = mha(x, x, x)
    with torch.no_grad():
        mha.v_proj.weight[:2].zero_()
        mha.v_proj.bias[:2].zero_()
    after, _ = mha(x, x, x)
    torch.testing.assert_close(after[..., 2:], before[..., 2:])
    torch.testing.assert_close(after[..., :2], torch.zeros(1, 3, 2, dtype=F64))


def test_mha_dropout_only_in_training() -> None:
    mha = MultiHeadAttention(8, 2, dropout=0.5)
    x = torch.randn(2, 5, 8)
    mha.eval()
    a, _ = mha(x, x, x)
    b, _ = mha(x, x, x, need_weights=False)
    torch.testing.assert_close(a, b)
    mha.train()
    c, _ = mha(x, x, x)
    assert not torch.allclose(a, c)


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_is_causal_equals_explicit_causal_mask(need_weights: bool) -> None:
    mha = MultiHeadAttention(8, 2).double()
    x = torch.randn(2, 5, 8, dtype=F64)
    ref, ref_w = mha(x, x, x, mask=causal_mask(5), need_weights=need_weights)
    out, w = mha(x, x, x, is_causal=True, need_weights=need_weights)
    torch.testing.assert_close(out, ref)
    if need_weights:
        torch.testing.assert_close(w, ref_w)
    with pytest.raises(ValueError, match=r"is_causal=True.*\(5, 5\)"):
        mha(x, x, x, mask=causal_mask(5), is_causal=True)
    with pytest.raises(ValueError, match=r"T=5, S=3"):
        mha(x, x[:, :3], x[:, :3], is_causal=True)


# ----------------------------------------------------------------------------- one core


class _CountMatmuls(torch.overrides.TorchFunctionMode):
    """Counts the matrix products a computation performs."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm):
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_attend_weights_and_fused_paths_agree() -> None:
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=F64) for _ in range(3))
    mask = torch.rand(5, 5) > 0.4
    mask[:, 0] = True
    out, w = attend(q, k, v, mask)
    assert w is not None and w.shape == (2, 3, 5, 5)
    fused, none = attend(q, k, v, mask, need_weights=False)
    assert none is None
    torch.testing.assert_close(fused, out)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, ref)
    # is_causal without a mask equals the causal mask, on both paths
    causal_out, causal_w = attend(q, k, v, is_causal=True)
    torch.testing.assert_close(causal_out, attend(q, k, v, causal_mask(5))[0])
    assert causal_w is not None and (causal_w[..., ~causal_mask(5)] == 0).all()
    torch.testing.assert_close(attend(q, k, v, need_weights=False, is_causal=True)[0], causal_out)


def test_mha_dropout_output_is_computed_once_from_the_returned_weights() -> None:
    """With dropout, the output is dropout(weights) @ v in one pass (two matmuls, not three)."""
    mha = MultiHeadAttention(8, 2, dropout=0.5).double().train()
    x = torch.randn(2, 5, 8, dtype=F64)
    torch.manual_seed(3)
    with _CountMatmuls() as counter:
        out, w = mha(x, x, x)
    assert counter.count == 2  # scores and weights @ values
    # the same dropout mask, drawn from the same seed, reproduces the output
    q = split_heads(mha.q_proj(x), 2)
    v = split_heads(mha.v_proj(x), 2)
    torch.manual_seed(3)
    expected = mha.out_proj(merge_heads(F.dropout(w, p=0.5) @ v))
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 5, dtype=F64))  # before dropout
    assert q.shape == (2, 2, 5, 4)


def test_mha_matches_torch_with_distinct_key_and_value() -> None:
    ours, theirs = _pair()
    q = torch.randn(2, 4, 8, dtype=F64)
    key = torch.randn(2, 6, 8, dtype=F64)
    value = torch.randn(2, 6, 8, dtype=F64)
    pad = padding_mask([6, 2], 6)
    for need_weights in (True, False):
        out, w = ours(q, key, value, mask=pad[:, None, None, :], need_weights=need_weights)
        ref, ref_w = theirs(q, key, value, key_padding_mask=~pad, average_attn_weights=False)
        torch.testing.assert_close(out, ref)
        if need_weights:
            torch.testing.assert_close(w, ref_w)
    # swapping key and value changes the result: both are really used
    assert not torch.allclose(ours(q, value, key)[0], ours(q, key, value)[0])


def test_mha_matches_bare_sdpa_with_copied_weights() -> None:
    mha = MultiHeadAttention(12, 3).double()
    x = torch.randn(2, 7, 12, dtype=F64)
    B, T, D, H = 2, 7, 12, 3
    q = F.linear(x, mha.q_proj.weight, mha.q_proj.bias).view(B, T, H, D // H).transpose(1, 2)
    k = F.linear(x, mha.k_proj.weight, mha.k_proj.bias).view(B, T, H, D // H).transpose(1, 2)
    v = F.linear(x, mha.v_proj.weight, mha.v_proj.bias).view(B, T, H, D // H).transpose(1, 2)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, Dh)
    ref = F.linear(a.transpose(1, 2).reshape(B, T, D), mha.out_proj.weight, mha.out_proj.bias)
    for need_weights in (True, False):
        out, _ = mha(x, x, x, need_weights=need_weights, is_causal=True)
        torch.testing.assert_close(out, ref)


def test_mha_with_kv_cache_equals_full_causal_attention() -> None:
    mha = MultiHeadAttention(8, 2).double().eval()
    x = torch.randn(2, 6, 8, dtype=F64)
    full, _ = mha(x, x, x, is_causal=True)
    cache = KVCache(1, 2, 2, 10, 4, dtype=F64)
    outs = []
    for start, end in ((0, 3), (3, 4), (4, 6)):  # a prompt, then chunks
        mask = cache.visible[start:end, :end]
        out, _ = mha(x[:, start:end], x[:, start:end], x[:, start:end], mask,
                     kv_cache=cache.layer(0, slice(start, end)))  # fmt: skip
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=1), full)
    # static shapes: all 10 slots under a mask, positions as a tensor
    static, _ = mha(x[:, 5:6], x[:, 5:6], x[:, 5:6], cache.visible[5:6],
                    kv_cache=cache.layer(0, torch.tensor([5])))  # fmt: skip
    torch.testing.assert_close(static, full[:, 5:6])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("need_weights", [True, False])
def test_attend_fully_masked_rows_are_zero_in_every_dtype(
    dtype: torch.dtype, need_weights: bool
) -> None:
    q = (torch.randn(2, 2, 3, 4) * 30).to(dtype)
    k = (torch.randn(2, 2, 5, 4) * 30).to(dtype)
    v = torch.randn(2, 2, 5, 4).to(dtype)
    mask = torch.ones(2, 1, 3, 5, dtype=torch.bool)
    mask[0, :, 1] = False  # batch 0, query 1 sees nothing
    mask[1] = False  # batch 1: an empty sequence
    out, w = attend(q, k, v, mask, need_weights=need_weights)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert (out[0, :, 1] == 0).all() and (out[1] == 0).all()
    if need_weights:
        assert w is not None and torch.isfinite(w).all() and (w[1] == 0).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (its fused kernels)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fully_masked_rows_are_zero_on_cuda(dtype: torch.dtype) -> None:
    q, k, v = (torch.randn(2, 4, 64, 32, device="cuda", dtype=dtype) for _ in range(3))
    mask = padding_mask([64, 0], 64).cuda()[:, None, None, :]  # sequence 1 is empty
    for need_weights in (True, False):
        out, _ = attend(q, k, v, mask, need_weights=need_weights)
        assert torch.isfinite(out).all() and (out[1] == 0).all()
        ref = F.scaled_dot_product_attention(q[:1], k[:1], v[:1])
        torch.testing.assert_close(out[:1], ref, atol=2e-2, rtol=2e-2)

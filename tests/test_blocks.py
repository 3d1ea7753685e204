"""Tests for transformer_lab.blocks: layer norm, feed-forward, and blocks against torch's layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.blocks import (
    DecoderBlock,
    EncoderBlock,
    FeedForward,
    LayerNorm,
    layer_norm,
    load_torch_decoder_layer,
    load_torch_encoder_layer,
)
from transformer_lab.masks import causal_mask, combine_masks, padding_mask

F64 = torch.float64
D, H, FF = 8, 2, 16


def test_layer_norm_matches_torch() -> None:
    x = torch.randn(2, 3, D, dtype=F64) * 5 + 3
    w, b = torch.randn(D, dtype=F64), torch.randn(D, dtype=F64)
    torch.testing.assert_close(layer_norm(x, w, b), F.layer_norm(x, (D,), w, b))
    torch.testing.assert_close(layer_norm(x, w, b, eps=0.5), F.layer_norm(x, (D,), w, b, eps=0.5))
    y = layer_norm(x, None, None)
    torch.testing.assert_close(y.mean(-1), torch.zeros(2, 3, dtype=F64))
    torch.testing.assert_close(
        y.var(-1, unbiased=False), torch.ones(2, 3, dtype=F64), atol=1e-4, rtol=0
    )


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_module_fused_and_explicit_agree(bias: bool) -> None:
    ln = LayerNorm(D, bias=bias).double()
    with torch.no_grad():
        ln.weight.normal_()
    x = torch.randn(4, D, dtype=F64)
    ref = ln(x)
    ln.fused = True
    torch.testing.assert_close(ln(x), ref)
    assert (ln.bias is None) == (not bias)
    torch_ln = nn.LayerNorm(D, bias=bias).double()
    torch_ln.load_state_dict(ln.state_dict())
    torch.testing.assert_close(torch_ln(x), ref)


def test_feed_forward_is_position_wise() -> None:
    ff = FeedForward(D, FF)
    x = torch.randn(2, 5, D)
    out = ff(x)
    torch.testing.assert_close(out[:, 2], ff(x[:, 2]))
    torch.testing.assert_close(out, ff.linear2(torch.relu(ff.linear1(x))))
    with pytest.raises(ValueError, match="activation='swish'"):
        FeedForward(D, FF, activation="swish")


def _encoder_pair(norm_first: bool, activation: str = "relu"):
    theirs = nn.TransformerEncoderLayer(
        D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first, activation=activation
    ).double()
    ours = EncoderBlock(D, H, FF, norm_first=norm_first, activation=activation).double()
    load_torch_encoder_layer(ours, theirs)
    return ours, theirs


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_block_matches_torch(norm_first: bool, activation: str) -> None:
    ours, theirs = _encoder_pair(norm_first, activation)
    x = torch.randn(3, 5, D, dtype=F64)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
    pad = padding_mask([5, 3, 2], 5)
    torch.testing.assert_close(
        ours(x, mask=pad[:, None, None, :]),
        theirs(x, src_key_padding_mask=~pad),
        atol=1e-5,
        rtol=1e-5,
    )
    causal = causal_mask(5)
    torch.testing.assert_close(
        ours(x, mask=causal), theirs(x, src_mask=~causal), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_block_matches_torch(norm_first: bool) -> None:
    theirs = nn.TransformerDecoderLayer(
        D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first
    ).double()
    ours = DecoderBlock(D, H, FF, norm_first=norm_first).double()
    load_torch_decoder_layer(ours, theirs)
    x = torch.randn(2, 4, D, dtype=F64)
    memory = torch.randn(2, 6, D, dtype=F64)
    causal = causal_mask(4)
    src_pad = padding_mask([6, 3], 6)
    tgt_pad = padding_mask([4, 2], 4)
    ref = theirs(
        x,
        memory,
        tgt_mask=~causal,
        tgt_key_padding_mask=~tgt_pad,
        memory_key_padding_mask=~src_pad,
    )
    out = ours(
        x,
        memory,
        self_mask=combine_masks(tgt_pad, causal),
        memory_mask=src_pad[:, None, None, :],
    )
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours(x, memory), theirs(x, memory), atol=1e-5, rtol=1e-5)


def test_loaders_reject_mismatched_layers() -> None:
    theirs = nn.TransformerEncoderLayer(D, H, FF, batch_first=True, norm_first=True)
    with pytest.raises(ValueError, match=r"norm_first=True.*norm_first=False"):
        load_torch_encoder_layer(EncoderBlock(D, H, FF), theirs)
    theirs = nn.TransformerEncoderLayer(D, H, FF, batch_first=True, activation="gelu")
    with pytest.raises(ValueError, match=r"'gelu'.*'relu'"):
        load_torch_encoder_layer(EncoderBlock(D, H, FF), theirs)


def test_decoder_self_mask_blocks_future_but_memory_is_visible() -> None:
    block = DecoderBlock(D, H, FF).eval()
    x = torch.randn(1, 4, D)
    memory = torch.randn(1, 3, D)
    causal = causal_mask(4)
    base = block(x, memory, self_mask=causal)
    x2 = x.clone()
    x2[:, 3] += 1.0
    changed = block(x2, memory, self_mask=causal)
    torch.testing.assert_close(changed[:, :3], base[:, :3])
    assert not torch.allclose(changed[:, 3], base[:, 3])
    memory2 = memory.clone()
    memory2[:, 2] += 1.0
    assert not torch.allclose(block(x, memory2, self_mask=causal)[:, 0], base[:, 0])


def test_pre_norm_keeps_residual_stream() -> None:
    """With zeroed sub-layer outputs a pre-norm block is the identity; post-norm is not."""
    pre = EncoderBlock(D, H, FF, norm_first=True)
    post = EncoderBlock(D, H, FF, norm_first=False)
    for block in (pre, post):
        with torch.no_grad():
            block.self_attn.out_proj.weight.zero_()
            block.self_attn.out_proj.bias.zero_()
            block.ff.linear2.weight.zero_()
            block.ff.linear2.bias.zero_()
    x = torch.randn(2, 3, D) * 3 + 1
    torch.testing.assert_close(pre(x), x)
    assert not torch.allclose(post(x), x)


@pytest.mark.parametrize("cls", [EncoderBlock, DecoderBlock])
def test_each_block_lists_its_layers_in_its_own_init(cls: type) -> None:
    assert "__init__" in vars(cls), f"{cls.__name__} must define its own __init__"
    assert cls.__bases__ == (nn.Module,)


def test_block_state_dicts_keep_torch_layer_names() -> None:
    enc = [k for k in EncoderBlock(D, H, FF).state_dict() if not k.endswith("bias")]
    assert enc == [
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.out_proj.weight",
        "ff.linear1.weight",
        "ff.linear2.weight",
        "norm1.weight",
        "norm2.weight",
    ]
    dec = [k.split(".")[0] for k in DecoderBlock(D, H, FF).state_dict()]
    assert list(dict.fromkeys(dec)) == ["self_attn", "cross_attn", "ff", "norm1", "norm2", "norm3"]


def test_decoder_block_is_marked_graded_by_lab_06() -> None:
    from transformer_lab.graded import GRADED

    assert GRADED["transformer_lab.blocks.DecoderBlock"] == "06_decoder_training"
    assert GRADED["transformer_lab.blocks.EncoderBlock"] == "04_transformer_block"


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_blocks_match_torch_in_train_and_eval_mode(norm_first: bool, mode: str) -> None:
    """In eval mode under no_grad torch's encoder layer takes its fused inference path."""
    x = torch.randn(3, 5, D, dtype=F64)
    memory = torch.randn(3, 7, D, dtype=F64)
    pad = padding_mask([5, 3, 1], 5)
    src_pad = padding_mask([7, 4, 2], 7)
    ours, theirs = _encoder_pair(norm_first)
    dec_theirs = nn.TransformerDecoderLayer(
        D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first
    ).double()
    dec_ours = DecoderBlock(D, H, FF, norm_first=norm_first).double()
    load_torch_decoder_layer(dec_ours, dec_theirs)
    for module in (ours, theirs, dec_ours, dec_theirs):
        module.train(mode == "train")
    causal = causal_mask(5)
    with torch.no_grad():
        torch.testing.assert_close(
            ours(x, mask=pad[:, None, None, :]), theirs(x, src_key_padding_mask=~pad)
        )
        out = dec_ours(
            x, memory, self_mask=combine_masks(pad, causal), memory_mask=src_pad[:, None, None, :]
        )
        ref = dec_theirs(
            x,
            memory,
            tgt_mask=~causal,
            tgt_key_padding_mask=~pad,
            memory_key_padding_mask=~src_pad,
        )
    # padded query rows are not compared: torch's fast path may leave them at any value
    torch.testing.assert_close(out[pad], ref[pad])

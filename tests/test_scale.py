"""Tests for transformer_lab.scale: parameter counts, 6ND compute, KV-cache memory, GPT-3."""

from __future__ import annotations

import pytest
import torch

from transformer_lab.models import GPT, GPTConfig
from transformer_lab.scale import GPT3, gpt_param_count, kv_cache_bytes, training_flops


def test_gpt2_small_counts() -> None:
    assert gpt_param_count(12, 768, 50257, 1024) == 124_439_808
    assert gpt_param_count(12, 768, 50257, 1024, bias=False) == 124_337_664
    # an untied output layer adds V * D
    assert gpt_param_count(12, 768, 50257, 1024, tie_weights=False) == 124_439_808 + 50257 * 768


@pytest.mark.parametrize(
    ("n_layers", "d_model", "vocab", "n_ctx", "bias", "tie", "d_ff"),
    [
        (1, 8, 5, 4, True, True, None),
        (2, 12, 7, 9, False, True, None),
        (3, 16, 11, 6, True, False, 20),
        (2, 6, 3, 2, False, False, 5),
    ],
)
def test_count_matches_an_instantiated_model(
    n_layers, d_model, vocab, n_ctx, bias, tie, d_ff
) -> None:
    config = GPTConfig(
        vocab_size=vocab,
        n_ctx=n_ctx,
        d_model=d_model,
        n_layers=n_layers,
        n_heads=2,
        d_ff=d_ff,
        bias=bias,
        tie_weights=tie,
    )
    model = GPT(config)
    assert sum(p.numel() for p in model.parameters()) == gpt_param_count(
        n_layers, d_model, vocab, n_ctx, bias=bias, tie_weights=tie, d_ff=d_ff
    )


def test_dominant_term_is_twelve_l_d_squared() -> None:
    n = gpt_param_count(48, 1600, 50257, 1024)  # GPT-2 XL: about 1.56B
    assert n == pytest.approx(1.558e9, rel=1e-3)
    assert 12 * 48 * 1600**2 / n == pytest.approx(0.95, abs=0.01)


def test_training_flops_is_six_n_d() -> None:
    assert training_flops(124e6, 10e9) == pytest.approx(6 * 124e6 * 10e9)
    assert GPT3.training_flops() == pytest.approx(3.15e23)
    with pytest.raises(ValueError, match=r"n_params=0.*n_tokens=5"):
        training_flops(0, 5)


def test_kv_cache_bytes() -> None:
    # 2 (k and v) * L * T * D * B * bytes
    assert kv_cache_bytes(12, 768, 1024) == 2 * 12 * 1024 * 768 * 2
    assert kv_cache_bytes(2, 4, 3, batch_size=5, bytes_per_value=4) == 2 * 2 * 3 * 4 * 5 * 4
    # matches the memory of the model's own cache
    model = GPT(GPTConfig(vocab_size=7, n_ctx=8, d_model=16, n_layers=3, n_heads=4))
    cache = model.new_kv_cache(2)
    real = cache.k.numel() * cache.k.element_size() + cache.v.numel() * cache.v.element_size()
    assert real == kv_cache_bytes(3, 16, 8, batch_size=2, bytes_per_value=4)
    with pytest.raises(ValueError, match="batch_size=0"):
        kv_cache_bytes(1, 2, 3, batch_size=0)


def test_gpt3_from_the_lecture_numbers() -> None:
    assert (GPT3.n_layers, GPT3.d_model, GPT3.n_heads, GPT3.n_ctx) == (96, 12288, 96, 2048)
    count = GPT3.param_count()
    assert count == pytest.approx(175e9, rel=0.01)
    preset = GPTConfig.from_name("gpt3")
    assert preset.param_count() == count
    with torch.device("meta"):
        assert sum(p.numel() for p in GPT(preset).parameters()) == count
    # a full fp16 cache for one 2048-token sequence: about 9.7 GB
    assert kv_cache_bytes(96, 12288, 2048) == pytest.approx(9.66e9, rel=1e-3)


def test_param_count_errors_name_values() -> None:
    with pytest.raises(ValueError, match="n_layers=0"):
        gpt_param_count(0, 768, 50257, 1024)
    with pytest.raises(ValueError, match="d_ff=0"):
        gpt_param_count(1, 8, 5, 4, d_ff=0)

"""Tests for transformer_lab.models: configs, encoder properties, seq2seq masking, GPT, KV cache."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.attention import MultiHeadAttention
from transformer_lab.blocks import load_torch_decoder_layer, load_torch_encoder_layer
from transformer_lab.masks import depends_on_future, padding_mask
from transformer_lab.models import (
    GPT,
    GPT_PRESETS,
    CausalSelfAttention,
    Encoder,
    EncoderClassifier,
    EncoderConfig,
    GPTConfig,
    Seq2SeqConfig,
    Seq2SeqTransformer,
)
from transformer_lab.positional import LearnedPositionalEncoding
from transformer_lab.scale import gpt_param_count

# ----------------------------------------------------------------------------- configs


@pytest.mark.parametrize(
    ("cls", "kwargs", "pattern"),
    [
        (
            EncoderConfig,
            dict(vocab_size=10, d_model=10, n_heads=4),
            "d_model=10 is not divisible by n_heads=4",
        ),
        (EncoderConfig, dict(vocab_size=0), "vocab_size=0"),
        (EncoderConfig, dict(vocab_size=10, positional="rope"), "positional='rope'"),
        (EncoderConfig, dict(vocab_size=10, head="cls"), "head='cls'"),
        (EncoderConfig, dict(vocab_size=10, dropout=1.5), r"dropout=1.5"),
        (
            Seq2SeqConfig,
            dict(src_vocab_size=5, tgt_vocab_size=5, n_decoder_layers=0),
            "n_decoder_layers=0",
        ),
        (
            Seq2SeqConfig,
            dict(src_vocab_size=5, tgt_vocab_size=5, eos_id=7),
            "eos_id=7.*tgt_vocab_size=5",
        ),
        (
            GPTConfig,
            dict(vocab_size=10, d_model=10, n_heads=4),
            "d_model=10 is not divisible by n_heads=4",
        ),
        (GPTConfig, dict(vocab_size=10, n_ctx=0, n_layers=-1), "n_ctx=0, n_layers=-1"),
    ],
)
def test_configs_validate_and_name_values(cls, kwargs, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        cls(**kwargs)


def test_gpt_presets() -> None:
    small = GPTConfig.from_name("char-small")
    assert (small.n_layers, small.n_heads, small.d_model, small.n_ctx) == (4, 4, 128, 64)
    medium = GPTConfig.from_name("char-medium", vocab_size=80)
    assert (medium.n_layers, medium.n_heads, medium.d_model, medium.n_ctx) == (6, 6, 384, 256)
    assert medium.vocab_size == 80
    gpt2 = GPTConfig.from_name("gpt2")
    assert (gpt2.n_layers, gpt2.d_model, gpt2.vocab_size, gpt2.n_ctx) == (12, 768, 50257, 1024)
    gpt3 = GPTConfig.from_name("gpt3")
    assert (gpt3.n_layers, gpt3.d_model, gpt3.n_heads, gpt3.n_ctx) == (96, 12288, 96, 2048)
    with pytest.raises(ValueError, match=r"'gpt5'.*char-small"):
        GPTConfig.from_name("gpt5")


@pytest.mark.parametrize("name", sorted(GPT_PRESETS))
@pytest.mark.parametrize(("bias", "tie"), [(True, True), (False, False)])
def test_preset_param_counts_match_model(name: str, bias: bool, tie: bool) -> None:
    config = GPTConfig.from_name(name, bias=bias, tie_weights=tie)
    with torch.device("meta"):  # no memory, no init cost, even for GPT-3
        model = GPT(config)
    counted = sum(p.numel() for p in model.parameters())
    assert counted == config.param_count()
    assert counted == gpt_param_count(
        config.n_layers, config.d_model, config.vocab_size, config.n_ctx, bias=bias, tie_weights=tie
    )


# ----------------------------------------------------------------------------- encoder


def _encoder(**kwargs) -> EncoderClassifier:
    config = EncoderConfig(vocab_size=11, max_len=12, d_model=16, n_heads=2, n_layers=2, **kwargs)
    return EncoderClassifier(config).eval()


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_without_positions_is_permutation_equivariant(norm_first: bool) -> None:
    tokens = torch.randint(0, 11, (2, 7))
    perm = torch.randperm(7)
    model = _encoder(positional="none", norm_first=norm_first)
    torch.testing.assert_close(model(tokens)[:, perm], model(tokens[:, perm]))
    for kind in ("sinusoidal", "learned"):
        model = _encoder(positional=kind, norm_first=norm_first)
        assert not torch.allclose(model(tokens)[:, perm], model(tokens[:, perm]), atol=1e-4)


@pytest.mark.parametrize("head", ["token", "sequence"])
def test_padding_does_not_change_real_positions(head: str) -> None:
    model = _encoder(head=head, num_classes=3)
    lengths = torch.tensor([7, 4])
    tokens = torch.randint(3, 11, (2, 7))
    pad = padding_mask(lengths, 7)
    out = model(tokens, pad)
    other = tokens.masked_fill(~pad, 0)  # different pad ids
    out2 = model(other, pad)
    alone = model(tokens[1:, :4])  # the short sequence without any padding
    if head == "token":
        assert out.shape == (2, 7, 3)
        torch.testing.assert_close(out[pad], out2[pad])
        torch.testing.assert_close(out[1, :4], alone[0])
    else:
        assert out.shape == (2, 3)
        torch.testing.assert_close(out, out2)
        torch.testing.assert_close(out[1], alone[0])


def test_encoder_uses_student_blocks_and_checks_lengths() -> None:
    calls: list[tuple[int, ...] | None] = []

    class Recorder(nn.Module):
        def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
            calls.append(None if mask is None else tuple(mask.shape))
            return x

    config = EncoderConfig(vocab_size=11, max_len=12, d_model=16, n_heads=2)
    model = EncoderClassifier(config, blocks=[Recorder(), Recorder(), Recorder()])
    tokens = torch.randint(0, 11, (2, 5))
    model(tokens, padding_mask([5, 3], 5))
    assert calls == [(2, 1, 1, 5)] * 3
    with pytest.raises(ValueError, match=r"T=13 exceeds max_len=12"):
        model(torch.zeros(1, 13, dtype=torch.long))
    with pytest.raises(ValueError, match="padding_mask"):
        model(tokens, torch.ones(2, 4, dtype=torch.bool))


# ----------------------------------------------------------------------------- seq2seq


def _seq2seq(norm_first: bool = False) -> Seq2SeqTransformer:
    config = Seq2SeqConfig(
        src_vocab_size=9, tgt_vocab_size=8, max_len=10, d_model=16, n_heads=2, norm_first=norm_first
    )
    return Seq2SeqTransformer(config).eval()


@pytest.mark.parametrize("norm_first", [False, True])
def test_seq2seq_decoder_is_causal_and_source_padding_is_hidden(norm_first: bool) -> None:
    model = _seq2seq(norm_first)
    src = torch.randint(3, 9, (2, 6))
    src_pad = padding_mask([6, 4], 6)
    tgt = torch.randint(3, 8, (2, 5))
    logits = model(src, tgt, src_pad)
    assert logits.shape == (2, 5, 8)
    memory = model.encode(src, src_pad)
    assert not depends_on_future(lambda t: model.decode(t, memory, src_pad), tgt, vocab_size=8)
    # padded source tokens are invisible
    src2 = src.masked_fill(~src_pad, 0)
    torch.testing.assert_close(model(src2, tgt, src_pad), logits)
    # but real source tokens matter
    src3 = src.clone()
    src3[:, 0] = (src3[:, 0] + 1 - 3) % 6 + 3
    assert not torch.allclose(model(src3, tgt, src_pad), logits)


def test_seq2seq_target_padding_leaves_real_positions() -> None:
    model = _seq2seq()
    src = torch.randint(3, 9, (1, 6))
    tgt = torch.randint(3, 8, (1, 5))
    tgt_pad = padding_mask([3], 5)
    full = model(src, tgt, tgt_padding_mask=tgt_pad)
    short = model(src, tgt[:, :3])
    torch.testing.assert_close(full[:, :3], short)


def test_seq2seq_learns_to_copy_a_batch() -> None:
    torch.manual_seed(0)
    model = _seq2seq().train()
    src = torch.randint(3, 8, (8, 5))
    tgt_in = torch.cat([torch.ones(8, 1, dtype=torch.long), src], dim=1)  # BOS + copy
    tgt_out = torch.cat([src, torch.full((8, 1), 2)], dim=1)  # copy + EOS
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = nn.functional.cross_entropy(model(src, tgt_in).flatten(0, 1), tgt_out.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1
    model.eval()
    assert torch.equal(model(src, tgt_in).argmax(-1), tgt_out)


# ----------------------------------------------------------------------------- GPT


def _gpt(**kwargs) -> GPT:
    config = GPTConfig(vocab_size=13, n_ctx=16, d_model=16, n_layers=2, n_heads=2, **kwargs)
    return GPT(config).eval()


@pytest.mark.parametrize("bias", [True, False])
def test_gpt_future_tokens_leave_past_logits_exactly_unchanged(bias: bool) -> None:
    model = _gpt(bias=bias)
    idx = torch.randint(0, 13, (2, 10))
    logits = model(idx)
    assert logits.shape == (2, 10, 13)
    for t in (0, 4, 8):
        changed = idx.clone()
        changed[:, t + 1 :] = (changed[:, t + 1 :] + 5) % 13
        assert torch.equal(model(changed)[:, : t + 1], logits[:, : t + 1])
        assert not torch.allclose(model(changed)[:, t + 1 :], logits[:, t + 1 :])


def test_gpt_rejects_too_long_input() -> None:
    model = _gpt()
    with pytest.raises(ValueError, match=r"T=17 exceeds n_ctx=16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    cache = model.new_kv_cache(1)
    model(torch.zeros(1, 10, dtype=torch.long), cache)
    with pytest.raises(ValueError, match=r"10 cached \+ T=7 new positions exceed n_ctx=16"):
        model(torch.zeros(1, 7, dtype=torch.long), cache)


def test_gpt_kv_cache_matches_full_forward() -> None:
    model = _gpt().double()
    idx = torch.randint(0, 13, (3, 12))
    full = model(idx)
    cache = model.new_kv_cache(3)
    assert cache.k.dtype == torch.float64
    chunks = [model(idx[:, :5], cache), model(idx[:, 5:6], cache), model(idx[:, 6:9], cache)]
    chunks += [model(idx[:, t : t + 1], cache) for t in range(9, 12)]
    assert cache.length == 12
    torch.testing.assert_close(torch.cat(chunks, dim=1), full)


def test_gpt_prompt_from_position_zero_attends_in_the_kernels_causal_mode() -> None:
    """A cached prompt from position 0 passes ``is_causal=True`` and no mask (issue 39: SDPA's
    masked kernel costs 1.8-2.2x on a GPU); it equals the explicit mask's result, and a later
    chunk, which reads the stored prefix, keeps its mask."""
    model = _gpt().double().requires_grad_(False)
    idx = torch.randint(0, 13, (2, 7))
    seen: list[tuple[bool, bool]] = []
    for block in model.blocks:
        block.attn.register_forward_pre_hook(
            lambda m, args, kwargs: seen.append((args[3] is None, kwargs["is_causal"])),
            with_kwargs=True,
        )
    cache = model.new_kv_cache(2)
    fast = model(idx[:, :5], cache)
    assert seen == [(True, True)] * len(model.blocks)
    # The explicit path: every slot under the cache's boolean mask rows.
    explicit = model(idx[:, :5], model.new_kv_cache(2), offset=torch.tensor([0]))
    torch.testing.assert_close(fast, explicit)
    seen.clear()
    later = model(idx[:, 5:7], cache)
    assert seen == [(False, False)] * len(model.blocks)
    torch.testing.assert_close(torch.cat([fast, later], dim=1), model(idx))


def test_gpt_weight_tying_and_init() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, n_ctx=32, d_model=64, n_layers=4, n_heads=4))
    assert model.lm_head.weight is model.tok_emb.weight
    assert model.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.1)
    proj = model.blocks[0].attn.out_proj.weight
    assert proj.std().item() == pytest.approx(0.02 / (2 * 4) ** 0.5, rel=0.1)
    untied = GPT(GPTConfig(vocab_size=50, n_ctx=32, d_model=64, tie_weights=False))
    assert untied.lm_head.weight is not untied.tok_emb.weight
    no_bias = GPT(GPTConfig(vocab_size=50, n_ctx=32, d_model=64, bias=False))
    assert not any(name.endswith("bias") for name, _ in no_bias.named_parameters())


def test_gpt_dropout_only_in_training_and_overfits() -> None:
    torch.manual_seed(0)
    model = _gpt(dropout=0.1)
    idx = torch.randint(0, 13, (4, 16))
    model.eval()
    torch.testing.assert_close(model(idx), model(idx))
    model.train()
    assert not torch.allclose(model(idx), model(idx))
    model = _gpt().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(80):
        logits = model(idx[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.2


def test_encoder_needs_positions_to_learn_reversal() -> None:
    """Every input is a permutation of the same six tokens: without positions the encoder sees
    the same bag of tokens each time, so each output can depend on its own token only, and
    reversal (whose answer depends on where the token sits) cannot be learned."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.stack([torch.randperm(6, generator=gen) for _ in range(24)])  # (24, 6)
    targets = tokens.flip(1)
    accuracy = {}
    for kind in ("sinusoidal", "none"):
        torch.manual_seed(0)
        config = EncoderConfig(vocab_size=6, max_len=6, d_model=32, n_heads=4, positional=kind)
        model = EncoderClassifier(config)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _ in range(100):
            loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        accuracy[kind] = (model(tokens).argmax(-1) == targets).float().mean().item()
    assert accuracy["sinusoidal"] > 0.95
    assert accuracy["none"] < 0.5  # the best fixed token-to-token map scores about 1/3


# ----------------------------------------------------------------------------- references


def _sinusoids(T: int, D: int) -> torch.Tensor:
    """The paper's table written out entry by entry (independent of transformer_lab)."""
    pe = torch.zeros(T, D, dtype=torch.float64)
    for p in range(T):
        for i in range(0, D, 2):
            pe[p, i] = math.sin(p / 10000 ** (i / D))
            pe[p, i + 1] = math.cos(p / 10000 ** (i / D))
    return pe


def test_token_embedding_is_scaled_by_sqrt_d_model() -> None:
    """Embeddings start at N(0, 1/D) and are multiplied by sqrt(D): unit scale, like the
    sinusoids they are added to."""
    model = _encoder(positional="none").double()
    embed = model.encoder.embed
    tokens = torch.arange(11)[None]
    D = 16
    torch.testing.assert_close(embed(tokens)[0], embed.embedding.weight * math.sqrt(D))
    big = EncoderClassifier(EncoderConfig(vocab_size=500, d_model=256, n_heads=4))
    std = big.encoder.embed(torch.arange(500)[None]).std().item()
    assert 0.9 < std < 1.1, f"embedded tokens have std {std:.3f}, expected about 1"


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_matches_a_torch_reference(norm_first: bool) -> None:
    """Embedding * sqrt(D) + sinusoids, then torch's own encoder layers with copied weights."""
    config = EncoderConfig(vocab_size=11, max_len=12, d_model=16, n_heads=2, norm_first=norm_first)
    model = Encoder(config).double().eval()
    layers = []
    for block in model.blocks:
        layer = nn.TransformerEncoderLayer(
            16, 2, 64, dropout=0.0, batch_first=True, norm_first=norm_first
        ).double()
        load_torch_encoder_layer(block, layer)
        layers.append(layer.eval())
    tokens = torch.randint(0, 11, (2, 7))
    pad = padding_mask([7, 4], 7)
    x = F.embedding(tokens, model.embed.embedding.weight) * math.sqrt(16) + _sinusoids(7, 16)
    for layer in layers:
        x = layer(x, src_key_padding_mask=~pad)
    if norm_first:
        x = F.layer_norm(x, (16,), model.final_norm.weight, model.final_norm.bias)
    torch.testing.assert_close(model(tokens, pad)[pad], x[pad])


@pytest.mark.parametrize("norm_first", [False, True])
def test_seq2seq_matches_a_torch_reference(norm_first: bool) -> None:
    model = _seq2seq(norm_first).double()
    dec_layers = []
    for block in model.decoder_blocks:
        layer = nn.TransformerDecoderLayer(
            16, 2, 64, dropout=0.0, batch_first=True, norm_first=norm_first
        ).double()
        load_torch_decoder_layer(block, layer)
        dec_layers.append(layer)
    src = torch.randint(3, 9, (2, 6))
    tgt = torch.randint(3, 8, (2, 5))
    src_pad, tgt_pad = padding_mask([6, 4], 6), padding_mask([5, 3], 5)
    memory = model.encode(src, src_pad)
    torch.testing.assert_close(memory, model.encoder(src, src_pad))
    x = F.embedding(tgt, model.tgt_embed.embedding.weight) * math.sqrt(16) + _sinusoids(5, 16)
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)  # torch: True = may NOT attend
    for layer in dec_layers:
        x = layer(
            x,
            memory,
            tgt_mask=future,
            tgt_key_padding_mask=~tgt_pad,
            memory_key_padding_mask=~src_pad,
        )
    if norm_first:
        x = F.layer_norm(x, (16,), model.decoder_norm.weight, model.decoder_norm.bias)
    ref = model.output(x)
    torch.testing.assert_close(model(src, tgt, src_pad, tgt_pad)[tgt_pad], ref[tgt_pad])


def test_seq2seq_holds_an_encoder_and_takes_student_blocks() -> None:
    model = _seq2seq()
    assert isinstance(model.encoder, Encoder)
    assert not any(name.startswith(("src_", "encoder_")) for name, _ in model.named_children())
    calls: list[tuple] = []

    class Recorder(nn.Module):
        def forward(self, x, memory, self_mask=None, memory_mask=None):
            calls.append((tuple(self_mask.shape), tuple(memory_mask.shape), memory.shape[1]))
            return x

    config = model.config
    student = Seq2SeqTransformer(config, decoder_blocks=[Recorder(), Recorder()])
    src, tgt = torch.randint(3, 9, (2, 6)), torch.randint(3, 8, (2, 5))
    assert student(src, tgt, padding_mask([6, 4], 6)).shape == (2, 5, 8)
    assert calls == [((1, 1, 5, 5), (2, 1, 1, 6), 6)] * 2


@torch.no_grad()
def _torch_gpt_layer(block: nn.Module, bias: bool) -> nn.TransformerEncoderLayer:
    """torch's pre-norm encoder layer (GELU) carrying a GPT block's weights."""
    D = block.attn.d_model
    layer = nn.TransformerEncoderLayer(
        D,
        block.attn.n_heads,
        4 * D,
        dropout=0.0,
        activation="gelu",
        batch_first=True,
        norm_first=True,
        bias=bias,
    ).double()
    attn = block.attn
    layer.self_attn.in_proj_weight.copy_(attn.qkv_proj.weight)  # both (3D, D), rows q, k, v
    layer.self_attn.out_proj.weight.copy_(attn.out_proj.weight)
    pairs = [(layer.linear1, block.mlp.linear1), (layer.linear2, block.mlp.linear2)]
    pairs += [(layer.norm1, block.ln1), (layer.norm2, block.ln2)]
    for theirs, ours in pairs:
        theirs.weight.copy_(ours.weight)
    if bias:
        layer.self_attn.in_proj_bias.copy_(attn.qkv_proj.bias)
        layer.self_attn.out_proj.bias.copy_(attn.out_proj.bias)
        for theirs, ours in pairs:
            theirs.bias.copy_(ours.bias)
    return layer


@pytest.mark.parametrize("bias", [True, False])
def test_gpt_matches_a_torch_reference(bias: bool) -> None:
    """Token + position embeddings, torch's pre-norm layers under a causal mask, final norm,
    tied output: the GPT-2 layout rebuilt from torch's own modules with copied weights."""
    model = _gpt(bias=bias).double()
    assert isinstance(model.positions, LearnedPositionalEncoding)
    layers = [_torch_gpt_layer(block, bias) for block in model.blocks]
    idx = torch.randint(0, 13, (2, 9))
    x = F.embedding(idx, model.tok_emb.weight) + model.positions.embedding.weight[:9]
    future = nn.Transformer.generate_square_subsequent_mask(9, dtype=torch.float64)
    for layer in layers:
        x = layer(x, src_mask=future)
    ln_bias = model.ln_f.bias if bias else None
    ref = F.layer_norm(x, (16,), model.ln_f.weight, ln_bias) @ model.tok_emb.weight.T
    torch.testing.assert_close(model(idx), ref)


def test_gpt_static_cache_path_equals_tracked_path_and_full_forward() -> None:
    model = _gpt().double()
    idx = torch.randint(0, 13, (2, 12))
    full = model(idx)
    cache = model.new_kv_cache(2)
    prompt = model(idx[:, :4], cache)
    steps = [model(idx[:, t : t + 1], cache, offset=torch.tensor([t])) for t in range(4, 12)]
    assert cache.length == 4  # positions on the device: the cache does not count them
    torch.testing.assert_close(torch.cat([prompt, *steps], dim=1), full)
    with pytest.raises(ValueError, match="pass kv_cache too"):
        model(idx, offset=torch.tensor([0]))
    with pytest.raises(ValueError, match=r"batch size 1 != KV cache batch size 2"):
        model(idx[:1, :1], cache)


def test_gpt_state_dict_layout() -> None:
    names = list(_gpt().state_dict())
    assert names[:2] == ["tok_emb.weight", "positions.embedding.weight"]
    assert "blocks.0.attn.qkv_proj.weight" in names and "blocks.1.mlp.linear2.bias" in names
    assert not any("q_proj" in n or "pos_emb" in n for n in names)


@pytest.mark.parametrize("need_weights", [True, False])
def test_gpt_attention_is_multi_head_attention_with_a_fused_projection(need_weights: bool) -> None:
    fused = CausalSelfAttention(12, 3).double().eval()
    plain = MultiHeadAttention(12, 3).double().eval()
    assert isinstance(fused, MultiHeadAttention)
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in plain.parameters())
    with torch.no_grad():  # the stacked rows are the query, key and value projections
        for lin, w, b in zip(
            (plain.q_proj, plain.k_proj, plain.v_proj),
            fused.qkv_proj.weight.split(12),
            fused.qkv_proj.bias.split(12),
            strict=True,
        ):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        plain.out_proj.load_state_dict(fused.out_proj.state_dict())
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    out, w = fused(x, x, x, need_weights=need_weights, is_causal=True)
    ref, ref_w = plain(x, x, x, need_weights=need_weights, is_causal=True)
    torch.testing.assert_close(out, ref)
    if need_weights:
        torch.testing.assert_close(w, ref_w)
    with pytest.raises(ValueError, match="self-attention"):
        fused(x, x.clone(), x)

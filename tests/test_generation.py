"""Tests for transformer_lab.generation: filters, GPT generation with/without cache, decoding."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.generation import (
    DecodeStep,
    apply_temperature,
    beam_search,
    compile_decode_step,
    generate,
    greedy_decode,
    kit_attention_copy,
    top_k_filter,
    top_p_filter,
)
from transformer_lab.models import GPT, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer

INF = math.inf

# ----------------------------------------------------------------------------- filters


def test_apply_temperature() -> None:
    logits = torch.tensor([1.0, 2.0, 4.0])
    torch.testing.assert_close(apply_temperature(logits, 0.5), torch.tensor([2.0, 4.0, 8.0]))
    for t in (0.0, -1.0):
        with pytest.raises(ValueError, match=f"t={t}"):
            apply_temperature(logits, t)


def test_top_k_filter_values_and_ties() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.5], [0.0, 1.0, 1.0, 2.0]])
    out = top_k_filter(logits, 2)
    torch.testing.assert_close(out[0], torch.tensor([-INF, 3.0, 2.0, -INF]))
    # the 2nd largest value (1.0) is tied: both copies are kept
    torch.testing.assert_close(out[1], torch.tensor([-INF, 1.0, 1.0, 2.0]))
    torch.testing.assert_close(top_k_filter(logits, 10), logits)
    with pytest.raises(ValueError, match="k=0"):
        top_k_filter(logits, 0)


def test_top_p_keeps_the_token_that_crosses_p() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[[2, 0, 3, 1]]  # shuffled: ids 0..3 have probs .15, .5, .05, .3
    out = top_p_filter(logits, 0.6)  # .5 < .6, then .3 crosses .6 -> keep both
    assert torch.isfinite(out).tolist() == [False, True, False, True]
    torch.testing.assert_close(out[[1, 3]], logits[[1, 3]])
    out = top_p_filter(logits, 0.8)  # .5 + .3 = .8 reaches p exactly: .15 not kept
    assert torch.isfinite(out).tolist() == [False, True, False, True]
    out = top_p_filter(logits, 0.81)
    assert torch.isfinite(out).tolist() == [True, True, False, True]
    out = top_p_filter(logits, 0.1)  # the top token is always kept
    assert torch.isfinite(out).tolist() == [False, True, False, False]
    torch.testing.assert_close(top_p_filter(logits, 1.0), logits)


def test_top_p_ties_rank_lower_ids_first_and_batches() -> None:
    logits = torch.zeros(2, 4)  # four equally likely tokens
    out = top_p_filter(logits, 0.5)  # .25 before the second: keep ids 0 and 1
    assert torch.isfinite(out).tolist() == [[True, True, False, False]] * 2


@pytest.mark.parametrize("p", [0.0, -0.1, 1.5])
def test_top_p_rejects_bad_p(p: float) -> None:
    with pytest.raises(ValueError, match=f"p={p}"):
        top_p_filter(torch.zeros(3), p)


# ----------------------------------------------------------------------------- GPT generation


def _gpt(n_ctx: int = 12) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=11, n_ctx=n_ctx, d_model=16, n_layers=2, n_heads=2)
    return GPT(config).eval()


@pytest.mark.parametrize("new_tokens", [5, 20])  # 20 runs past n_ctx: the cache falls back
def test_cached_generation_equals_uncached_greedy(new_tokens: int) -> None:
    model = _gpt()
    idx = torch.randint(0, 11, (3, 4))
    cached = generate(model, idx, new_tokens, temperature=0.0, use_cache=True)
    plain = generate(model, idx, new_tokens, temperature=0.0, use_cache=False)
    assert cached.shape == (3, 4 + new_tokens)
    assert torch.equal(cached[:, :4], idx)
    assert torch.equal(cached, plain)
    # greedy by temperature 0 and by top-k=1 agree
    assert torch.equal(generate(model, idx, new_tokens, top_k=1), cached)


@pytest.mark.parametrize(("top_k", "top_p"), [(None, None), (5, None), (None, 0.9)])
def test_cached_generation_equals_uncached_sampling(top_k, top_p) -> None:
    model = _gpt()
    idx = torch.randint(0, 11, (2, 3))
    runs = [
        generate(
            model,
            idx,
            15,
            temperature=1.3,
            top_k=top_k,
            top_p=top_p,
            use_cache=cache,
            generator=torch.Generator().manual_seed(7),
        )
        for cache in (True, False)
    ]
    assert torch.equal(runs[0], runs[1])
    other = generate(model, idx, 15, temperature=1.3, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(other, runs[0])


def test_generation_prompt_longer_than_context_and_errors() -> None:
    model = _gpt(n_ctx=6)
    idx = torch.randint(0, 11, (1, 9))
    out = generate(model, idx, 4, temperature=0.0)
    assert out.shape == (1, 13)
    assert torch.equal(out, generate(model, idx, 4, temperature=0.0, use_cache=False))
    # the first new token only depends on the last n_ctx prompt tokens
    idx2 = idx.clone()
    idx2[0, 0] = (idx2[0, 0] + 1) % 11
    assert torch.equal(generate(model, idx2, 1, temperature=0.0)[0, -1], out[0, 9])
    with pytest.raises(ValueError, match="max_new_tokens=-1"):
        generate(model, idx, -1)
    with pytest.raises(ValueError, match=r"t=-0.5|temperature=-0.5"):
        generate(model, idx, 2, temperature=-0.5)


def test_top_k_one_sampling_is_argmax() -> None:
    logits = torch.randn(5, 11)
    from transformer_lab.generation import sample_next

    got = sample_next(logits, top_k=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(got[:, 0], logits.argmax(-1))


# ----------------------------------------------------------------------------- seq2seq greedy


def test_greedy_decode_matches_step_by_step_argmax_and_stops_at_eos() -> None:
    torch.manual_seed(0)
    config = Seq2SeqConfig(src_vocab_size=7, tgt_vocab_size=6, max_len=10, d_model=16, n_heads=2)
    model = Seq2SeqTransformer(config).eval()
    src = torch.randint(3, 7, (4, 5))
    out = greedy_decode(model, src, bos_id=1, eos_id=2, max_len=8)
    assert out.shape[0] == 4 and out.shape[1] <= 8
    assert (out[:, 0] == 1).all()
    with torch.no_grad():
        for b in range(4):
            ys = [1]
            while len(ys) < 8 and ys[-1] != 2:
                logits = model(src[b : b + 1], torch.tensor([ys]))
                ys.append(int(logits[0, -1].argmax()))
            n = len(ys)
            assert out[b, :n].tolist() == ys
            assert (out[b, n:] == config.pad_id).all()  # after EOS: padding
    with pytest.raises(ValueError, match="max_len=0"):
        greedy_decode(model, src, 1, 2, 0)
    # a max_len beyond the model's position table is capped, not an error mid-decoding
    model.output.bias.data[2] = -1e4  # never EOS: decode to the cap
    assert greedy_decode(model, src, 1, 2, 50).shape == (4, config.max_len)


def test_greedy_decode_respects_source_padding() -> None:
    torch.manual_seed(0)
    config = Seq2SeqConfig(src_vocab_size=7, tgt_vocab_size=6, max_len=10, d_model=16, n_heads=2)
    model = Seq2SeqTransformer(config).eval()
    src = torch.randint(3, 7, (1, 6))
    pad = torch.tensor([[True] * 4 + [False] * 2])
    a = greedy_decode(model, src, 1, 2, 9, src_padding_mask=pad)
    b = greedy_decode(model, src[:, :4], 1, 2, 9)
    assert torch.equal(a, b)


# ----------------------------------------------------------------------------- beam search


def _table_step_fn(V: int, seed: int):
    """A deterministic random next-token distribution for every prefix."""

    def step_fn(prefix: list[int]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((seed, *prefix)) % (2**31))
        return torch.log_softmax(torch.randn(V, generator=g) * 2, dim=-1)

    return step_fn


def _exhaustive_best(step_fn, V: int, bos: int, eos: int, max_len: int) -> tuple[list[int], float]:
    best: tuple[list[int], float] = ([], -INF)

    def visit(seq: list[int], score: float) -> None:
        nonlocal best
        if seq[-1] == eos or len(seq) == max_len:
            if score > best[1]:
                best = (seq, score)
            return
        logp = step_fn(seq)
        for tok in range(V):
            visit([*seq, tok], score + float(logp[tok]))

    visit([bos], 0.0)
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wide_beam_finds_the_exhaustive_optimum(seed: int) -> None:
    V, max_len = 3, 5
    step_fn = _table_step_fn(V, seed)
    best_seq, _ = _exhaustive_best(step_fn, V, bos=0, eos=1, max_len=max_len)
    assert beam_search(step_fn, 0, 1, beam_width=V**max_len, max_len=max_len) == best_seq


def test_beam_width_one_is_greedy_and_wider_beam_can_do_better() -> None:
    # greedy takes "a" (0.6) then a flat continuation; beam finds "b" then a confident EOS
    lp = math.log
    table = {
        (0,): [-INF, -INF, lp(0.6), lp(0.4)],  # tokens: 0 BOS, 1 EOS, 2 "a", 3 "b"
        (0, 2): [-INF, lp(0.5), lp(0.25), lp(0.25)],
        (0, 3): [-INF, lp(0.99), lp(0.005), lp(0.005)],
    }

    def step_fn(prefix: list[int]) -> torch.Tensor:
        return torch.tensor(table.get(tuple(prefix), [-INF, 0.0, -INF, -INF]))

    assert beam_search(step_fn, 0, 1, beam_width=1, max_len=5) == [0, 2, 1]
    assert beam_search(step_fn, 0, 1, beam_width=2, max_len=5) == [0, 3, 1]


def test_beam_search_length_penalty_and_errors() -> None:
    lp = math.log
    # stopping now costs log .4; going on costs log .6 then a near-certain EOS
    table = {(0,): [-INF, lp(0.4), lp(0.6)], (0, 2): [-INF, lp(0.9), lp(0.1)]}

    def step_fn(prefix: list[int]) -> torch.Tensor:
        return torch.tensor(table.get(tuple(prefix), [-INF, 0.0, -INF]))

    # raw sums: [0,1] -> log .4 = -0.92; [0,2,1] -> log .54 = -0.62: longer wins anyway
    assert beam_search(step_fn, 0, 1, 2, 6) == [0, 2, 1]
    # only EOS may follow [0, 2] (log .6): [0,2,1] now log .36 = -1.02 < -0.92
    table[(0, 2)] = [-INF, lp(0.6), -INF]
    assert beam_search(step_fn, 0, 1, 2, 6) == [0, 1]
    # per-token mean: -1.02 / 2 = -0.51 beats -0.92 / 1
    assert beam_search(step_fn, 0, 1, 2, 6, length_penalty=1.0) == [0, 2, 1]
    with pytest.raises(ValueError, match="beam_width=0"):
        beam_search(step_fn, 0, 1, 0, 5)
    assert beam_search(step_fn, 0, 1, 2, 1) == [0]


def test_beam_search_respects_max_len() -> None:
    step_fn = _table_step_fn(4, 3)
    for max_len in (2, 3, 4):
        seq = beam_search(
            lambda p: step_fn(p).index_fill(0, torch.tensor([1]), -INF), 0, 1, 3, max_len
        )
        assert len(seq) == max_len


def test_exhaustive_helper_is_consistent() -> None:
    step_fn = _table_step_fn(2, 0)
    seq, score = _exhaustive_best(step_fn, 2, 0, 1, 3)
    total = sum(float(step_fn(seq[:i])[seq[i]]) for i in range(1, len(seq)))
    assert score == pytest.approx(total)


# ----------------------------------------------------------------------------- static decode step


def test_static_decode_step_equals_the_tracked_cache_eagerly() -> None:
    model = _gpt().double()
    idx = torch.randint(0, 11, (2, 3))
    step = DecodeStep(model, 2)
    cache = model.new_kv_cache(2)
    a, b = step.prefill(idx), model(idx, cache)[:, -1]
    for pos in range(3, 12):  # up to n_ctx
        torch.testing.assert_close(a, b)
        nxt = a.argmax(-1, keepdim=True)
        a = step(nxt, torch.tensor([pos]))
        b = model(nxt, cache)[:, -1]
    assert step.cache.k.shape[3] == 12  # preallocated once, never grown
    # an eager DecodeStep passed to generate takes the static path and gives the same tokens
    plain = generate(model, idx, 15, temperature=0.0, use_cache=False)
    assert torch.equal(generate(model, idx, 15, temperature=0.0, decode_step=step), plain)


def test_a_compiled_step_is_reused_across_generate_calls() -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = _gpt()
    step = compile_decode_step(model, 2, {"backend": "aot_eager"})
    for seed in range(3):
        idx = torch.randint(0, 11, (2, 1 + seed), generator=torch.Generator().manual_seed(seed))
        plain = generate(model, idx, 10, temperature=0.0, use_cache=False)
        assert torch.equal(generate(model, idx, 10, temperature=0.0, decode_step=step), plain)
    assert counters["stats"]["unique_graphs"] == 1
    with pytest.raises(ValueError, match="batch size 3 != KV cache batch size 2"):
        generate(model, torch.zeros(3, 2, dtype=torch.long), 2, decode_step=step)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("new_tokens", [6, 20])  # 20 runs past n_ctx: the fallback follows
def test_compiled_generation_gives_the_uncached_greedy_tokens(
    backend: str, new_tokens: int
) -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = _gpt()
    idx = torch.randint(0, 11, (3, 4))
    plain = generate(model, idx, new_tokens, temperature=0.0, use_cache=False)
    for _ in range(2):  # a second call reuses the graph
        compiled = generate(model, idx, new_tokens, temperature=0.0, compile={"backend": backend})
        assert torch.equal(compiled, plain)
    assert counters["stats"]["unique_graphs"] == 1  # static shapes: one graph, no recompiles


def test_compiled_sampling_equals_eager_sampling() -> None:
    torch._dynamo.reset()
    model = _gpt()
    idx = torch.randint(0, 11, (2, 3))
    runs = [
        generate(
            model,
            idx,
            8,
            temperature=1.3,
            top_k=5,
            compile=options,
            generator=torch.Generator().manual_seed(7),
        )
        for options in (False, {"backend": "aot_eager"})
    ]
    assert torch.equal(runs[0], runs[1])


@pytest.mark.slow
def test_inductor_compiled_generation_gives_the_same_tokens() -> None:
    """A real code-generating compile (inductor), as on a GPU but for the CPU: ~15 s."""
    torch._dynamo.reset()
    model = _gpt()
    idx = torch.randint(0, 11, (2, 4))
    plain = generate(model, idx, 10, temperature=0.0, use_cache=False)
    assert torch.equal(generate(model, idx, 10, temperature=0.0, compile=True), plain)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (CUDA graphs)")
def test_cuda_graph_generation_gives_the_uncached_greedy_tokens() -> None:
    """On CUDA, compile=True means mode="reduce-overhead": the decode step is a CUDA graph."""
    torch._dynamo.reset()
    model = _gpt().cuda()
    idx = torch.randint(0, 11, (3, 4), device="cuda")
    plain = generate(model, idx, 20, temperature=0.0, use_cache=False)  # past n_ctx too
    for _ in range(2):
        assert torch.equal(generate(model, idx, 20, temperature=0.0, compile=True), plain)
    assert torch.equal(generate(model, idx, 20, temperature=0.0), plain)


class _OwnMaskAttention(nn.Module):
    """Lab 08's kind of attention: one fused projection, a mask made from the keys it gets."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, query, key=None, value=None, mask=None, need_weights=False, *,
                is_causal=False, kv_cache=None):  # fmt: skip
        B, T, D = query.shape
        q, k, v = (
            t.view(B, T, self.n_heads, -1).transpose(1, 2)  # (B, H, T, Dh)
            for t in self.qkv_proj(query).chunk(3, dim=-1)
        )
        if kv_cache is not None:
            k, v = kv_cache.store(k, v)  # (B, H, S, Dh)
        S = k.shape[-2]
        own = torch.arange(S)[None, :] <= torch.arange(S - T, S)[:, None]  # (T, S)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=own)  # (B, H, T, Dh)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, D)), None


def test_a_kit_attention_copy_decodes_an_own_mask_gpt_compiled_with_the_same_tokens() -> None:
    """Lab 08 on a GPU compiles the decode step of a copy of the student's trained GPT with the
    kit's attention (the student's own mask would see unwritten slots of the static cache)."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=17, n_ctx=24, d_model=16, n_layers=2, n_heads=2)
    model = GPT(config)
    for block in model.blocks:
        block.attn = _OwnMaskAttention(16, 2)
    model.reset_parameters()
    model = model.double().eval()
    twin = kit_attention_copy(model)
    assert twin.tok_emb.weight.dtype == torch.float64 and not twin.training
    idx = torch.randint(0, 17, (1, 3))
    eager = generate(model, idx, 12, temperature=0)
    step = compile_decode_step(twin, 1, {"backend": "eager"})
    assert torch.equal(generate(twin, idx, 12, temperature=0, decode_step=step), eager)
    with pytest.raises(ValueError, match="do not fit the kit's GPT: missing"):
        model.blocks[0].attn = nn.Identity()
        kit_attention_copy(model)

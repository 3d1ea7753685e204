"""Lab 08 checks against a catalogue of typical mistakes and of correct variants (no nbgrader).

Each wrong implementation must fail the checks that should catch it, with a message naming the
mistake; each correct variant (lab 05's masked attention or the computation written out, the
mask from comparisons or from the last rows of lab 05's causal mask, the offset from the cache's
positions or from the number of stored keys, dropout modules or F.dropout, a fresh cache for
the window once the cache is full, sampling written out with lab 07's filters, closed forms or
parameter lists, integer or float arithmetic) must pass every check, visible and hidden.
Calling the kit's (or PyTorch's) version earns nothing.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import pytest
import torch
import torch.nn.functional as F
from check_support import assert_fails, run_checks
from torch import Tensor, nn

import transformer_lab.generation as kit_generation
import transformer_lab.scale as kit_scale
from transformer_lab.attention import (
    MultiHeadAttention,
    masked_attention,
    merge_heads,
    scaled_dot_product_attention,
    split_heads,
)
from transformer_lab.checks import lab08
from transformer_lab.generation import apply_temperature as kit_apply_temperature
from transformer_lab.generation import sample_next, top_k_filter, top_p_filter
from transformer_lab.grading.hidden import lab08 as hidden08
from transformer_lab.masks import causal_mask
from transformer_lab.models import GPT, GPTConfig

# ======================================================================================
# CausalSelfAttention
# ======================================================================================

ATTENTION_CHECKS = {
    "visible": lab08.check_causal_self_attention,
    "cache": lab08.check_causal_self_attention_cache,
    "hidden": lambda c: hidden08.hidden_check_causal_self_attention(c, seed=8101),
    "hidden_cache": lambda c: hidden08.hidden_check_causal_self_attention_cache(c, seed=8102),
    "training": lambda c: hidden08.hidden_check_causal_self_attention_training(c, seed=8103),
}


class Attention(nn.Module):
    """The notebook's answer, with switches that make each typical mistake.

    ``options``: ``mask`` (``causal``, ``none``, ``after``, ``offset_ignored``,
    ``none_when_cached``), ``order`` (``qkv``/``kqv``), ``scale`` (``head``/``model``),
    ``split`` (``heads``/``no_transpose``/``split_only``: the split only), ``out_proj``,
    ``store`` (``yes``, ``ignore_return``, ``swapped``), ``dropout`` (``weights``, ``output``,
    ``always``, ``scores``, ``unscaled``), ``fill`` (a number or ``"min"``), ``detach``, ``tuple``.
    """

    options: ClassVar[dict[str, Any]] = {}

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.p = dropout
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def opt(self, name: str, default: Any) -> Any:
        return self.options.get(name, default)

    def forward(self, x: Tensor, kv_cache: Any = None) -> Tensor:
        if self.opt("no_grad", False):  # @torch.no_grad() copied from generate
            with torch.no_grad():
                return self.attend(x, kv_cache)
        return self.attend(x, kv_cache)

    def attend(self, x: Tensor, kv_cache: Any = None) -> Tensor:
        B, T, D = x.shape
        H = self.n_heads
        parts = self.qkv_proj(x).chunk(3, dim=-1)
        q, k, v = parts if self.opt("order", "qkv") == "qkv" else (parts[1], parts[0], parts[2])
        if self.opt("detach", False):
            q = q.detach()

        def heads(t: Tensor) -> Tensor:
            if self.opt("split", "heads") in ("no_transpose", "split_only"):
                return t.reshape(B, H, T, D // H)
            return t.view(B, T, H, D // H).transpose(1, 2)

        q, k, v = heads(q), heads(k), heads(v)
        if kv_cache is not None:
            store = self.opt("store", "yes")
            if store == "yes":
                k, v = kv_cache.store(k, v)
            elif store == "swapped":
                v, k = kv_cache.store(v, k)
            elif store == "queries":
                k, v = kv_cache.store(q, v)
            else:  # ignore_return: stores, but attends to the new keys only
                kv_cache.store(k, v)
        S = k.shape[-2]
        P = S - T
        mode = self.opt("mask", "causal")
        if mode == "offset_ignored":
            allowed = torch.ones(T, S, dtype=torch.bool).tril()
        elif mode == "none" or (mode == "none_when_cached" and kv_cache is not None):
            allowed = torch.ones(T, S, dtype=torch.bool)
        else:
            allowed = torch.arange(S)[None, :] <= torch.arange(P, S)[:, None]
        scale = math.sqrt(D // H if self.opt("scale", "head") == "head" else D)
        scores = q @ k.transpose(-2, -1) / scale
        fill = self.opt("fill", "min")
        fill = torch.finfo(scores.dtype).min if fill == "min" else fill
        where = self.opt("dropout", "weights")
        if where == "scores":
            scores = self.drop(scores)
        if mode == "after":
            w = torch.softmax(scores, dim=-1) * allowed
        else:
            w = torch.softmax(scores.masked_fill(~allowed, fill), dim=-1)
        if where == "weights":
            w = self.drop(w)
        elif where == "always":
            w = F.dropout(w, self.p)
        elif where == "unscaled" and self.training and self.p > 0:
            w = w * (torch.rand(w.shape) >= self.p)
        out = (
            merge_heads(w @ v)
            if self.opt("split", "heads") in ("heads", "split_only")
            else (w @ v).reshape(B, T, D)
        )
        if self.opt("out_proj", True):
            out = self.out_proj(out)
        if where == "output":
            out = self.drop(out)
        return (out, w) if self.opt("tuple", False) else out


def attention_variant(name: str, **options: Any) -> type:
    return type(name, (Attention,), {"options": options})


class SolutionAttention(nn.Module):
    """The notebook's answer: lab 05's masked attention, dropout on its weights."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.attn_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, kv_cache: Any = None) -> Tensor:
        T = x.shape[1]
        q, k, v = (split_heads(t, self.n_heads) for t in self.qkv_proj(x).chunk(3, dim=-1))
        if kv_cache is not None:
            k, v = kv_cache.store(k, v)
        S = k.shape[-2]
        mask = torch.arange(S)[None, :] <= torch.arange(S - T, S)[:, None]
        _, weights = masked_attention(q, k, v, mask)
        return self.out_proj(merge_heads(self.attn_dropout(weights) @ v))


class EinsumAttention(nn.Module):
    """Written out with einsum, -inf fill, the offset from the cache's positions, F.dropout."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.h, self.p = n_heads, dropout
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, kv_cache: Any = None) -> Tensor:
        B, T, D = x.shape
        qkv = self.qkv_proj(x).view(B, T, 3, self.h, D // self.h)  # (B, T, 3, H, Dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, T, Dh)
        start = 0
        if kv_cache is not None:
            start = kv_cache.positions.start
            k, v = kv_cache.store(k.contiguous(), v.contiguous())
        S = k.shape[2]
        scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(D // self.h)
        future = torch.arange(S)[None, :] > (start + torch.arange(T))[:, None]
        weights = torch.softmax(scores.float().masked_fill(future, -math.inf), dim=-1)
        weights = F.dropout(weights.to(x.dtype), self.p, self.training)
        out = torch.einsum("bhts,bhsd->bthd", weights, v).reshape(B, T, D)
        return self.out_proj(out)


class Lab05MaskAttention(nn.Module):
    """The last T rows of lab 05's causal mask over every stored key; lab 02's attention with
    its own dropout argument."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_heads, self.p = n_heads, dropout
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, kv_cache: Any = None) -> Tensor:
        T = x.shape[1]
        D = x.shape[-1]
        q, k, v = self.qkv_proj(x).split(D, dim=-1)
        q, k, v = (split_heads(t, self.n_heads) for t in (q, k, v))
        if kv_cache is not None:
            k, v = kv_cache.store(k, v)
        S = k.shape[-2]
        mask = causal_mask(S, device=x.device)[S - T :]  # (T, S)
        out, _ = scaled_dot_product_attention(
            q, k, v, mask, dropout_p=self.p if self.training else 0.0
        )
        return self.out_proj(merge_heads(out))


class SdpaAttention(SolutionAttention):
    def forward(self, x: Tensor, kv_cache: Any = None) -> Tensor:
        q, k, v = (split_heads(t, self.n_heads) for t in self.qkv_proj(x).chunk(3, dim=-1))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(merge_heads(out))


class KitMultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.mha = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = self.mha.out_proj

    def forward(self, x: Tensor, kv_cache: Any = None) -> Tensor:
        return self.mha(x, x, x, mask=causal_mask(x.shape[1]))[0]


class NotYet(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        raise NotImplementedError()


@pytest.mark.parametrize(
    "cls",
    [
        SolutionAttention,
        EinsumAttention,
        Lab05MaskAttention,
        Attention,
        attention_variant("NegInfFill", fill=-math.inf),
    ],
)
def test_correct_attentions_pass_every_check(cls) -> None:
    assert run_checks(ATTENTION_CHECKS, cls) == dict.fromkeys(ATTENTION_CHECKS, "")


ALL = list(ATTENTION_CHECKS)

#: (the mistake's options, the checks that must fail, words); the training check compares with
#: torch only, so its message names no mistake of the forward pass.
ATTENTION_MISTAKES = [
    ({"mask": "none"}, ALL, "ignores the causal mask"),
    ({"mask": "after"}, ALL, "BEFORE the softmax"),
    ({"order": "kqv"}, ALL, "queries and keys are swapped"),
    ({"scale": "model"}, ALL, "sqrt(d_model)"),
    ({"split": "no_transpose"}, ALL, "view(B, H, T, Dh)"),
    ({"split": "split_only"}, ALL, "merging back with a transpose does not undo it"),
    ({"out_proj": False}, ALL, "skips out_proj"),
    ({"mask": "offset_ignored"}, ["cache", "hidden_cache"], "forgets the offset"),
    ({"store": "ignore_return"}, ["cache", "hidden_cache"], "only the new tokens"),
    ({"mask": "none_when_cached"}, ["cache", "hidden_cache"], "piece of several"),
    ({"store": "swapped"}, ["cache", "hidden_cache"], "does not hold the keys"),
    ({"store": "queries"}, ["cache", "hidden_cache"], "does not hold the keys"),
    ({"dropout": "output"}, ["training"], "Dropout belongs on the attention weights"),
    ({"dropout": "always"}, ["training"], "Dropout must be off in eval mode"),
    ({"dropout": "scores"}, ["training"], "Dropout belongs on the attention weights"),
    ({"dropout": "none"}, ["training"], "Dropout belongs on the attention weights"),
    ({"dropout": "unscaled"}, ["training"], "Dropout belongs on the attention weights"),
    ({"fill": -1e9}, ["hidden_cache"], "finfo"),
    ({"detach": True}, ["training"], "the gradient does not"),
    ({"no_grad": True}, ["training"], "does not depend differentiably"),
    ({"tuple": True}, ALL, "should be a torch.Tensor, got tuple"),
]  # fmt: skip


def attention_generic(failing: list[str]) -> tuple[str, ...]:
    """The checks whose message is generic for a mistake that fails ``failing``."""
    return ("training",) if "training" in failing and len(failing) > 1 else ()


@pytest.mark.parametrize(("options", "failing", "words"), ATTENTION_MISTAKES)
def test_attention_mistakes_are_named(options, failing, words) -> None:
    generic = attention_generic(failing)
    assert_fails(
        ATTENTION_CHECKS, attention_variant("Wrong", **options), failing, words, generic=generic
    )


def test_the_cache_check_says_what_the_cache_must_hold() -> None:
    checks = {"cache": lab08.check_causal_self_attention_cache}
    for store in ("queries", "swapped"):
        found = run_checks(checks, attention_variant("Wrong", store=store))["cache"]
        assert "does not hold the keys and values" in found, found
        assert "kv_cache.store(k, v)" in found, found


@pytest.mark.parametrize("cls", [SdpaAttention, KitMultiHeadAttention])
def test_calling_an_attention_kernel_earns_nothing(cls) -> None:
    assert_fails(ATTENTION_CHECKS, cls, list(ATTENTION_CHECKS), "does not allow")


def test_an_unwritten_attention_says_not_implemented() -> None:
    assert_fails(ATTENTION_CHECKS, NotYet, list(ATTENTION_CHECKS), "not implemented yet")


# ======================================================================================
# generate
# ======================================================================================

GENERATE_CHECKS = {
    "visible": lab08.check_generate,
    "sampling": lab08.check_generate_sampling,
    "hidden": lambda f: hidden08.hidden_check_generate(f, seed=8201),
    "edges": lambda f: hidden08.hidden_check_generate_edges(f, seed=8202),
    "strategies": lambda f: hidden08.hidden_check_generate_strategies(f, seed=8203),
}


def apply_temperature(logits: Tensor, t: float) -> Tensor:
    """A student's own temperature, without the t = 0 case (greedy: the argmax)."""
    return logits / t


def own_sample(
    logits: Tensor, temperature: float, generator: Any, *, how: str, top_k: Any, top_p: Any
) -> Tensor:
    """A student's sampling step that forgets that temperature 0 is the argmax: ``"divide"``
    divides by the temperature in place, ``"helper"`` calls its own apply_temperature;
    ``"logits"`` (argmax at 0, right) samples from the scaled logits instead of their softmax."""
    if how == "logits" and temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    z = apply_temperature(logits, temperature) if how == "helper" else logits / temperature
    if how == "logits":  # the scaled logits themselves, not their softmax
        return torch.multinomial(z, num_samples=1, generator=generator)
    if top_k is not None:
        z = top_k_filter(z, top_k)
    if top_p is not None:
        z = top_p_filter(z, top_p)
    probs = torch.softmax(z, dim=-1)  # (B, V)
    return torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)


def make_generate(**options: Any):
    """The notebook's answer, with switches for each typical mistake.

    ``feed`` (``token``, ``whole``), ``cache`` (``once``, ``each_step``, ``never``), ``crop``,
    ``fallback``, ``position`` (``-1``/``0``), ``one_call``, ``only_new``, ``generator``,
    ``greedy``, ``filters``, ``temperature``, ``window`` (``n_ctx`` or ``short``).
    """

    @torch.no_grad()
    def generate(
        model,
        idx,
        max_new_tokens,
        *,
        temperature=1.0,
        top_k=None,
        top_p=None,
        use_cache=True,
        generator=None,
    ):
        n_ctx = model.config.n_ctx
        width = n_ctx - 1 if options.get("window") == "short" else n_ctx
        pick = options.get("position", -1)
        if options.get("cache") == "never":
            use_cache = False
        context = idx[:, -width:] if options.get("crop", True) else idx
        cache = model.new_kv_cache(idx.shape[0]) if use_cache else None
        if options.get("prompt_uncached"):
            logits = model(context)[:, pick]
        else:
            logits = (model(context, cache) if cache is not None else model(context))[:, pick]
        out = idx
        for step in range(max_new_tokens):
            if options.get("sampling"):  # the student's own sampling step
                token = own_sample(
                    logits,
                    temperature,
                    generator,
                    how=options["sampling"],
                    top_k=top_k,
                    top_p=top_p,
                )
            else:
                token = sample_next(
                    logits,
                    temperature=0.0
                    if options.get("greedy")
                    else (temperature if options.get("temperature", True) else 1.0),
                    top_k=top_k if options.get("filters", True) else None,
                    top_p=top_p if options.get("filters", True) else None,
                    generator=generator if options.get("generator", True) else None,
                )
            out = torch.cat([out, token], dim=1)
            if step == max_new_tokens - 1 or options.get("one_call"):
                continue
            if cache is not None and (cache.length < n_ctx or not options.get("fallback", True)):
                if options.get("cache") == "each_step":
                    cache = model.new_kv_cache(idx.shape[0])
                fed = out[:, -width:] if options.get("feed") == "whole" else token
                logits = model(fed, cache)[:, pick]
            else:
                logits = model(out[:, -width:])[:, pick]
        return out[:, idx.shape[1] :] if options.get("only_new") else out

    return generate


def refill_generate(
    model,
    idx,
    max_new_tokens,
    *,
    temperature=1.0,
    top_k=None,
    top_p=None,
    use_cache=True,
    generator=None,
):
    """Once the cache is full, a fresh cache for the window; sampling written out with lab 07's
    filters and an inverse-CDF draw; a wasted model call after the last token."""
    n_ctx = model.config.n_ctx
    seq = idx.clone()

    def draw(logits: Tensor) -> Tensor:
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)
        z = kit_apply_temperature(logits.float(), temperature)
        if top_k is not None:
            z = top_k_filter(z, top_k)
        if top_p is not None:
            z = top_p_filter(z, top_p)
        cdf = torch.softmax(z, dim=-1).cumsum(dim=-1)  # (B, V)
        u = torch.rand(cdf.shape[0], 1, generator=generator)
        return (cdf < u).sum(dim=-1, keepdim=True).clamp(max=cdf.shape[-1] - 1)

    with torch.no_grad():
        cache = model.new_kv_cache(idx.shape[0]) if use_cache else None
        logits = (model(seq[:, -n_ctx:], cache) if use_cache else model(seq[:, -n_ctx:]))[:, -1]
        for _ in range(max_new_tokens):
            seq = torch.cat([seq, draw(logits)], dim=1)
            if not use_cache:
                logits = model(seq[:, -n_ctx:])[:, -1]
            elif cache.length < n_ctx:
                logits = model(seq[:, -1:], kv_cache=cache)[:, -1]
            else:
                cache = model.new_kv_cache(idx.shape[0])
                logits = model(seq[:, -n_ctx:], cache)[:, -1]
    return seq


def kit_generate(model, idx, max_new_tokens, **options):
    return kit_generation.generate(model, idx, max_new_tokens, **options)


def not_yet(*args, **kwargs):
    raise NotImplementedError()


@pytest.mark.parametrize("fn", [make_generate(), refill_generate])
def test_correct_generation_loops_pass_every_check(fn) -> None:
    assert run_checks(GENERATE_CHECKS, fn) == dict.fromkeys(GENERATE_CHECKS, "")


_ALL_BUT_STRATEGIES = ["visible", "sampling", "hidden", "edges"]


#: (the mistake's options, the checks that must fail, words, checks whose message is generic)
GENERATE_MISTAKES = [
    ({"feed": "whole"}, _ALL_BUT_STRATEGIES, "newest token", ()),
    ({"cache": "each_step"}, _ALL_BUT_STRATEGIES, "through a cache holding 0", ()),
    ({"cache": "never"}, _ALL_BUT_STRATEGIES, "model call 1 read", ()),
    ({"one_call": True}, ["visible", "hidden", "edges"], "runs the model once", ("hidden",)),
    ({"position": 0}, _ALL_BUT_STRATEGIES, "FIRST position", ("sampling", "hidden")),
    ({"crop": False}, ["visible", "edges"], "Crop the prompt", ()),
    ({"fallback": False}, _ALL_BUT_STRATEGIES, "once it holds n_ctx", ()),
    ({"only_new": True}, list(GENERATE_CHECKS), "has shape", ()),
    ({"generator": False}, ["sampling", "hidden"], "same seed", ("hidden",)),
    ({"greedy": True}, ["sampling", "strategies"], "seeds 0 and 1", ("strategies",)),
    ({"filters": False}, ["strategies"], "top_k and top_p to the sampling", ()),
    ({"temperature": False}, ["visible", "hidden", "edges", "strategies"], "temperature", ()),
    ({"window": "short"}, _ALL_BUT_STRATEGIES, "without a cache, with", ()),
    ({"prompt_uncached": True}, _ALL_BUT_STRATEGIES, "model call 1 read", ()),
    ({"sampling": "divide"}, ["visible", "hidden", "edges"], "Temperature 0 means greedy", ()),
    ({"sampling": "helper"}, ["visible", "hidden", "edges"], "Temperature 0 means greedy", ()),
    ({"sampling": "logits"}, ["sampling", "hidden", "strategies"], "takes probabilities", ()),
]  # fmt: skip


@pytest.mark.parametrize(("options", "failing", "words", "generic"), GENERATE_MISTAKES)
def test_generation_mistakes_are_named(options, failing, words, generic) -> None:
    assert_fails(GENERATE_CHECKS, make_generate(**options), failing, words, generic=generic)


@pytest.mark.parametrize("fn", [kit_generate])
def test_calling_the_kits_generate_earns_nothing(fn) -> None:
    assert_fails(GENERATE_CHECKS, fn, list(GENERATE_CHECKS), "does not allow")


def test_an_unwritten_generate_says_not_implemented() -> None:
    assert_fails(GENERATE_CHECKS, not_yet, list(GENERATE_CHECKS), "not implemented yet")


def test_the_scripted_model_behaves_like_the_kits_gpt() -> None:
    model = lab08.ScriptedLM(n_ctx=6)
    cache = model.new_kv_cache(2)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert torch.equal(model(ids, cache), model(ids))
    step = torch.tensor([[7], [8]])
    assert torch.equal(model(step, cache)[:, -1], model(torch.cat([ids, step], 1))[:, -1])
    with pytest.raises(ValueError, match="exceed n_ctx=6"):
        model(torch.zeros(2, 3, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="exceeds n_ctx=6"):
        model(torch.zeros(1, 7, dtype=torch.long))
    gpt = GPT(GPTConfig(vocab_size=5, n_ctx=6, d_model=8, n_layers=1, n_heads=2))
    kit_cache = gpt.new_kv_cache(1)
    gpt(torch.zeros(1, 6, dtype=torch.long), kit_cache)
    with pytest.raises(ValueError, match="exceed n_ctx=6"):
        gpt(torch.zeros(1, 1, dtype=torch.long), kit_cache)


# ======================================================================================
# The arithmetic of scale
# ======================================================================================

COUNT_CHECKS = {
    "visible": lab08.check_gpt_param_count,
    "hidden": lambda f: hidden08.hidden_check_gpt_param_count(f, seed=8301),
}
FLOPS_CHECKS = {
    "visible": lab08.check_training_flops,
    "hidden": lambda f: hidden08.hidden_check_training_flops(f, seed=8401),
}
KV_CHECKS = {
    "visible": lab08.check_kv_cache_bytes,
    "hidden": lambda f: hidden08.hidden_check_kv_cache_bytes(f, seed=8501),
}
DAYS_CHECKS = {
    "visible": lab08.check_gpu_days,
    "hidden": lambda f: hidden08.hidden_check_gpu_days(f, seed=8601),
}


def count_closed_form(n_layers, d_model, vocab_size, n_ctx, bias=True):
    D = d_model
    norm = D * (2 if bias else 1)
    block = 2 * norm + 12 * D * D + (9 * D if bias else 0)
    return vocab_size * D + n_ctx * D + n_layers * block + norm


def count_with_modules(n_layers, d_model, vocab_size, n_ctx, bias=True):
    """Build the layers on the meta device (no memory) and let PyTorch count."""
    D = d_model
    with torch.device("meta"):
        block = nn.ModuleList(
            [
                nn.LayerNorm(D, bias=bias),
                nn.Linear(D, 3 * D, bias=bias),
                nn.Linear(D, D, bias=bias),
                nn.LayerNorm(D, bias=bias),
                nn.Linear(D, 4 * D, bias=bias),
                nn.Linear(4 * D, D, bias=bias),
            ]
        )
        rest = nn.ModuleList(
            [nn.Embedding(vocab_size, D), nn.Embedding(n_ctx, D), nn.LayerNorm(D, bias=bias)]
        )
    per_block = sum(p.numel() for p in block.parameters())
    return n_layers * per_block + sum(p.numel() for p in rest.parameters())


def count_mistake(kind: str):
    def count(n_layers, d_model, vocab_size, n_ctx, bias=True):
        L, D, V = n_layers, d_model, vocab_size
        right = count_closed_form(L, D, V, n_ctx, bias)
        return {
            "untied": right + V * D,
            "positions_as_vocab": right - n_ctx * D + V * D,
            "no_positions": right - n_ctx * D,
            "no_final_norm": right - (2 if bias else 1) * D,
            "norm_without_bias": right - (2 * L + 1) * D if bias else right,
            "bias_keeps_norms": right if bias else right + (2 * L + 1) * D,
            "bias_ignored": count_closed_form(L, D, V, n_ctx, True),
            "mask_buffer": right + L * n_ctx * n_ctx,
            "rule_of_thumb": 12 * L * D * D + V * D + n_ctx * D,
            "narrow_mlp": right - L * (6 * D * D + (3 * D if bias else 0)),
            "one_norm": right - L * (2 if bias else 1) * D,
            "qkv_bias_d": right - L * 2 * D if bias else right,
            "float": float(right),
        }[kind]

    return count


def count_with_kit_gpt(n_layers, d_model, vocab_size, n_ctx, bias=True):
    config = GPTConfig(vocab_size, n_ctx, d_model, n_layers, n_heads=1, bias=bias)
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(config).parameters())


@pytest.mark.parametrize("fn", [count_closed_form, count_with_modules])
def test_correct_counts_pass_every_check(fn) -> None:
    assert run_checks(COUNT_CHECKS, fn) == dict.fromkeys(COUNT_CHECKS, "")


BOTH = ["visible", "hidden"]
#: (the mistake of ``count_mistake``, the checks that must fail, words)
COUNT_MISTAKES = [
    ("untied", BOTH, "ties it to the token embedding"),
    ("positions_as_vocab", BOTH, "one row per position"),
    ("no_positions", BOTH, "position embeddings"),
    ("no_final_norm", BOTH, "final layer norm"),
    ("norm_without_bias", BOTH, "only their gains"),
    ("bias_keeps_norms", BOTH, "AND of the layer norms"),
    ("bias_ignored", BOTH, "still has every bias"),
    ("mask_buffer", BOTH, "causal mask"),
    ("rule_of_thumb", BOTH, "12 L D^2"),
    ("narrow_mlp", BOTH, "4 D wide"),
    ("one_norm", BOTH, "two"),
    ("qkv_bias_d", BOTH, "bias holds 3D"),
    ("float", BOTH, "return an int"),
]


@pytest.mark.parametrize(("kind", "failing", "words"), COUNT_MISTAKES)
def test_count_mistakes_are_named(kind, failing, words) -> None:
    assert_fails(COUNT_CHECKS, count_mistake(kind), failing, words)


def test_counting_the_kits_gpt_earns_nothing() -> None:
    assert_fails(COUNT_CHECKS, count_with_kit_gpt, ["visible", "hidden"], "does not allow")
    assert_fails(COUNT_CHECKS, kit_scale.gpt_param_count, ["visible", "hidden"], "does not allow")


@pytest.mark.parametrize(
    "fn",
    [
        lambda n, d: 6.0 * n * d,
        lambda n, d: 6 * n * d,
        lambda n, d: 2 * n * d + 4 * n * d,
    ],
)
def test_correct_flops_pass(fn) -> None:
    assert run_checks(FLOPS_CHECKS, fn) == dict.fromkeys(FLOPS_CHECKS, "")


def named(name: str, fn: Any) -> Any:
    """``fn`` under ``name`` (a catalogue entry's id)."""
    fn.__name__ = fn.__qualname__ = name
    return fn


#: (a wrong training_flops, words its messages must hold); both checks fail
FLOPS_MISTAKES = [
    (named("forward_only", lambda n, d: 2 * n * d), "forward pass only"),
    (named("backward_only", lambda n, d: 4 * n * d), "backward pass only"),
    (named("one_per_parameter", lambda n, d: n * d), "one operation per parameter"),
    (named("multiply_adds", lambda n, d: 3 * n * d), "multiply-adds"),
    (named("twice_over", lambda n, d: 12 * n * d), "twice over"),
    (named("added", lambda n, d: 6 * (n + d)), "added N and D"),
]


@pytest.mark.parametrize(("fn", "words"), FLOPS_MISTAKES)
def test_flops_mistakes_are_named(fn, words) -> None:
    assert_fails(FLOPS_CHECKS, fn, ["visible", "hidden"], words)


def kv_right(n_layers, d_model, n_ctx, batch_size=1, bytes_per_value=2):
    return 2 * n_layers * d_model * n_ctx * batch_size * bytes_per_value


def kv_per_head(n_layers, d_model, n_ctx, batch_size=1, bytes_per_value=2):
    per_token = 2 * n_layers * d_model  # keys and values of every layer
    return per_token * n_ctx * batch_size * bytes_per_value


@pytest.mark.parametrize("fn", [kv_right, kv_per_head])
def test_correct_cache_sizes_pass(fn) -> None:
    assert run_checks(KV_CHECKS, fn) == dict.fromkeys(KV_CHECKS, "")


def kv_mistake(name: str, formula: Any) -> Any:
    """A kv_cache_bytes, named ``name``, that computes ``formula(L, D, T, B, b)``."""

    def kv_cache_bytes(n_layers, d_model, n_ctx, batch_size=1, bytes_per_value=2):
        return formula(n_layers, d_model, n_ctx, batch_size, bytes_per_value)

    return named(name, kv_cache_bytes)


#: (a wrong kv_cache_bytes, the checks that must fail, words)
KV_MISTAKES = [
    (kv_mistake("keys_only", lambda L, D, T, B, b: L * D * T * B * b), BOTH, "keys only"),
    (kv_mistake("queries_too", lambda L, D, T, B, b: 3 * L * D * T * B * b), BOTH, "queries too"),
    (kv_mistake("values_not_bytes", lambda L, D, T, B, b: 2 * L * D * T * B), BOTH, "not bytes"),
    (kv_mistake("bits", lambda L, D, T, B, b: 16 * L * D * T * B * b), BOTH, "bits"),
    (kv_mistake("four_bytes", lambda L, D, T, B, b: 2 * L * D * T * B * 4), BOTH, "4 bytes"),
    (kv_mistake("two_bytes", lambda L, D, T, B, b: 2 * L * D * T * B * 2), BOTH, "2 bytes"),
    (kv_mistake("no_batch", lambda L, D, T, B, b: 2 * L * D * T * b), BOTH, "the batch"),
    (kv_mistake("one_layer", lambda L, D, T, B, b: 2 * D * T * B * b), BOTH, "the layers"),
    (kv_mistake("scores", lambda L, D, T, B, b: 2 * L * T * T * B * b), BOTH, "T x T"),
    (kv_mistake("float", lambda L, D, T, B, b: 2.0 * L * D * T * B * b), BOTH, "return an int"),
]  # fmt: skip


@pytest.mark.parametrize(("fn", "failing", "words"), KV_MISTAKES)
def test_cache_size_mistakes_are_named(fn, failing, words) -> None:
    assert_fails(KV_CHECKS, fn, failing, words)


@pytest.mark.parametrize(
    "fn",
    [
        lambda f, p, u: f / (p * u) / 86400,
        lambda f, p, u: f / p / u / 3600 / 24,
    ],
)
def test_correct_gpu_days_pass(fn) -> None:
    assert run_checks(DAYS_CHECKS, fn) == dict.fromkeys(DAYS_CHECKS, "")


#: (a wrong gpu_days, words its messages must hold); both checks fail
DAYS_MISTAKES = [
    (named("no_utilization", lambda f, p, u: f / p / 86400), "ignore the utilization"),
    (named("times_utilization", lambda f, p, u: f * u / p / 86400), "multiply by the utilization"),
    (named("hours", lambda f, p, u: f / (p * u) / 3600), "hours"),
    (named("seconds", lambda f, p, u: f / (p * u)), "seconds"),
    (named("minutes", lambda f, p, u: f / (p * u) / 60), "minutes"),
    (named("years", lambda f, p, u: f / (p * u) / 86400 / 365), "years"),
]  # fmt: skip


@pytest.mark.parametrize(("fn", "words"), DAYS_MISTAKES)
def test_gpu_days_mistakes_are_named(fn, words) -> None:
    assert_fails(DAYS_CHECKS, fn, BOTH, words)


def test_calling_the_kits_scale_functions_earns_nothing() -> None:
    for checks, fn in (
        (FLOPS_CHECKS, kit_scale.training_flops),
        (KV_CHECKS, kit_scale.kv_cache_bytes),
        (DAYS_CHECKS, kit_scale.gpu_days),
    ):
        assert_fails(checks, fn, ["visible", "hidden"], "does not allow")
    assert kit_scale.training_flops(1, 2) == 12.0  # ... and the kit works again afterwards


@pytest.mark.parametrize("checks", [COUNT_CHECKS, FLOPS_CHECKS, KV_CHECKS, DAYS_CHECKS])
def test_unwritten_scale_functions_say_not_implemented(checks) -> None:
    assert_fails(checks, not_yet, list(checks), "not implemented yet")


def test_the_kits_answers_are_marked_as_lab_08s() -> None:
    from transformer_lab.graded import GRADED

    for name in (
        "transformer_lab.scale.gpt_param_count",
        "transformer_lab.scale.training_flops",
        "transformer_lab.scale.kv_cache_bytes",
        "transformer_lab.scale.gpu_days",
        "transformer_lab.generation.generate",
    ):
        assert GRADED[name] == "08_language_models", name

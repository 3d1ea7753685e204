"""Visible checks of lab 08 (language models), against ``fixtures/lab08.json`` (no oracle here).

Reference: Prince, *Understanding Deep Learning*, section 12.7; Radford et al. (GPT-2), 2019;
Brown et al. (GPT-3), 2020, table 2.1; Kaplan et al. (scaling laws), 2020; Pope et al.,
"Efficiently Scaling Transformer Inference", 2022 (the KV cache).
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor, nn

from transformer_lab.attention import KVCache
from transformer_lab.checks import spec as lab_specs
from transformer_lab.checks._attention import HALF_FILL
from transformer_lab.checks._common import (
    Case,
    call_forbidding,
    close,
    compare,
    expect_module,
    expect_shape,
    expect_true,
    load_weights,
    note_mistake,
    stored,
    stored_data,
)
from transformer_lab.checks._generated import Given, Ordinary, token_ids

#: The lab's spec (``specs/lab08.toml``): its bans and shared tolerances.
SPEC = lab_specs.load("08_language_models")
ATTENTION_BAN = SPEC.ban("attention")
GENERATE_BAN = SPEC.ban("generate")
SCALE_BAN = SPEC.ban("scale")

# A correct float32 attention differs from float64 or torch by ~1e-6.
_TOL = SPEC.tol("float32")


def build_attention(
    cls: Callable[..., nn.Module],
    d_model: int,
    n_heads: int,
    weights: Mapping[str, Tensor],
    dropout: float = 0.0,
) -> tuple[nn.Module, str]:
    """The student's ``CausalSelfAttention(d_model, n_heads[, dropout])`` built under the ban,
    with ``weights`` (``qkv_proj.weight (3D, D)``, ...) loaded: ``(module, its name)``."""
    args: tuple[Any, ...] = (d_model, n_heads, dropout) if dropout else (d_model, n_heads)
    what = f"CausalSelfAttention({', '.join(map(str, args))})"
    module = expect_module(call_forbidding(cls, args, {}, ban=ATTENTION_BAN, what=what), what)
    load_weights(module, weights, what, SPEC.parts["CausalSelfAttention"].layout)
    return module, what


def run_attention(module: nn.Module, x: Tensor, what: str, kv_cache: Any = None) -> Tensor:
    """``module(x)`` or ``module(x, kv_cache)`` under the ban; an output ``(B, T, D)``."""
    args = (x,) if kv_cache is None else (x, kv_cache)
    try:
        out = call_forbidding(module, args, {}, ban=ATTENTION_BAN, what=what)
    except AssertionError as exc:
        if "overflow" in str(exc) or "cannot be converted" in str(exc):
            raise AssertionError(f"{exc} {HALF_FILL}") from None
        raise
    out = expect_shape(out, tuple(x.shape), what)
    expect_true(
        out.dtype == x.dtype,
        f"{what} turned {x.dtype} inputs into {out.dtype}: build every tensor inside forward "
        "with the input's dtype and device (the mask's fill value: torch.finfo(dtype).min).",
    )
    return out


#: Chunk schedules of the cached worked example: the positions each call feeds.
SCHEDULES: dict[str, tuple[tuple[int, int], ...]] = {
    "chunks": ((0, 2), (2, 4), (4, 5)),
    "tokens": ((0, 1), (1, 2), (2, 3), (3, 4), (4, 5)),
}


def show_schedule(schedule: Sequence[tuple[int, int]]) -> str:
    """How messages name a chunk schedule: ``x[:, 0:2], then x[:, 2:4], then ...``."""
    return ", then ".join(f"x[:, {a}:{b}]" for a, b in schedule)


def cached_run(
    module: nn.Module,
    x: Tensor,
    schedule: Sequence[tuple[int, int]],
    n_heads: int,
    what: str,
    capacity: int | None = None,
) -> tuple[Tensor, KVCache]:
    """Feed ``x`` to the module chunk by chunk through one kit ``KVCache``: ``(the outputs
    joined (B, T, D), the cache)``."""
    B, T, D = x.shape
    cache = KVCache(1, B, n_heads, capacity or T, D // n_heads, dtype=x.dtype)
    outs = []
    for start, end in schedule:
        name = f"{what} on x[:, {start}:{end}] with a cache holding {start} position(s)"
        outs.append(run_attention(module, x[:, start:end], name, cache.layer(0, slice(start, end))))
    return torch.cat(outs, dim=1), cache


#: What a right attention computes (the rule a wrong output is shown with).
ATTENTION_RULE = (
    "out = out_proj(merge(softmax(q k^T / sqrt(Dh), causal) v)), with q, k, v the three "
    "d_model-wide parts of qkv_proj(x) (in that order), each split into heads (B, H, T, Dh)."
)
#: What a right attention does through a KV cache.
CACHE_RULE = (
    "Fed in pieces through a cache, attention must give the outputs of one pass: the "
    "queries of a piece starting at position P are positions P, P+1, ...; query P+i "
    "attends every stored key s <= P + i."
)


def judge_attention(
    got: Tensor, want: Tensor, what: str, rule: str, mistakes: Mapping[str, Tensor] | None = None
) -> None:
    """``got`` against ``want`` at the spec's tolerance, naming the mistake (hint -> its
    output) that ``got`` matches, else saying ``rule``."""
    candidates = [(out, hint) for hint, out in (mistakes or {}).items()]
    compare(got, want, what=what, candidates=candidates, hint=rule, atol=_TOL, rtol=_TOL)


def judge_cached(
    module: nn.Module,
    x: Tensor,
    heads: int,
    schedule: Sequence[tuple[int, int]],
    what: str,
    want: tuple[Tensor, Tensor, Tensor, Mapping[str, Tensor]],
    capacity: int | None = None,
) -> None:
    """:func:`cached_run` judged: the joined outputs and the cache's contents against ``want``
    (``(the one-pass output, keys, values (B, H, T, Dh), hint -> a mistake's output)``)."""
    out, keys, values, mistakes = want
    got, cache = cached_run(module, x, schedule, heads, what, capacity)
    fed = f"{what} fed {show_schedule(schedule)} through a KV cache of capacity {cache.capacity}"
    T = keys.shape[2]
    k = cache.k[0, :, :, :T].detach().to("cpu", torch.float64)  # (B, H, T, Dh)
    v = cache.v[0, :, :, :T].detach().to("cpu", torch.float64)
    expect_true(
        close(k, keys, atol=_TOL, rtol=_TOL) and close(v, values, atol=_TOL, rtol=_TOL),
        f"the KV cache filled by {fed} does not hold the keys and values of every position, "
        "split into heads (B, H, T, Dh): kv_cache.store(k, v) with the new tokens' k and v.",
    )
    judge_attention(got, out, f"{fed} (joined outputs)", CACHE_RULE, mistakes)


def _one_pass(cls: Callable[..., nn.Module]) -> tuple[nn.Module, str, Tensor, Tensor]:
    """The worked example in one pass, in eval mode, judged: ``(module, its name, x, output)``."""
    x, weights = stored_data("lab08", "CausalSelfAttention example: x, weights")[0]
    x, weights = torch.tensor(x), {k: torch.tensor(v) for k, v in weights.items()}
    module, what = build_attention(cls, 8, 2, weights)
    want, mistakes = stored("lab08", "CausalSelfAttention example: out")
    got = run_attention(module.eval(), x, f"{what} on the worked example")
    judge_attention(
        got, want, f"{what} on the worked example in one pass", ATTENTION_RULE, mistakes
    )
    return module, what, x, want


def check_causal_self_attention(cls: Callable[..., nn.Module]) -> None:
    """The worked example (the later keys score highest) in one pass, in eval mode."""
    _one_pass(cls)


def check_causal_self_attention_cache(cls: Callable[..., nn.Module]) -> None:
    """The worked example in one pass first, then fed in chunks and token by token through a
    KV cache: the same output as in one pass, and the cache holds the keys and values."""
    module, what, x, want = _one_pass(cls)
    stored_kv = stored_data("lab08", "CausalSelfAttention example: keys, values")[0]
    keys, values = (torch.tensor(t, dtype=torch.float64) for t in stored_kv)  # (B, H, T, Dh)
    for name, schedule in SCHEDULES.items():
        _, mistakes = stored("lab08", f"CausalSelfAttention example, cached {name}: out")
        judge_cached(module, x, 2, schedule, what, (want, keys, values, mistakes))


class ScriptedLM(nn.Module):
    """A fake causal language model with the kit GPT's interface (and its ``ValueError`` past
    ``n_ctx``): at position ``p``, with ``s`` the sum of the ids read at ``0 .. p``, the next token
    ``(7 s + 3 p + 1) mod V`` scores highest, so a token fed twice, skipped or misplaced shows."""

    def __init__(self, vocab_size: int = 11, n_ctx: int = 12, *, sharpness: float = 4.0) -> None:
        super().__init__()
        self.config = SimpleNamespace(vocab_size=vocab_size, n_ctx=n_ctx)
        self.sharpness = sharpness
        self.anchor = nn.Parameter(torch.zeros(()))  # so that .parameters() and .device work

    def new_kv_cache(self, batch_size: int) -> SimpleNamespace:
        """An empty cache: the ids read, ``tokens (B, n_ctx)``, and ``KVCache``'s attributes."""
        n_ctx = self.config.n_ctx
        tokens = torch.zeros(batch_size, n_ctx, dtype=torch.long)
        return SimpleNamespace(tokens=tokens, length=0, capacity=n_ctx, batch_size=batch_size)

    def logits_for(self, tokens: Tensor) -> Tensor:
        """Logits ``(B, T, V)`` of a window read from position 0 (float32)."""
        T, V = tokens.shape[1], self.config.vocab_size
        sums = tokens.cumsum(dim=1)  # (B, T)
        target = (7 * sums + 3 * torch.arange(T)[None, :] + 1) % V  # (B, T)
        gap = (torch.arange(V)[None, None, :] - target[..., None]) % V  # (B, T, V)
        angle = 2.0 * math.pi * gap.float() / V
        return self.sharpness * torch.cos(angle) + 0.2 * gap.float() / V

    def forward(self, idx: Tensor, kv_cache: Any = None) -> Tensor:
        B, T = idx.shape
        n_ctx = self.config.n_ctx
        if kv_cache is None:
            if n_ctx < T:
                raise ValueError(f"sequence length T={T} exceeds n_ctx={n_ctx}")
            return self.logits_for(idx.cpu()) + 0.0 * self.anchor
        if kv_cache.batch_size != B:
            raise ValueError(f"batch size {B} != KV cache batch size {kv_cache.batch_size}")
        start, end = kv_cache.length, kv_cache.length + T
        if end > n_ctx:
            raise ValueError(f"{start} cached + T={T} new positions exceed n_ctx={n_ctx}")
        kv_cache.tokens[:, start:end] = idx.cpu()
        kv_cache.length = end
        return self.logits_for(kv_cache.tokens[:, :end])[:, start:end] + 0.0 * self.anchor


#: How a generation loop feeds the model (said when it fed it otherwise, or the model raised).
FEED_RULE = (
    "Crop the prompt to its last n_ctx tokens and run it once (with the cache: "
    "model(context, cache)); then, while the cache has room, feed only the newest token "
    "(model(next_token, cache)); once it holds n_ctx positions, and always without the cache, "
    "run the model on the last n_ctx tokens."
)


def run_generate(
    fn: Callable[..., Tensor],
    model: nn.Module,
    prompt: Tensor,
    max_new_tokens: int,
    what: str,
    **options: Any,
) -> Tensor:
    """The student's ``generate(model, prompt, max_new_tokens, **options)`` under the ban,
    checked to be integer ``(B, T + max_new_tokens)`` starting with the prompt."""
    args = (model, prompt, max_new_tokens)
    in_place = "changed the prompt in place: build the output with torch.cat."
    try:
        got = call_forbidding(fn, args, options, ban=GENERATE_BAN, what=what, in_place=in_place)
    except AssertionError as exc:
        message = str(exc)
        if "probability tensor contains either `inf`, `nan` or element < 0" in message:
            sampled = "logits" if options.get("temperature", 1.0) > 0 else "divide"  # at t = 0
            hint = SPEC.mistake(f"generate sampling={sampled}").hint
            note_mistake(hint)
            raise AssertionError(f"{message} {hint}") from None
        if f"{what} raised " in message:
            raise AssertionError(f"{message} {FEED_RULE}") from None
        raise
    B, T = prompt.shape
    got = token_ids(got, (B, T + max_new_tokens), what, "Return them as sample_next gives them.")
    expect_true(
        torch.equal(got[:, :T].cpu(), prompt.cpu()),
        f"{what} does not start with the prompt: return torch.cat([idx, new tokens], dim=1).",
    )
    return got


def judge_calls(
    calls: Sequence[tuple[int, Any, int]],
    prompt_len: int,
    n_ctx: int,
    use_cache: bool,
    what: str,
) -> None:
    """How a loop fed the model (``calls``: ``(T, the cache or None, positions it held)``), as
    :data:`FEED_RULE` says."""
    current, held = None, 0  # the cache in use and the positions it holds
    for i, (fed, cache, before) in enumerate(calls):
        window = min(prompt_len + i, n_ctx)
        if cache is not None and cache is current:
            right = fed == 1
        elif use_cache:
            full = current is not None and held >= n_ctx
            right = fed == window and (full or (current is None and cache is not None))
        else:
            right = fed == window and cache is None
        if cache is not None:
            current, held = cache, before + fed
        how = f"through a cache holding {before}" if cache is not None else "without a cache"
        expect_true(
            right,
            f"{what}: model call {i + 1} read {fed} token(s) {how}, with {prompt_len + i} in the "
            f"sequence and n_ctx={n_ctx}. {FEED_RULE}",
        )


def kit_gpt(seed: int, n_ctx: int) -> nn.Module:
    """A small GPT of the kit (13 tokens), random weights of std 0.3 (sharp logits), eval mode."""
    from transformer_lab import models

    with torch.random.fork_rng(devices=[]):
        torch.random.manual_seed(seed)
        model = models.GPT(
            models.GPTConfig(vocab_size=13, n_ctx=n_ctx, d_model=16, n_layers=2, n_heads=2)
        )
        with torch.no_grad():  # larger weights: sharp logits, tokens that change
            for parameter in model.parameters():
                if parameter.ndim == 2:
                    parameter.normal_(0.0, 0.3)
    return model.eval()


def recording(model: nn.Module) -> list[tuple[int, Any, int]]:
    """Every call of ``model`` from now on: ``(T, the cache or None, positions it held)``."""
    calls: list[tuple[int, Any, int]] = []

    def record(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        cache = args[1] if len(args) > 1 else kwargs.get("kv_cache")
        calls.append((int(args[0].shape[1]), cache, 0 if cache is None else int(cache.length)))

    model.register_forward_pre_hook(record, with_kwargs=True)
    return calls


def show_greedy(
    prompt: Sequence[Sequence[int]], n_ctx: int, new: int, use_cache: bool, gpt: int | None = None
) -> str:
    """How messages name a greedy run of ``generate`` on a :class:`ScriptedLM` (or a kit GPT)."""
    model = "a scripted model" if gpt is None else f"a GPT (seed {gpt})"
    shape = (len(prompt), len(prompt[0]))
    return (
        f"generate(model, idx {shape}, {new}, temperature=0, use_cache={use_cache}) on "
        f"{model} with n_ctx={n_ctx}"
    )


def greedy(fn: Callable[..., Tensor], *case: Any) -> list[list[int]]:
    """The student's greedy tokens on :func:`show_greedy`'s model, its calls judged (run twice:
    greedy decoding gives the same tokens)."""
    prompt, n_ctx, new, use_cache, *gpt = case
    what = show_greedy(*case)
    runs = []
    for _ in range(2):
        model = kit_gpt(gpt[0], n_ctx) if gpt else ScriptedLM(n_ctx=n_ctx)
        calls = recording(model)
        got = run_generate(
            fn, model, torch.tensor(prompt), new, what, temperature=0.0, use_cache=use_cache
        )
        if new:
            judge_calls(calls, len(prompt[0]), n_ctx, use_cache, what)
        runs.append(got.cpu().long().tolist())
    expect_true(
        runs[0] == runs[1],
        f"{what} gave other tokens when run again: temperature=0 means greedy decoding, the "
        "argmax of the logits at every step: pass the temperature on.",
    )
    return runs[0]


#: What a step of a generation loop does (the rule a wrong output is shown with).
STEP_RULE = (
    "Each step takes the logits of the LAST position, logits[:, -1], samples the next token "
    "from them (temperature 0: the argmax) and appends it."
)


#: Greedy generation; a case ``(prompt, n_ctx, max_new_tokens, use_cache[, GPT seed])``.
GREEDY = Ordinary(
    "lab08",
    call=greedy,
    what=show_greedy,
    rule=STEP_RULE,
)

check_generate = GREEDY.visible(
    "check_generate",
    "Greedy generation on the scripted model, with the cache and without: tokens and calls.",
)


def sample(
    fn: Callable[..., Tensor],
    model: nn.Module,
    prompt: Tensor,
    new: int,
    seed: int,
    use_cache: bool,
    **options: Any,
) -> tuple[Tensor, str]:
    """The student's tokens at temperature 1, seeded with ``seed``, its calls judged; the call."""
    shown = "".join(f"{key}={value}, " for key, value in options.items())
    what = (
        f"generate(model, idx {tuple(prompt.shape)}, {new}, temperature=1.0, {shown}"
        f"use_cache={use_cache}, generator=torch.Generator().manual_seed({seed}))"
    )
    draws, calls = torch.Generator().manual_seed(seed), recording(model)
    options |= {"temperature": 1.0, "use_cache": use_cache, "generator": draws}
    got = run_generate(fn, model, prompt, new, what, **options)
    judge_calls(calls, prompt.shape[1], model.config.n_ctx, use_cache, what)
    return got.cpu(), what


def expect_same_both_ways(with_cache: Tensor, without: Tensor, what: str) -> None:
    """Seeded sampling gives the same tokens with the cache and without."""
    expect_true(
        torch.equal(with_cache, without),
        f"{what} and the same call with use_cache=False gave different tokens "
        f"({with_cache.tolist()} and {without.tolist()}): both paths must sample from the same "
        "logits in the same order, one draw per step.",
    )


def check_generate_sampling(fn: Callable[..., Tensor]) -> None:
    """Sampling with a seeded generator on the scripted model: the same tokens with the cache
    and without, and again with the same seed; different ones with another seed."""
    prompt = torch.tensor([[1, 2], [3, 4], [5, 6]])

    def run(use_cache: bool, seed: int) -> tuple[Tensor, str]:
        return sample(fn, ScriptedLM(n_ctx=8, sharpness=1.0), prompt, 12, seed, use_cache)

    (with_cache, what), (without, _) = run(True, 0), run(False, 0)
    (again, _), (other_seed, _) = run(True, 0), run(True, 1)
    expect_true(
        torch.equal(with_cache, again),
        f"{what} gave other tokens when run again with a fresh generator of the same seed: pass "
        "generator=generator to the sampling (sample_next(..., generator=generator)).",
    )
    expect_same_both_ways(with_cache, without, what)
    expect_true(
        not torch.equal(with_cache, other_seed),
        f"{what} gave the same tokens with seeds 0 and 1: at temperature 1, sample (sample_next).",
    )


# The arithmetic of scale: a case is ``(12, 768, 50257, 1024, {"bias": False})`` (keywords last).


def split_case(case: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A case's positional and keyword arguments (its trailing dict, if it has one)."""
    if case and isinstance(case[-1], Mapping):
        return tuple(case[:-1]), dict(case[-1])
    return tuple(case), {}


def show_call(name: str, case: Sequence[Any]) -> str:
    """How messages name a call: ``gpt_param_count(12, 768, 50_257, 1_024, bias=False)``."""
    args, kwargs = split_case(case)
    shown = [
        f"{a:_}" if isinstance(a, int) and not isinstance(a, bool) else f"{a:.4g}" for a in args
    ]
    shown += [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{name}({', '.join(shown)})"


def number(got: Any, what: str, exact: bool) -> Any:
    """The student's answer as an int (``exact``: a count) or a float; a one-element tensor is
    taken, anything else refused."""
    if isinstance(got, Tensor) and got.numel() == 1 and not (exact and got.is_floating_point()):
        got = got.item()
    kind = numbers.Integral if exact else numbers.Real
    if isinstance(got, bool) or not isinstance(got, kind):
        should = "an int (whole numbers: floats lose digits past 2**53)" if exact else "a number"
        raise AssertionError(f"{what} returned {got!r:.40}: return {should}.")
    return int(got) if exact else float(got)


def _scale_part(
    name: str, exact: bool, rule: str, doc: str
) -> tuple[Ordinary, Callable[[Any], None]]:
    """A scale function's :class:`Ordinary` and visible check ``check_<name>``: called under the
    ban, its answer an int compared exactly (``exact``) or a float at a relative 1e-6."""

    def call(fn: Callable[..., Any], *case: Any) -> Any:
        what = show_call(name, case)
        return number(call_forbidding(fn, *split_case(case), ban=SCALE_BAN, what=what), what, exact)

    def describe(case: Case[Given]) -> str:
        shown = "{:,}" if exact else "{:.4g}"
        got, want = shown.format(case.got), shown.format(case.want)
        return f"{case.what} returned {got}, expected {want}."

    part = Ordinary(
        "lab08",
        call=call,
        what=lambda *case: show_call(name, case),
        describe=describe,
        rule=rule,
        same=operator.eq if exact else lambda a, b: math.isclose(a, b, rel_tol=1e-6),
        output=int if exact else float,
    )
    return part, part.visible(f"check_{name}", f"Worked examples: {doc}.")


#: ``gpt_param_count`` of a case ``(n_layers, d_model, vocab_size, n_ctx[, {"bias": ...}])``.
COUNT, check_gpt_param_count = _scale_part(
    "gpt_param_count",
    True,
    "Count it layer by layer: embeddings, per block two norms, attention and MLP, a final norm.",
    "GPT-2 small (124,439,808; 124,337,664 without biases) and two small GPTs, one without biases",
)
#: ``training_flops`` of a case ``(n_params, n_tokens)``.
FLOPS, check_training_flops = _scale_part(
    "training_flops",
    False,
    "Count the FLOPs of the forward and the backward pass, per parameter and token.",
    "GPT-3 (175e9 parameters, 300e9 tokens) and a small model",
)
#: ``kv_cache_bytes`` of a case ``(n_layers, d_model, n_ctx[, {keyword arguments}])``.
KV, check_kv_cache_bytes = _scale_part(
    "kv_cache_bytes",
    True,
    "Count a key and a value of width d_model per layer, position and sequence, in bytes.",
    "GPT-3's full context in float16, GPT-2 small's in float32 with a batch, and a small cache",
)
#: ``gpu_days`` of a case ``(flops, peak_flops, utilization)``.
DAYS, check_gpu_days = _scale_part(
    "gpu_days",
    False,
    "Divide the work by the rate the GPU achieves, and turn seconds into days.",
    "GPT-3's 3.15e23 FLOPs on an A100 (312 TFLOP/s) at 40%, and a day",
)

__all__ = [n for n in dir() if n.startswith("check_")]  # dir(): sorted

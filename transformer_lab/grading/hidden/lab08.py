"""Hidden checks of lab 08 (language models), their oracles (independent of the kit; a mistake's
output is the oracle run with its spec record's options) and the visible checks' fixtures."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from transformer_lab.checks import lab08
from transformer_lab.checks._common import compare, expect_true, generator, randint
from transformer_lab.checks._generated import Oracle, plain
from transformer_lab.grading.hidden import fixture_entry
from transformer_lab.grading.hidden import lab03 as hidden03
from transformer_lab.grading.hidden import lab07 as hidden07
from transformer_lab.grading.hidden._attention import distinct_mistakes, heads_split_as


def _params(weights: dict[str, Tensor], order: str = "qkv") -> hidden03.Params:
    """The fused ``qkv_proj`` cut into lab 03's ``q/k/v_proj`` in ``order``, float64, graph kept."""
    w = {k: v.to("cpu", torch.float64) for k, v in weights.items()}
    D = w["out_proj.weight"].shape[0]
    p: hidden03.Params = {n: w[n] for n in ("out_proj.weight", "out_proj.bias")}
    for i, name in enumerate(order):
        for part in ("weight", "bias"):
            p[f"{name}_proj.{part}"] = w[f"qkv_proj.{part}"][i * D : (i + 1) * D]
    return p


def oracle_keys_values(weights: dict[str, Tensor], x: Tensor, n_heads: int) -> list[Tensor]:
    """The keys and values ``(B, H, T, Dh)`` a cache must hold, in float64."""
    p, x64 = _params(weights), x.to("cpu", torch.float64)
    return [heads_split_as(hidden03.oracle_linear(x64, p, f"{n}_proj"), n_heads) for n in "kv"]


def _allowed(mask: str, start: int, end: int) -> Tensor:
    """Which stored keys ``0 .. end-1`` the queries ``start .. end-1`` may see, ``(T, end)``."""
    rows = torch.arange(start, end)[:, None]  # absolute positions of the queries
    cols = torch.arange(end)[None, :]
    if mask == "none":
        return torch.ones(end - start, end, dtype=torch.bool)
    if mask == "offset_ignored":
        return cols <= rows - start  # row i sees keys 0..i: the offset P forgotten
    if mask == "only_new":
        return (cols >= start) & (cols <= rows)  # the stored past never read
    return cols <= rows


def oracle_attention(
    weights: dict[str, Tensor],
    x: Tensor,
    n_heads: int,
    schedule: Sequence[tuple[int, int]] | None = None,
    *,
    mask: str = "causal",
    only_cached: bool = False,
    order: str = "qkv",
    **options: Any,
) -> Tensor:
    """Causal self-attention of ``x (B, T, D)`` in float64, ``(B, T, D)``: lab 03's oracle run
    on each ``(start, end)`` chunk of ``schedule`` (default one pass); a typical mistake's
    ``mask`` (:func:`_allowed`; ``only_cached``: in pieces only), ``order`` of qkv_proj's parts
    or lab 03's ``options``."""
    p = _params(weights, order)
    mask = "causal" if only_cached and not schedule else mask
    outs = []
    for start, end in schedule or ((0, x.shape[1]),):
        seen = x[:, :end]  # (B, end, D): the keys and values so far
        args = (seen[:, start:], seen, seen, _allowed(mask, start, end))
        pair = hidden03.oracle_multi_head_attention(p, args, n_heads, **options)
        assert pair is not None  # a (T, S) mask always broadcasts
        outs.append(pair[0])
    return torch.cat(outs, dim=1)


def attention_mistakes(
    weights: dict[str, Tensor],
    x: Tensor,
    n_heads: int,
    schedule: Sequence[tuple[int, int]] | None = None,
) -> dict[str, Tensor]:
    """Hint -> what each typical wrong attention returns on ``x`` (only the distinct ones), in
    the spec's order (the cache's mistakes, then the most specific first)."""
    run = functools.partial(oracle_attention, weights, x, n_heads, schedule)
    records = lab08.SPEC.parts["CausalSelfAttention"].records.values()
    return distinct_mistakes(run(), [(r.hint, run(**r.options)) for r in records], tol=1e-6)


def rising_keys(weights: dict[str, Tensor], x: Tensor, n_heads: int, lift: float) -> Tensor:
    """Make the later keys score highest (in place on ``weights``; ``x`` is copied): input channel
    0 becomes the position, which the keys copy into each head's first feature, where every query
    holds ``lift``: the keys a causal mask hides have the largest raw scores."""
    D = x.shape[-1]
    Dh = D // n_heads
    x = x.clone()
    x[..., 0] = torch.arange(x.shape[1], dtype=x.dtype)  # the position ramp
    w, b = weights["qkv_proj.weight"], weights["qkv_proj.bias"]
    w[: 2 * D : Dh] = 0.0  # the rows of each head's first query and key feature
    b[:D:Dh] = lift  # every query: a large constant in the head's first feature
    w[D : 2 * D : Dh, 0] = 1.0  # every key: its position in the head's first feature
    return x


def _draw(
    g: torch.Generator, heads: int, D: int, B: int, T: int
) -> tuple[dict[str, Tensor], Tensor]:
    """Random weights and an input ``x (B, T, D)``, the later keys scoring highest."""
    weights = {
        "qkv_proj.weight": torch.randn(3 * D, D, generator=g) / math.sqrt(D),
        "qkv_proj.bias": 0.3 * torch.randn(3 * D, generator=g),
        "out_proj.weight": torch.randn(D, D, generator=g) / math.sqrt(D),
        "out_proj.bias": 0.3 * torch.randn(D, generator=g),
    }
    return weights, rising_keys(weights, torch.randn(B, T, D, generator=g), heads, 2.0)


def _attention_case(
    cls: Callable[..., nn.Module], g: torch.Generator, dropout: float = 0.0
) -> tuple[nn.Module, dict[str, Tensor], Tensor, str, int]:
    """The student's module at random sizes with :func:`_draw`'s weights, and its input."""
    heads = randint(1, 4, g)
    D, B, T = heads * randint(2, 5, g), randint(1, 3, g), randint(3, 7, g)
    weights, x = _draw(g, heads, D, B, T)
    module, what = lab08.build_attention(cls, D, heads, weights, dropout)
    return module, weights, x, what, heads


def _one_pass(
    module: nn.Module, weights: dict[str, Tensor], x: Tensor, what: str, heads: int
) -> Tensor:
    """The module in one pass, in eval mode, judged against the oracle (whose output it returns)."""
    want = oracle_attention(weights, x, heads)
    shown = f"{what} on x {tuple(x.shape)} in one pass (the later keys score highest)"
    mistakes = attention_mistakes(weights, x, heads)
    lab08.judge_attention(
        lab08.run_attention(module.eval(), x, what), want, shown, lab08.ATTENTION_RULE, mistakes
    )
    return want


def hidden_check_causal_self_attention(cls: Callable[..., nn.Module], seed: int = 0) -> None:
    """Random sizes (later keys scoring highest) against the oracle, in eval mode."""
    g = generator(seed)
    for _ in range(3):
        _one_pass(*_attention_case(cls, g))


def _random_schedule(T: int, g: torch.Generator) -> list[tuple[int, int]]:
    """Chunks covering ``0..T``: a prefix, then a piece of at least two, then the rest."""
    first = randint(1, max(1, T - 3), g)
    second = min(T, first + randint(2, 3, g))
    return [(0, first), (first, second), *((p, p + 1) for p in range(second, T))]


def hidden_check_causal_self_attention_cache(cls: Callable[..., nn.Module], seed: int = 0) -> None:
    """Random sizes fed through a KV cache in random pieces: the one-pass output, the cache's
    contents, a cache larger than the sequence, and float16 and bfloat16."""
    g = generator(seed)
    for _ in range(2):
        module, weights, x, what, heads = _attention_case(cls, g)
        want = _one_pass(module, weights, x, what, heads)
        T = x.shape[1]
        keys, values = oracle_keys_values(weights, x, heads)
        for schedule in (_random_schedule(T, g), [(p, p + 1) for p in range(T)]):
            mistakes = attention_mistakes(weights, x, heads, schedule)
            lab08.judge_cached(
                module, x, heads, schedule, what, (want, keys, values, mistakes), T + 3
            )
    module, weights, x, what, heads = _attention_case(cls, g)
    full, schedule = oracle_attention(weights, x, heads), _random_schedule(x.shape[1], g)
    for dtype, tol in ((torch.float16, 2e-2), (torch.bfloat16, 8e-2)):
        try:
            low = module.eval().to(dtype)
            got, _ = lab08.cached_run(low, x.to(dtype), schedule, heads, f"{what} in {dtype}")
        finally:
            module.to(torch.float32)
        compare(
            got.float(),
            full,
            what=f"{what} in {dtype} fed {lab08.show_schedule(schedule)} through a KV cache",
            hint="In half precision the output must stay close to float32's: fill masked scores "
            "with torch.finfo(scores.dtype).min and compute in the input's dtype.",
            atol=tol,
            rtol=tol,
        )


def hidden_check_causal_self_attention_training(
    cls: Callable[..., nn.Module], seed: int = 0
) -> None:
    """Training mode: without dropout as the oracle, gradients too; dropout off in eval, and on
    the attention weights (:func:`_dropout_structure`)."""
    g = generator(seed)
    module, weights, x, what, heads = _attention_case(cls, g)
    training = f"{what} in training mode"
    got = lab08.run_attention(module.train(), x, training)
    lab08.judge_attention(got, oracle_attention(weights, x, heads), training, lab08.ATTENTION_RULE)
    # Gradients with respect to the input and the fused projection, against the oracle's.
    xs = x.clone().requires_grad_(True)
    x64 = x.double().requires_grad_(True)
    w64 = {k: v.double().requires_grad_(True) for k, v in weights.items()}
    r = torch.randn(x.shape, generator=g)
    out = lab08.run_attention(module, xs, f"{what} (backward pass)")
    expect_true(
        out.requires_grad,
        f"the output of {what} does not depend differentiably on x: no .detach() or no_grad.",
    )
    module.zero_grad()
    (out * r).sum().backward()
    (oracle_attention(w64, x64, heads) * r).sum().backward()
    hint = "The output is right but the gradient does not match: no in-place ops autograd needs."
    lab08.judge_attention(xs.grad, x64.grad, f"the gradient of {what} with respect to x", hint)
    name = f"the gradient of {what} with respect to qkv_proj.weight"
    lab08.judge_attention(module.qkv_proj.weight.grad, w64["qkv_proj.weight"].grad, name, hint)

    module, weights, x, what, heads = _attention_case(cls, g, dropout=0.3)
    off = "Dropout must be off in eval mode: nn.Dropout (or F.dropout(..., training=...))."
    got = lab08.run_attention(module.eval(), x, f"{what} in eval mode")
    lab08.judge_attention(got, oracle_attention(weights, x, heads), f"{what} in eval mode", off)
    _dropout_structure(cls, g)


def _dropout_structure(cls: Callable[..., nn.Module], g: torch.Generator) -> None:
    """Query 0 attends key 0 alone (weight 1): with dropout on the weights, each head's output
    at position 0 is either all zeros or the whole value scaled by 1/(1-p), both seen."""
    D, H, p = 16, 4, 0.5
    Dh = D // H
    eye = torch.eye(D)
    weights = {
        "qkv_proj.weight": torch.cat([torch.randn(2 * D, D, generator=g), eye]),  # values = x
        "qkv_proj.bias": torch.zeros(3 * D),
        "out_proj.weight": eye,
        "out_proj.bias": torch.zeros(D),
    }
    module, what = lab08.build_attention(cls, D, H, weights, p)
    module.train()
    x = 1.0 + torch.rand(8, 3, D, generator=g)  # positive: a kept head never looks dropped
    head_x = x[:, 0].reshape(8, H, Dh)  # (B, H, Dh): the value of query 0's only key
    kept = dropped = odd = 0
    for _ in range(4):
        out = lab08.run_attention(module, x, f"{what} in training mode").detach()
        heads = out[:, 0].reshape(8, H, Dh)  # (B, H, Dh)
        zero = heads.abs().amax(-1) < 1e-6  # (B, H)
        scaled = (heads - head_x / (1 - p)).abs().amax(-1) < 1e-4
        kept += int((scaled & ~zero).sum())
        dropped += int(zero.sum())
        odd += int((~zero & ~scaled).sum())
    expect_true(
        kept > 0 and dropped > 0 and odd == 0,
        f"{what} in training mode, four calls: query 0 attends key 0 alone, so each head's output "
        f"there is zero or the value scaled by 1/(1-p); {kept} kept, {dropped} dropped, {odd} "
        "neither. Dropout belongs on the attention weights, after the softmax: nn.Dropout(p).",
    )


@torch.no_grad()
def oracle_generate(
    prompt: Sequence[Sequence[int]],
    n_ctx: int,
    max_new_tokens: int,
    use_cache: bool = False,
    gpt: int | None = None,
    variant: str = "",
) -> list[list[int]]:
    """Greedy continuation on the last ``n_ctx`` tokens of a fresh ``ScriptedLM`` (of
    ``kit_gpt(gpt, n_ctx)`` where a seed ``gpt`` is given), or a mistake's ``variant``:
    ``first_position`` (the logits of position 0; a cached one-token step's only one is right),
    ``one_call``."""
    model = lab08.ScriptedLM(n_ctx=n_ctx) if gpt is None else lab08.kit_gpt(gpt, n_ctx)
    seq, T = torch.tensor(prompt), len(prompt[0])
    for step in range(max_new_tokens):
        single = use_cache and step > 0 and min(T, n_ctx) + step <= n_ctx  # one cached token
        pick = 0 if variant == "first_position" and not single else -1
        nxt = model(seq[:, -n_ctx:])[:, pick].argmax(dim=-1, keepdim=True)
        seq = torch.cat([seq, seq[:, T : T + 1] if variant == "one_call" and step else nxt], 1)
    return seq.tolist()


GREEDY = Oracle.of(lab08.GREEDY, "generate", oracle_generate)


def hidden_check_generate(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """The kit's GPT (random weights): greedy tokens with and without the cache, past the
    context too, and for a short prompt; seeded sampling the same tokens both ways."""
    g = generator(seed)
    B, T = randint(2, 3, g), randint(2, 5, g)
    prompt = torch.randint(0, 13, (B, T), generator=g)
    new = randint(12, 15, g)  # past n_ctx = 10: the cache fills, then the window slides
    other = torch.randint(0, 13, (1, 3), generator=g).tolist()  # an answer ignoring it fails
    cases = [(prompt.tolist(), 10, new, use_cache, seed) for use_cache in (True, False)]
    GREEDY.judge(fn, [*cases, (other, 10, 2, False, seed)])
    for options in ({}, {"top_k": 5}, {"top_p": 0.9}):
        (first, what), (second, _) = (
            lab08.sample(fn, lab08.kit_gpt(seed, 10), prompt, new, seed, use_cache, **options)
            for use_cache in (True, False)
        )
        lab08.expect_same_both_ways(first, second, what)


def _edge_cases(g: torch.Generator) -> list[tuple[Any, ...]]:
    cases = [
        ([[randint(0, 10, g) for _ in range(6)]], 6, 4),  # prompt fills the context
        ([[randint(0, 10, g) for _ in range(9)] for _ in range(2)], 5, 6),  # longer prompt
        ([[randint(0, 10, g) for _ in range(3)]], 7, 1),  # one new token
        ([[randint(0, 10, g)]], 5, 15),  # a single-token prompt, three contexts
        ([[randint(0, 10, g) for _ in range(4)] for _ in range(3)], 9, 0),  # nothing to do
    ]
    return [(*case, use_cache) for case in cases for use_cache in (False, True)]


hidden_check_generate_edges = GREEDY.hidden(
    "hidden_check_generate_edges",
    _edge_cases,
    """Scripted model: a prompt exactly n_ctx long, longer prompts, one token, none, a long run
    of three contexts, one sequence; the calls and the tokens.""",
)


def hidden_check_generate_strategies(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Temperature, top-k and top-p reach the sampling: the frequencies of 3000 draws of the
    scripted model's first token (a spread distribution over 8)."""
    N, model = 3000, lab08.ScriptedLM(vocab_size=8, n_ctx=4, sharpness=2.0)
    prompt = torch.zeros(N, 1, dtype=torch.long)
    table = model.logits_for(prompt[:1])[0, 0]  # (8,): the logits after token 0
    settings: list[dict[str, Any]] = [{"temperature": t} for t in (1.0, 0.5, 2.0)]
    settings += [{"temperature": 1.0, "top_k": 3}, {"temperature": 1.0, "top_p": 0.8}]
    for i, options in enumerate([*settings, {"temperature": 2.0, "top_k": 2}]):
        shown = ", ".join(f"{k}={v}" for k, v in options.items())
        what = f"generate(model, idx ({N}, 1), 1, {shown}, generator=seeded)"
        draws = torch.Generator().manual_seed(seed + i)
        got = lab08.run_generate(fn, model, prompt, 1, what, generator=draws, **options)
        drawn = torch.bincount(got[:, 1].cpu().long(), minlength=8)[:8].double() / N
        logits = hidden07.oracle_apply_temperature(table, options["temperature"])  # lab 07's
        if "top_k" in options:
            logits = hidden07.oracle_top_k_filter(logits, options["top_k"])
        if "top_p" in options:
            logits = hidden07.oracle_top_p_filter(logits, options["top_p"])
        want = torch.softmax(logits, dim=-1)  # the distribution the strategies sample from
        worst = float((drawn - want).abs().max())
        expect_true(
            worst < 0.04 and not bool(((drawn > 0) & (want == 0)).any()),
            f"{what} drew the tokens with frequencies {[round(x, 3) for x in drawn.tolist()]}, "
            f"but the distribution is {[round(x, 3) for x in want.tolist()]}: pass the "
            "temperature, top_k and top_p to the sampling (sample_next).",
        )


def oracle_gpt_param_count(
    n_layers: int,
    d_model: int,
    vocab_size: int,
    n_ctx: int,
    options: Mapping[str, Any],
    *,
    bias: bool | None = None,
    norm_bias: bool | None = None,
    norms: int = 2,
    final_norm: bool = True,
    positions: str = "n_ctx",
    tied: bool = True,
    mask: bool = False,
    mlp: int = 4,
    qkv_bias: int = 3,
) -> int:
    """GPT-2's parameters, layer by layer (the output layer tied to the token embedding); the
    keywords are a mistake's options (``bias``: whatever the call says)."""
    D = d_model
    b = int(options.get("bias", True) if bias is None else bias)
    norm = (1 + (b if norm_bias is None else norm_bias)) * D  # gain (and bias)
    attention = D * 3 * D + b * qkv_bias * D + D * D + b * D
    block = norms * norm + attention + 2 * mlp * D * D + b * (mlp + 1) * D + mask * n_ctx**2
    rows = {"n_ctx": n_ctx, "vocab": vocab_size, "none": 0}[positions]  # of the position table
    return (2 - tied) * vocab_size * D + rows * D + n_layers * block + final_norm * norm


def oracle_training_flops(
    n_params: float, n_tokens: float, *, factor: int = 6, added: bool = False
) -> float:
    """``6 N D``: 2 per parameter and token forward, 4 backward (a mistake's options: another
    ``factor``, N and D ``added``)."""
    N, D = float(n_params), float(n_tokens)
    return factor * (N + D) if added else factor * N * D


def oracle_kv_cache_bytes(
    n_layers: int,
    d_model: int,
    n_ctx: int,
    options: Mapping[str, Any],
    *,
    kinds: int = 2,
    batch_size: int | None = None,
    bytes_per_value: int | None = None,
    layers: bool = True,
    scores: bool = False,
    bits: bool = False,
) -> int:
    """A key and a value (two ``kinds``) of width D per layer, position and sequence; the
    keywords are a mistake's options."""
    B = options.get("batch_size", 1) if batch_size is None else batch_size
    b = options.get("bytes_per_value", 2) if bytes_per_value is None else bytes_per_value
    per_position = kinds * (n_ctx if scores else d_model) * b * (8 if bits else 1)
    return (n_layers if layers else 1) * B * n_ctx * per_position


def oracle_gpu_days(
    flops: float, peak_flops: float, utilization: float, *, power: int = 1, unit: int = 86400
) -> float:
    """Seconds at the achieved rate, in days (a mistake's options: the utilization to another
    ``power``, another ``unit`` in seconds)."""
    return flops / (peak_flops * utilization**power) / unit


COUNT = Oracle.of(lab08.COUNT, "gpt_param_count", oracle_gpt_param_count)
FLOPS = Oracle.of(lab08.FLOPS, "training_flops", oracle_training_flops)
KV = Oracle.of(lab08.KV, "kv_cache_bytes", oracle_kv_cache_bytes)
DAYS = Oracle.of(lab08.DAYS, "gpu_days", oracle_gpu_days)


def _count_cases(g: torch.Generator) -> list[tuple[Any, ...]]:
    from transformer_lab.scale import GPT2_FAMILY, GPT3_FAMILY

    cases: list[tuple[Any, ...]] = []
    for _ in range(4):
        sizes = (randint(1, 48, g), 8 * randint(1, 256, g), randint(2, 60000, g))
        sizes += (randint(1, 4096, g),)
        cases.append((*sizes, {} if randint(0, 1, g) else {"bias": False}))
    for spec in (*GPT2_FAMILY, GPT3_FAMILY[-1]):
        cases.append((spec.n_layers, spec.d_model, spec.vocab_size, spec.n_ctx, {}))
    return [*cases, (96, 12288, 50257, 2048, {"bias": False})]


hidden_check_gpt_param_count = COUNT.hidden(
    "hidden_check_gpt_param_count",
    _count_cases,
    """Random sizes with and without biases, GPT-2's four sizes and GPT-3 175B, exactly.""",
)


def _flops_cases(g: torch.Generator) -> list[tuple[Any, ...]]:
    cases = [(float(randint(1, 999, g)) * 10.0 ** randint(5, 11, g), randint(10**6, 10**9, g))]
    return [*cases, (randint(10**3, 10**7, g), float(randint(1, 99, g)) * 1e9), (1.3e9, 300e9)]


hidden_check_training_flops = FLOPS.hidden(
    "hidden_check_training_flops",
    _flops_cases,
    """Random sizes (ints and floats) and the GPT-3 family's 300B tokens.""",
)


def _kv_cases(g: torch.Generator) -> list[tuple[Any, ...]]:
    cases = []
    for width in (4, 2, 1):
        sizes = (randint(2, 96, g), 64 * randint(1, 100, g), 128 * randint(1, 64, g))
        cases.append((*sizes, {"batch_size": randint(2, 64, g), "bytes_per_value": width}))
    return cases


hidden_check_kv_cache_bytes = KV.hidden(
    "hidden_check_kv_cache_bytes",
    _kv_cases,
    """Random sizes, batches and value widths (1, 2 and 4 bytes).""",
)


def _days_cases(g: torch.Generator) -> list[tuple[Any, ...]]:
    return [
        (float(randint(1, 999, g)) * 10.0 ** randint(18, 24, g), peak, randint(20, 70, g) / 100)
        for peak in (125e12, 312e12, 989e12)
    ]


hidden_check_gpu_days = DAYS.hidden(
    "hidden_check_gpu_days",
    _days_cases,
    """Random work, peaks and utilizations.""",
)


def fixtures() -> dict[str, dict[str, Any]]:
    """The stored examples of :mod:`transformer_lab.checks.lab08`, keyed by the call."""
    out: dict[str, dict[str, Any]] = {}
    heads, (weights, x) = 2, _draw(generator(8), 2, 8, 2, 5)  # CausalSelfAttention(8, 2)
    out["CausalSelfAttention example: x, weights"] = fixture_entry(plain([x, weights]))
    out["CausalSelfAttention example: out"] = fixture_entry(
        oracle_attention(weights, x, heads), attention_mistakes(weights, x, heads)
    )
    for name, plan in lab08.SCHEDULES.items():
        out[f"CausalSelfAttention example, cached {name}: out"] = fixture_entry(
            oracle_attention(weights, x, heads, plan), attention_mistakes(weights, x, heads, plan)
        )
    kv = plain(oracle_keys_values(weights, x, heads))
    out["CausalSelfAttention example: keys, values"] = fixture_entry(kv)
    examples = [
        ([[1, 4, 2], [5, 0, 3]], 12, 6),  # the cache never fills
        ([[2, 7, 1, 8]], 6, 7),  # the cache fills, then the window slides
        ([[3, 1, 4, 1, 5, 9, 2, 6]], 6, 3),  # a prompt longer than the context
    ]
    cases = [(*case, use_cache) for case in examples for use_cache in (False, True)]
    out |= GREEDY.fixtures("check_generate", cases)
    gpt2 = (12, 768, 50257, 1024)
    small = [(1, 8, 5, 4, {}), (3, 12, 17, 9, {"bias": False})]
    out |= COUNT.fixtures("check_gpt_param_count", [(*gpt2, {}), (*gpt2, {"bias": False}), *small])
    out |= FLOPS.fixtures("check_training_flops", [(175e9, 300e9), (124_439_808, 10e9)])
    kv = [(96, 12288, 2048, {}), (12, 768, 1024, {"batch_size": 8, "bytes_per_value": 4})]
    kv.append((3, 16, 8, {"batch_size": 2, "bytes_per_value": 4}))
    out |= KV.fixtures("check_kv_cache_bytes", kv)
    days = [(3.15e23, 312e12, 0.4), (8.64e18, 1e14, 1.0)]
    out |= DAYS.fixtures("check_gpu_days", days)
    return out


__all__ = ["fixtures", *(n for n in dir() if n.startswith("hidden_check_"))]  # dir(): sorted

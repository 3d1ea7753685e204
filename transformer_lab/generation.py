"""Decoding: logit filters for sampling, greedy seq2seq decoding, GPT generation with a KV cache,
and beam search.

Sampling draws the next token from ``softmax(logits / temperature)``, optionally restricted to the
``k`` most likely tokens (top-k) or to the smallest set whose probability reaches ``p`` (top-p,
"nucleus"). Filters return logits with removed entries at ``-inf`` so they compose and feed
straight into a softmax. :func:`generate` keeps past keys/values in a preallocated
:class:`~transformer_lab.attention.KVCache`, so each new token costs one position instead of the
whole prefix; it gives the same tokens as recomputing the prefix every step. Its
:class:`DecodeStep` has the same shapes at every step, so it can be compiled once (on a GPU into a
CUDA graph: one replay per token instead of hundreds of kernel launches).

Tie rules (stated in the lab too):

* top-k keeps every token whose logit equals the ``k``-th largest, so ties at the boundary can
  keep more than ``k`` tokens.
* top-p sorts tokens by probability, highest first, equal probabilities in order of token id
  (lowest first); it keeps each token whose preceding mass is ``< p``, i.e. the token that makes
  the running total cross ``p`` is kept, and always keeps the most likely token.

References: Holtzman et al., "The Curious Case of Neural Text Degeneration", ICLR 2020 (top-p);
Fan et al., "Hierarchical Neural Story Generation", 2018 (top-k); Wu et al., "Google's Neural
Machine Translation System", 2016 (beam search length normalisation).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from transformer_lab.graded import graded

__all__ = [
    "DecodeStep",
    "apply_temperature",
    "beam_search",
    "compile_decode_step",
    "generate",
    "greedy_decode",
    "kit_attention_copy",
    "sample_next",
    "top_k_filter",
    "top_p_filter",
]


@graded("07_nlp_pipeline")
def apply_temperature(logits: Tensor, t: float) -> Tensor:
    """Divide logits by the temperature: ``t < 1`` sharpens, ``t > 1`` flattens.

    Args:
        logits: ``(..., V)``.
        t: temperature, ``> 0``.

    Returns:
        ``logits / t``.

    Raises:
        ValueError: if ``t <= 0`` (use greedy decoding for the ``t -> 0`` limit).
    """
    if not t > 0:
        raise ValueError(f"temperature t={t} must be > 0 (for t -> 0 use greedy decoding)")
    return logits / t


@graded("07_nlp_pipeline")
def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the ``k`` largest logits of each row; the rest become ``-inf``.

    Ties: every entry equal to the ``k``-th largest value is kept. ``k >= V`` keeps everything.

    Args:
        logits: ``(..., V)``.
        k: number of tokens to keep, ``>= 1``.

    Returns:
        Filtered logits, same shape.

    Raises:
        ValueError: if ``k < 1``.
    """
    if k < 1:
        raise ValueError(f"top-k needs k >= 1, got k={k}")
    if k >= logits.shape[-1]:
        return logits.clone()
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, -math.inf)


@graded("07_nlp_pipeline")
def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Nucleus filter: keep the most likely tokens until their total probability reaches ``p``.

    A token is kept when the probability of the tokens ranked before it is ``< p``: the token
    that crosses ``p`` is kept, the most likely token always is. Ties in probability are ranked
    by token id, lowest first. ``p = 1`` keeps everything.

    Args:
        logits: ``(..., V)``.
        p: probability mass in ``(0, 1]``.

    Returns:
        Filtered logits, same shape, removed entries ``-inf``.

    Raises:
        ValueError: if ``p`` is outside ``(0, 1]``.
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top-p needs p in (0, 1], got p={p}")
    if p == 1.0:
        return logits.clone()
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    remove_sorted = mass_before >= p
    remove_sorted[..., 0] = False
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, -math.inf)


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick one token per row from ``(B, V)`` logits; ``temperature=0`` means argmax.

    Returns:
        ``(B, 1)`` token ids.
    """
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = apply_temperature(logits.float(), temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)


class DecodeStep(nn.Module):
    """The static-shape generation step of a GPT: one token per sequence into a preallocated cache.

    :meth:`prefill` runs the prompt once (any length) and stores its keys and values. Each call
    then feeds one token per sequence at a position given as a one-element tensor on the
    model's device: its keys/values are written into the cache and attention reads all
    ``n_ctx`` slots under a mask, so no shape depends on the position and the step compiles
    once. With ``torch.compile(mode="reduce-overhead")`` on CUDA the whole step (every layer, a
    few hundred kernels) becomes one CUDA-graph replay, which removes the per-token launch and
    Python overhead that dominates small models. Build a compiled one with
    :func:`compile_decode_step` and reuse it across :func:`generate` calls.

    Args:
        model: a :class:`~transformer_lab.models.GPT` (``new_kv_cache`` and
            ``forward(idx, kv_cache, offset=...)``), in the mode it should decode in.
        batch_size: sequences decoded together, ``B``.
    """

    def __init__(self, model: nn.Module, batch_size: int) -> None:
        super().__init__()
        self.model = model
        self.cache = model.new_kv_cache(batch_size)

    def prefill(self, idx: Tensor) -> Tensor:
        """Run the prompt ``(B, T <= n_ctx)`` from position 0: next-token logits ``(B, V)``."""
        self.cache.reset()
        return self.model(idx, self.cache)[:, -1]

    def forward(self, token: Tensor, offset: Tensor) -> Tensor:
        """Feed one token per sequence.

        Args:
            token: ``(B, 1)`` token ids.
            offset: their position, a one-element long tensor on the model's device; every
                earlier position must be stored (by :meth:`prefill` and earlier steps).

        Returns:
            Next-token logits ``(B, V)``.
        """
        return self.model(token, self.cache, offset=offset)[:, -1]


def compile_decode_step(
    model: nn.Module, batch_size: int, options: bool | Mapping[str, Any] = True
) -> DecodeStep:
    """A :class:`DecodeStep` compiled with ``torch.compile`` (one graph, ``fullgraph=True``).

    Compiling costs seconds (once per process and batch size); reuse the result across
    :func:`generate` calls (``decode_step=``): on CUDA a new step's cache has new addresses, so
    its CUDA graph would be recorded again.

    Args:
        model: the GPT.
        batch_size: ``B``.
        options: ``True``: ``mode="reduce-overhead"`` (CUDA graphs) on CUDA, the default mode
            elsewhere; or ``torch.compile``'s options, e.g. ``{"backend": "aot_eager"}``.

    Returns:
        The compiled step (its ``prefill`` runs eagerly).
    """
    step = DecodeStep(model, batch_size)
    if isinstance(options, Mapping):
        kwargs = dict(options)
    else:
        kwargs = {"mode": "reduce-overhead"} if step.cache.k.is_cuda else {}
    # The cache is written in place at every step: its addresses must stay fixed in the graph.
    for t in (*step.cache.layer_k, *step.cache.layer_v):
        torch._dynamo.mark_static_address(t)
    return torch.compile(step, fullgraph=True, **kwargs)


def kit_attention_copy(model: nn.Module) -> nn.Module:
    """A copy of a :class:`~transformer_lab.models.GPT` with the kit's attention and its weights.

    A compiled :class:`DecodeStep` reads all ``n_ctx`` cache slots under the kit's mask
    (``offset`` on the device); an attention that makes its own mask from the number of keys it
    gets back (lab 08's ``CausalSelfAttention``) would attend to the unwritten slots there. Its
    trained weights load into the kit's attention when names and shapes agree (one fused
    ``qkv_proj``, then ``out_proj``, as lab 08 asks), so the copy computes the same function and
    can be compiled.

    Args:
        model: the GPT (``config``, ``tok_emb``), on its device and dtype.

    Returns:
        The copy, on the same device, dtype and mode.

    Raises:
        ValueError: if the weights do not fit the kit's GPT (the message names them).
    """
    from transformer_lab.models import GPT

    weight = model.tok_emb.weight
    twin = GPT(model.config).to(device=weight.device, dtype=weight.dtype)
    missing, unexpected = twin.load_state_dict(model.state_dict(), strict=False)
    if missing or unexpected:
        raise ValueError(
            "the model's weights do not fit the kit's GPT: "
            f"missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}"
        )
    return twin.train(model.training)


@graded("08_language_models")
@torch.no_grad()
def generate(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    use_cache: bool = True,
    compile: bool | Mapping[str, Any] = False,
    decode_step: DecodeStep | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Continue token sequences with a GPT.

    Without the cache, every step runs the model on the last ``n_ctx`` tokens. With it, the prompt
    (its last ``n_ctx`` tokens) is run once and each step feeds only the new token: eagerly, the
    cache counts positions and attention reads the stored prefix; with ``compile`` or a
    ``decode_step``, through a compiled :class:`DecodeStep` (static shapes). Once the cache holds
    ``n_ctx`` positions, generation falls back to recomputing over the last ``n_ctx`` tokens,
    exactly as the uncached path does, so every way gives the same tokens throughout.

    The model is used in its current mode: call ``model.eval()`` first to disable dropout.

    Args:
        model: a :class:`~transformer_lab.models.GPT` (anything with ``config.n_ctx`` and
            ``forward(idx) -> (B, T, V)`` works without the cache).
        idx: prompt ``(B, T)``, ``T >= 1``.
        max_new_tokens: tokens to append.
        temperature: softmax temperature; ``0`` picks the argmax (greedy).
        top_k: keep the ``k`` most likely tokens (see :func:`top_k_filter`).
        top_p: nucleus mass (see :func:`top_p_filter`).
        use_cache: use a KV cache (for models that have ``new_kv_cache``).
        compile: decode through a step that :func:`compile_decode_step` builds with these
            options (``True`` or a mapping); worth it for long generations on a GPU.
        decode_step: a step from :func:`compile_decode_step` (or a plain :class:`DecodeStep`)
            for this model and batch size, to reuse across calls; overrides ``compile``.
        generator: random source for sampling, on the model's device.

    Returns:
        ``(B, T + max_new_tokens)``: the prompt followed by the new tokens.

    Raises:
        ValueError: on a negative ``max_new_tokens``, an empty prompt, or bad filter values.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0")
    if idx.ndim != 2 or idx.shape[1] < 1:
        raise ValueError(f"idx must be a (B, T) prompt with T >= 1, got shape {tuple(idx.shape)}")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0")
    if max_new_tokens == 0:
        return idx
    n_ctx = model.config.n_ctx
    context = idx[:, -n_ctx:]  # (B, <=n_ctx)
    # Models without a cache (e.g. a plain reference GPT) simply recompute every step.
    cached = use_cache and hasattr(model, "new_kv_cache")
    if cached and compile and decode_step is None:
        decode_step = compile_decode_step(model, idx.shape[0], compile)
    if decode_step is not None:  # static shapes: positions go in as device tensors
        logits = decode_step.prefill(context)  # (B, V)
        offsets = torch.arange(n_ctx, device=idx.device)
    elif cached:  # eager: the cache counts positions
        cache = model.new_kv_cache(idx.shape[0])
        logits = model(context, cache)[:, -1]  # (B, V)
    else:
        logits = model(context)[:, -1]  # (B, V)
    pos = context.shape[1]  # position of the next token
    for i in range(max_new_tokens):
        nxt = sample_next(
            logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
        )
        idx = torch.cat([idx, nxt], dim=1)  # (B, T + i + 1)
        if i == max_new_tokens - 1:
            break
        if decode_step is not None and pos < n_ctx:
            logits = decode_step(nxt, offsets[pos : pos + 1])
        elif cached and pos < n_ctx:
            logits = model(nxt, cache)[:, -1]
        else:  # no cache, or it is full: slide the window and recompute
            logits = model(idx[:, -n_ctx:])[:, -1]
        pos += 1
    return idx


@graded("06_decoder_training")
@torch.no_grad()
def greedy_decode(
    model: nn.Module,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    max_len: int,
    src_padding_mask: Tensor | None = None,
) -> Tensor:
    """Greedy decoding with a :class:`~transformer_lab.models.Seq2SeqTransformer`.

    The source is encoded once; the target grows one argmax token at a time from BOS. A sequence
    that has produced EOS is continued with the model's ``pad_id`` (EOS if it has none); decoding
    stops when every sequence has finished or the length reaches ``max_len`` (capped at the
    model's ``config.max_len``, the longest target its position table covers).

    Args:
        model: has ``encode(src, src_padding_mask)`` and
            ``decode(tgt_in, memory, src_padding_mask)``.
        src: ``(B, S)`` source ids.
        bos_id: first decoder input.
        eos_id: end token.
        max_len: longest output, counting BOS.
        src_padding_mask: ``(B, S)`` bool, True at real source tokens.

    Returns:
        ``(B, L)`` with ``L <= max_len``, starting with BOS.

    Raises:
        ValueError: if ``max_len < 1``.
    """
    if max_len < 1:
        raise ValueError(f"max_len={max_len} must be >= 1 (it counts the BOS token)")
    model_config = getattr(model, "config", None)
    pad_id = getattr(model_config, "pad_id", eos_id)
    # The decoder cannot read past its position table: stop there rather than fail mid-way.
    max_len = min(max_len, getattr(model_config, "max_len", max_len))
    memory = model.encode(src, src_padding_mask)
    B = src.shape[0]
    ys = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    while ys.shape[1] < max_len and not bool(done.all()):
        logits = model.decode(ys, memory, src_padding_mask)[:, -1]  # (B, V)
        nxt = logits.argmax(dim=-1)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        ys = torch.cat([ys, nxt[:, None]], dim=1)  # (B, L + 1)
        done |= nxt == eos_id
    return ys


@graded("07_nlp_pipeline")
def beam_search(
    step_fn: Callable[[list[int]], Tensor | Sequence[float]],
    bos_id: int,
    eos_id: int,
    beam_width: int,
    max_len: int,
    *,
    length_penalty: float = 0.0,
) -> list[int]:
    """Beam search over a next-token distribution.

    Each step extends every live hypothesis with its ``beam_width`` best tokens and keeps the
    ``beam_width`` best extensions by total log-probability; extensions ending in EOS (ranked
    within the best ``beam_width``) are set aside as finished. With ``length_penalty = 0`` the
    search stops as soon as the best finished hypothesis scores at least as well as every live
    one (log-probs are ``<= 0``, so live ones can only get worse). ``beam_width = 1`` is greedy
    decoding.

    Length normalisation: the final choice ranks hypotheses by ``score / n**length_penalty`` with
    ``n`` the number of generated tokens. ``0`` uses the raw sum (which favours short outputs);
    ``1`` the mean log-probability per token.

    Args:
        step_fn: ``step_fn(prefix) -> (V,)`` log-probabilities of the next token.
        bos_id: start token (the first prefix is ``[bos_id]``).
        eos_id: end token.
        beam_width: hypotheses kept per step, ``>= 1``.
        max_len: longest hypothesis, counting BOS (and EOS).
        length_penalty: exponent of the length normalisation, ``>= 0``.

    Returns:
        The best hypothesis as a list of ids, starting with BOS (ending with EOS if it finished).

    Raises:
        ValueError: if ``beam_width < 1``, ``max_len < 1`` or ``length_penalty < 0``.
    """
    if beam_width < 1:
        raise ValueError(f"beam_width={beam_width} must be >= 1")
    if max_len < 1:
        raise ValueError(f"max_len={max_len} must be >= 1")
    if length_penalty < 0:
        raise ValueError(f"length_penalty={length_penalty} must be >= 0")

    def normalised(hyp: tuple[list[int], float]) -> float:
        seq, score = hyp
        n = max(len(seq) - 1, 1)
        return score / n**length_penalty if length_penalty else score

    alive: list[tuple[list[int], float]] = [([bos_id], 0.0)]
    finished: list[tuple[list[int], float]] = []
    while alive and len(alive[0][0]) < max_len:
        candidates: list[tuple[list[int], float]] = []
        for seq, score in alive:
            logp = torch.as_tensor(step_fn(seq), dtype=torch.float64).flatten()  # (V,)
            # A stable sort, not topk: among equal log-probabilities the lower token id ranks
            # first (topk leaves their order unspecified).
            ranked = torch.sort(logp, descending=True, stable=True)
            width = min(beam_width, logp.numel())
            values, tokens = ranked.values[:width].tolist(), ranked.indices[:width].tolist()
            for lp, tok in zip(values, tokens, strict=True):
                candidates.append(([*seq, tok], score + lp))
        candidates.sort(key=lambda c: c[1], reverse=True)  # stable: ties keep earlier beams first
        # An EOS extension finishes if it ranks among the best beam_width; the best beam_width
        # extensions without EOS go on.
        finished += [c for c in candidates[:beam_width] if c[0][-1] == eos_id]
        alive = [c for c in candidates if c[0][-1] != eos_id][:beam_width]
        if (
            length_penalty == 0
            and finished
            and alive
            and max(s for _, s in finished) >= alive[0][1]
        ):
            break
    pool = finished + alive
    return max(pool, key=normalised)[0]

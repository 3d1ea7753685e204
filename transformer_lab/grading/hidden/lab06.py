"""Hidden checks of lab 06 (training an encoder-decoder), their float64 oracles (a named
mistake's wrong output is its oracle run with the options its spec record gives) and the
visible fixtures.

Reference: Prince, *Understanding Deep Learning*, sections 12.7.1 and 12.8; Vaswani et al.,
"Attention Is All You Need", 2017, section 3.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from transformer_lab.checks import lab06
from transformer_lab.checks._common import expect_true, generator, randint
from transformer_lab.checks._generated import Oracle, floats_at
from transformer_lab.checks.lab06 import SPEC, BlockCase, StandInTranslator, trusted_data
from transformer_lab.grading.hidden._blocks import (
    attention64,
    feed_forward64,
    layer_norm64,
    linear64,
    random_weights,
)


def oracle_block(
    *args: Any,
    order: Sequence[str] = ("sa", "ca", "ff"),
    norms: Sequence[int] = (1, 2, 3),
    pre_norm: bool = False,
    no_residual: str = "",
    unmasked: str = "",
) -> Tensor:
    """The post-norm decoder block in float64 on a :class:`~lab06.BlockCase` (its weights named
    as the kit's block's), with its own attention (fully masked rows give zero weights); with
    dropout (~1) in training mode every sub-layer's output dropped. The options make the
    typical wrong blocks: sub-layers in another ``order``, other ``norms`` after them,
    ``pre_norm``, the ``no_residual`` sub-layer without its residual, the ``unmasked`` one
    without its mask."""
    c = BlockCase(*args)
    masks = {"sa": c.self_mask, "ca": c.memory_mask} | {unmasked: None}
    kept = 0.0 if c.training and c.dropout else 1.0

    ff = linear64(c.weights, "ff.linear1"), linear64(c.weights, "ff.linear2")
    sublayer = {
        "sa": lambda h: attention64(c.weights, "self_attn", h, h, c.n_heads, masks["sa"]),
        "ca": lambda h: attention64(c.weights, "cross_attn", h, c.memory, c.n_heads, masks["ca"]),
        "ff": lambda h: feed_forward64(h, *ff),
    }
    h = c.x.double()
    for kind, n in zip(order, norms, strict=True):
        norm = linear64(c.weights, f"norm{n}")
        if pre_norm:
            h = h + sublayer[kind](layer_norm64(h, *norm))
        else:
            out = kept * sublayer[kind](h)
            h = layer_norm64(out if kind == no_residual else h + out, *norm)
    return h


BLOCK = Oracle.of(lab06.BLOCK, "DecoderBlock", oracle_block)
#: In bfloat16 (as under precision="bf16-true") against float64, at bfloat16's tolerance.
HALF = BLOCK.at(
    **floats_at(**SPEC.close_tol("half_block")),
    named=lambda _case: (
        "Masks must fill with the dtype's smallest value (or use boolean masks), "
        "not a fixed -1e9, and nothing may be computed in another precision."
    ),
)


def _masks(B: int, T: int, S: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Causal + target padding ``(B, 1, T, T)`` and source padding ``(B, 1, 1, S)``."""
    t_len = torch.randint(1, T + 1, (B,), generator=g)
    s_len = torch.randint(1, S + 1, (B,), generator=g)
    t_len[0], s_len[0] = T, S
    t_len[1], s_len[1] = max(1, T - 1), S - 1  # some padding in every batch
    causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
    self_mask = (torch.arange(T) < t_len[:, None])[:, None, None] & causal  # (B, 1, T, T)
    memory_mask = (torch.arange(S)[None] < s_len[:, None])[:, None, None, :]  # (B, 1, 1, S)
    return self_mask, memory_mask


def _block_cases(g: torch.Generator) -> list[tuple[Any, ...]]:
    cases: list[tuple[Any, ...]] = []
    for _ in range(2):
        heads = randint(1, 4, g)
        d_model = heads * 2 * randint(2, 4, g)
        d_ff = 2 * d_model
        B, T = randint(2, 3, g), randint(2, 6, g)
        S = T + randint(1, 4, g)
        given = d_model, heads, d_ff, random_weights(d_model, d_ff, g, "self_attn", "cross_attn")
        x = torch.randn(B, T, d_model, generator=g)
        memory = 2.0 * torch.randn(B, S, d_model, generator=g)
        cases += [(*given, x, memory, None, None), (*given, x, memory, *_masks(B, T, S, g))]
    return cases


hidden_check_decoder_block = BLOCK.hidden(
    "hidden_check_decoder_block",
    _block_cases,
    """Two blocks of random sizes (``T != S``) in eval mode, without masks and with causal &
    target padding and source padding masks.""",
)


def hidden_check_decoder_block_masks(cls: Callable[..., nn.Module], seed: int = 0) -> None:
    """Hidden memory with the largest values, a fully masked memory row, and bfloat16."""
    g = generator(seed)
    sizes, B, T, S = (16, 2, 32), 3, 4, 6
    weights = random_weights(16, 32, g, "self_attn", "cross_attn")
    x = torch.randn(B, T, 16, generator=g)
    memory = torch.randn(B, S, 16, generator=g)
    self_mask, _ = _masks(B, T, S, g)
    memory_mask = torch.arange(S).expand(B, 1, 1, S) < S - 2  # (B, 1, 1, S): the last 2 hidden
    # The hidden memory positions carry values a thousand times larger: their raw scores are the
    # largest (or most negative) of their rows; only masking before the softmax hides them.
    memory[:, S - 2 :] *= 1000.0
    empty = memory_mask.clone()
    empty[1] = False  # the second sentence has no real source token at all (zero weights)
    BLOCK.judge(
        cls, [(*sizes, weights, x, memory, self_mask, mask) for mask in (memory_mask, empty)]
    )
    # bfloat16 (precision="bf16-true"), without the hidden positions: the dtype kept, the
    # values close to float64's, the masks filled within bfloat16's range.
    given = (*sizes, weights, x, memory[:, : S - 2], self_mask, memory_mask[..., : S - 2])
    HALF.judge(cls, [(*given, 0.0, False, torch.bfloat16)])


def hidden_check_decoder_block_training(cls: Callable[..., nn.Module], seed: int = 0) -> None:
    """Training mode: without dropout as eval mode; dropout acts in training only, on each
    sub-layer's output before the residual sum (dropout near 1 leaves
    ``norm3(norm2(norm1(x)))``, and nothing in eval mode)."""
    g = generator(seed)
    sizes, B, T, S = (16, 4, 32), 2, 5, 7
    weights = random_weights(16, 32, g, "self_attn", "cross_attn")
    x = torch.randn(B, T, 16, generator=g)
    memory = torch.randn(B, S, 16, generator=g)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]
    # (dropout, training mode): the record that names a block wrong in that setting alone
    trials = {(0.0, True): None, (1.0 - 1e-7, False): "InEval", (1.0 - 1e-7, True): "Ignored"}
    for setting, mistake in trials.items():
        hint = mistake and SPEC.mistake(f"decoder_block BlockDropout{mistake}").hint
        trial = BLOCK.at(named=lambda _case, hint=hint: hint)
        trial.judge(cls, [(*sizes, weights, x, memory, causal, None, *setting)])


def oracle_shift_right(
    targets: Tensor,
    bos_id: int,
    *,
    fill: int | str = "bos",
    keep: str = "head",
    at_end: bool = False,
    dim: int = 1,
) -> Tensor:
    """``[bos, t_0, ..., t_{T-2}]`` per row, with Python lists; the options make the typical
    wrong shifts: another ``fill`` than BOS (an id, or the row's ``"last"`` target), the row's
    ``"tail"`` kept (its first target dropped), the fill ``at_end``, rows along ``dim`` 0."""
    rows = []
    for row in targets.tolist() if dim == 1 else targets.T.tolist():
        first = bos_id if fill == "bos" else row[-1] if fill == "last" else fill
        kept = row[:-1] if keep == "head" else row[1:]
        rows.append([*kept, first] if at_end else [first, *kept])
    out = torch.tensor(rows)  # (B, T), or (T, B) along dim 0
    return (out if dim == 1 else out.T).reshape(targets.shape)


SHIFT = Oracle.of(lab06.SHIFT, "shift_right", oracle_shift_right)


def _shift_cases(g: torch.Generator) -> list[tuple[Tensor, int]]:
    sizes = ((randint(2, 5, g), randint(3, 9, g)), (randint(1, 3, g), 1), (1, randint(2, 6, g)))
    return [(torch.randint(0, 20, size, generator=g), randint(1, 9, g)) for size in sizes]


hidden_check_shift_right = SHIFT.hidden(
    "hidden_check_shift_right",
    _shift_cases,
    """Random sizes and BOS ids, one-step targets, and the input left unchanged.""",
)


def oracle_sequence_loss(
    logits: Tensor,
    targets: Tensor,
    pad_id: int,
    *,
    ignore: str = "pad_id",
    mean: str = "tokens",
    dim: int = -1,
    log: bool = True,
    minus: bool = True,
) -> Tensor:
    """The mean of ``-log softmax`` over the real targets (``!= pad_id``), in float64; the
    options make the typical wrong losses: id ``"zero"`` or ``"nothing"`` ignored, the
    ``"sum"``, or the mean of ``"sentences"`` or over all ``"positions"``, the softmax over
    ``dim``, probabilities for their log, no minus sign."""
    log_p = torch.log_softmax(logits.double(), dim=dim)  # (B, T, V)
    term = log_p.gather(-1, targets[..., None]).squeeze(-1)  # (B, T)
    term = term if log else term.exp()
    real = targets != {"pad_id": pad_id, "zero": 0, "nothing": -1}[ignore]  # no id is -1
    total = {
        "tokens": lambda: term[real].mean(),
        "sum": lambda: (term * real).sum(),
        "sentences": lambda: ((term * real).sum(1) / real.sum(1).clamp(min=1)).mean(),
        "positions": lambda: (term * real).sum() / real.numel(),
    }[mean]()
    return -total if minus else total


LOSS = Oracle.of(lab06.LOSS, "sequence_loss", oracle_sequence_loss)


def _loss_cases(g: torch.Generator) -> list[tuple[Tensor, Tensor, int]]:
    cases = []
    for _ in range(3):
        B, T, V = randint(2, 5, g), randint(2, 7, g), randint(4, 12, g)
        pad_id = randint(0, V - 1, g)
        logits = 3.0 * torch.randn(B, T, V, generator=g)
        targets = torch.randint(0, V, (B, T), generator=g)
        targets = torch.where(targets == pad_id, (targets + 1) % V, targets)
        lengths = torch.randint(1, T + 1, (B,), generator=g)
        targets[torch.arange(T)[None] >= lengths[:, None]] = pad_id
        cases.append((logits, targets, pad_id))
    return cases


hidden_check_sequence_loss = LOSS.hidden(
    "hidden_check_sequence_loss",
    _loss_cases,
    """Random sizes, lengths and padding ids against the float64 oracle.""",
)


def _large_logits(g: torch.Generator) -> list[tuple[Tensor, Tensor, int]]:
    moves = ((1.0, 1e4), (1.0, -1e4), (60.0, 0.0))  # (scale, shift) of each case's logits
    cases = zip(moves, _loss_cases(g), strict=True)
    return [(a * logits + b, targets, pad_id) for (a, b), (logits, targets, pad_id) in cases]


hidden_check_sequence_loss_numerics = LOSS.hidden(
    "hidden_check_sequence_loss_numerics",
    _large_logits,
    """Logits around +-1e4 and 60 times larger ones: a loss taken as the log of a softmax
    overflows or underflows there.""",
)


def hidden_check_translation_module(cls: type, seed: int = 0) -> None:
    """Another padding id, vocabulary and schedule."""
    g = generator(seed)
    pad_id = randint(3, 9, g)
    lab06.check_training_step(cls, pad_id=pad_id, vocab_size=12, seed=seed)
    lab06.check_validation_step(cls, pad_id=pad_id, vocab_size=12, seed=seed + 1)
    warmup = randint(5, 30, g)
    lr = (5e-4, 1e-3, 6e-3)[randint(0, 2, g)]
    lab06.check_configure_optimizers(
        cls, lr=lr, warmup_steps=warmup, total_steps=warmup + randint(40, 120, g), seed=seed
    )


def hidden_check_train_translator(fn: Callable[..., Any], session: Any, seed: int = 0) -> None:
    """Other numbers of steps and run names, in each precision (a hard-coded one fails)."""
    g = generator(seed)
    runs = [(precision, randint(4, 9, g)) for precision in ("32-true", "bf16-mixed")]
    lab06.check_train_translator(fn, session, runs=runs, name=f"hidden_{seed}")


def hidden_check_translator_greedy(
    model: nn.Module, datamodule: Any, seed: int = 0, *, min_exact_match: float = 0.9
) -> None:
    """Greedy decoding of 200 new sentences (none of the training set's) gets
    ``min_exact_match`` of them exactly right."""
    from transformer_lab.data.synthetic import draw_disjoint

    data = trusted_data(datamodule)
    fresh = draw_disjoint(data.draw(f"check {seed}"), 200, exclude=data.train_data)
    src, mask, tgt_out = (fresh[k] for k in ("src", "src_padding_mask", "tgt_out"))
    where = next(model.parameters()).device
    # Batched, the right loop run to its end (finished sentences padded), BOS dropped: (B, T).
    ids = (data.bos_id, data.eos_id, tgt_out.shape[1] + 1)  # BOS, then T tokens
    out = oracle_greedy_decode(model.eval(), src.to(where), *ids, mask.to(where), stop="never")
    predicted = out[:, 1:].long().cpu()  # (B, T)
    greedy_score = float((predicted == tgt_out).all(dim=1).float().mean())
    expect_true(
        greedy_score >= min_exact_match,
        f"decoded greedily, your translator gets {greedy_score:.1%} of {len(src)} new sentences "
        f"exactly right, at least {min_exact_match:.0%} expected: train longer or check the "
        "schedule.",
    )


@torch.no_grad()
def oracle_greedy_decode(
    model: nn.Module,
    src: Tensor,
    bos_id: int,
    eos_id: int,
    max_len: int,
    mask: Tensor | None = None,
    *,
    stop: str = "all",
    position: int = -1,
    keep_bos: bool = True,
    counts_bos: bool = True,
    use_mask: bool = True,
    fill: int | str = "pad",
) -> Tensor:
    """Greedy decoding, batched like a student's loop, finished sentences padded with
    ``model.config.pad_id``; with an option changed, a typical wrong loop (``fill``: ``"eos"``,
    an id, or ``"none"``: finished sentences go on)."""
    pad_id = {"pad": model.config.pad_id, "eos": eos_id}.get(fill, fill)
    mask = mask if use_mask else None
    memory = model.encode(src, mask)
    B = src.shape[0]
    ys = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    limit = max_len if counts_bos else max_len + 1
    while ys.shape[1] < limit:
        if {"all": done.all(), "first": done.any(), "never": False}[stop]:
            break
        nxt = model.decode(ys, memory, mask)[:, position].argmax(-1)
        if fill != "none":
            nxt = nxt.masked_fill(done, pad_id)
        ys = torch.cat([ys, nxt[:, None]], 1)
        done |= nxt == eos_id
    return ys if keep_bos else ys[:, 1:]


def _example(g: torch.Generator, B: int, S: int, max_len: int, **stand_in: Any) -> tuple[Any, ...]:
    """A case of ``greedy_decode``: a stand-in (``stand_in``: its vocabulary, special ids, seed,
    mode), ``B`` sources of ``S`` of its symbols, its BOS and EOS, ``max_len``, and the sources'
    padding mask of random lengths."""
    model = StandInTranslator(**stand_in)
    symbols = torch.tensor(model.symbols)
    src = symbols[torch.randint(0, len(symbols), (B, S), generator=g)]
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    mask = torch.arange(S)[None] < lengths[:, None]  # (B, S); junk symbols stay behind the mask
    return model, src, model.config.bos_id, model.config.eos_id, max_len, mask


DECODE = Oracle.of(lab06.DECODE, "greedy_decode", oracle_greedy_decode)


def hidden_check_greedy_decode(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """Scripted translators with other special ids and a random neural stand-in, vs the oracle."""
    g = generator(seed)
    cases = []
    for ids in ({}, {"pad_id": 5, "bos_id": 3, "eos_id": 8}):
        B, S = randint(2, 5, g), randint(3, 6, g)
        cases.append(_example(g, B, S, S + randint(2, 4, g), scripted=True, **ids))
    DECODE.judge(fn, [*cases, _example(g, 4, 5, 8, vocab_size=9, seed=seed)])


def hidden_check_greedy_decode_edges(fn: Callable[..., Tensor], seed: int = 0) -> None:
    """``max_len`` of 1 and 2, an immediate EOS, one sentence, no mask, padding id 7."""
    model, src, *_, mask = _example(generator(seed), 3, 4, 7, pad_id=7, scripted=True)
    empty = mask.clone()
    empty[1] = False  # a source with no real token: EOS at once
    cases = [
        (model, src, 1, 2, 1, mask),
        (model, src, 1, 2, 2, mask),
        (model, src, 1, 2, 7, empty),
        (model, src[:1], 1, 2, 7, mask[:1]),
        (model, src[:, :3], 1, 2, 6, None),
    ]
    DECODE.judge(fn, cases)


def fixtures() -> dict[str, dict[str, Any]]:
    """The stored examples of :mod:`transformer_lab.checks.lab06`, keyed by the call."""
    shifts = [(torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]]), 1), (torch.tensor([[9, 3, 2]]), 4)]
    out = SHIFT.fixtures("check_shift_right", shifts)
    g = generator(606)
    x, memory = torch.randn(2, 5, 16, generator=g), torch.randn(2, 7, 16, generator=g)
    layer = 16, 4, 32, random_weights(16, 32, generator(6), "self_attn", "cross_attn")
    blocks = [(*layer, x, memory, *masks) for masks in ((None, None), _masks(2, 5, 7, g))]
    out |= BLOCK.fixtures("check_decoder_block", blocks)
    g = generator(6006)
    losses = []
    for pad_id, rows in (
        (0, [[3, 4, 5, 2, 0], [6, 2, 0, 0, 0], [3, 3, 4, 6, 2]]),
        (5, [[0, 4, 1, 2, 5], [6, 2, 5, 5, 5]]),
    ):
        logits = 2.0 * torch.randn(len(rows), len(rows[0]), 7, generator=g)
        losses.append((torch.round(logits * 1e4) / 1e4, torch.tensor(rows), pad_id))
    out |= LOSS.fixtures("check_sequence_loss", losses)  # logits stored to 4 decimals
    src = torch.tensor([[4, 5, 6, 7], [8, 3, 9, 9], [5, 5, 3, 4]])
    mask = torch.tensor([[True] * 4, [True, True, False, False], [True, True, True, False]])
    decodes = [({}, src, 1, 2, max_len, mask) for max_len in (10, 3)]  # a scripted stand-in
    out |= DECODE.fixtures("check_greedy_decode", decodes)
    return out


__all__ = ["fixtures", *(n for n in dir() if n.startswith("hidden_check_"))]  # dir(): sorted

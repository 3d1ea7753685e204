"""Hidden checks of lab 05 (masked attention), their oracles and the visible checks' fixtures.

The oracles are written with Python loops over positions (the masks) and the shared float64
reference of masked attention (:mod:`~transformer_lab.grading.hidden._attention`, whose
catalogue names the attention mistakes); the masks' typical mistakes are listed here. The leak
detector is tried on sequence maps with known causality (GRUs, convolutions, attention, small
and early leaks), closures made inside the checks so that the ban on this module (refused
inside a ban, :mod:`transformer_lab.judge.bans`) does not reach them.

Reference: Prince, *Understanding Deep Learning* (2023), section 12.7.2; Vaswani et al.,
"Attention Is All You Need", NeurIPS 2017, section 3.2.3.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lab.checks import lab05
from transformer_lab.checks._attention import call_attention, expect_finite_gradients
from transformer_lab.checks._common import generator, randint
from transformer_lab.checks._generated import Oracle
from transformer_lab.checks.lab05 import (
    READS_AHEAD,
    SPEC,
    Probe,
    attention_example,
    expect_attention,
    judge_detector,
)
from transformer_lab.grading.hidden._attention import (
    attend64,
    attention_mistakes,
    distinct_mistakes,
    pair_entries,
)

__all__ = [
    "fixtures",
    "hidden_check_causal_mask",
    "hidden_check_combine_masks",
    "hidden_check_depends_on_future",
    "hidden_check_depends_on_future_subtle",
    "hidden_check_masked_attention",
    "hidden_check_masked_attention_dtypes",
    "hidden_check_padding_mask",
]


def oracle_causal_mask(T: int) -> Tensor:
    """``(T, T)`` bool: query ``t`` (row) may attend key ``s`` (column) when ``s <= t``."""
    rows = [[s <= t for s in range(T)] for t in range(T)]
    return torch.tensor(rows, dtype=torch.bool).reshape(T, T)


def oracle_padding_mask(lengths: Sequence[int], max_len: int) -> Tensor:
    """``(B, max_len)`` bool: position ``p`` of sequence ``b`` is real when ``p < lengths[b]``."""
    rows = [[p < int(n) for p in range(max_len)] for n in lengths]
    return torch.tensor(rows, dtype=torch.bool).reshape(len(rows), max_len)


def oracle_combine_masks(padding: Tensor, causal: Tensor) -> Tensor:
    """``(B, 1, T, T)`` bool: query ``t`` of sequence ``b`` may attend key ``s`` when ``s`` is a
    real token and ``causal[t, s]`` allows it (padding hides keys, never queries)."""
    B, T = padding.shape
    out = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for b in range(B):
        for t in range(T):
            for s in range(T):
                out[b, 0, t, s] = bool(padding[b, s]) and bool(causal[t, s])
    return out


def causal_mistakes(T: int) -> dict[str, Tensor]:
    """Hint -> the mask a typical wrong ``causal_mask(T)`` returns (at ``T = 2`` the mask one
    step ahead is all True, as 'nothing hidden': the other sizes tell them apart)."""
    t = torch.arange(T)[:, None]  # (T, 1): queries in rows
    s = torch.arange(T)[None, :]  # (1, T): keys in columns
    good = oracle_causal_mask(T)
    return {
        SPEC.mistake("causal causal_upper").hint: s >= t,
        "Your mask is one step ahead: query t may also attend key t+1, the next token "
        "(s <= t + 1, torch.tril(..., diagonal=1)). Allow key s <= query t only "
        "(diagonal=0).": s <= t + 1,
        "Your mask leaves out the diagonal: a token may attend to itself. Allow key "
        "s <= query t, not s < t (torch.tril with the default diagonal=0).": s < t,
        "Your mask is inverted: True must mean *may attend* (as in "
        "F.scaled_dot_product_attention), so the diagonal and the past are True and the "
        "future False.": s > t,
        "Every entry of your mask is True: nothing is hidden. Query t may attend keys "
        "0..t only.": torch.ones(T, T, dtype=torch.bool),
        "Every entry of your mask is False: query t may attend keys 0..t, its own "
        "position included.": torch.zeros(T, T, dtype=torch.bool),
        "Your mask has an extra leading axis: return (T, T); batch and head axes come "
        "later, from broadcasting.": good[None],
    }


def padding_mistakes(lengths: Sequence[int], max_len: int) -> dict[str, Tensor]:
    """Hint -> the mask a typical wrong ``padding_mask(lengths, max_len)`` returns."""
    n = torch.tensor([int(x) for x in lengths])[:, None]  # (B, 1)
    p = torch.arange(max_len)[None, :]  # (1, T)
    good = oracle_padding_mask(lengths, max_len)
    longest = int(n.max()) if n.numel() else 0
    return {
        "Your mask is True at the padding: True marks the real tokens (the keys attention may "
        "use), False the padding.": p >= n,
        "Your mask has one real token too many: a sequence of length L has real tokens at "
        "positions 0..L-1, so use positions < L, not <=.": p <= n,
        "Your positions start at 1: count them from 0, so that a sequence of length L has "
        "exactly L True entries.": p + 1 < n,
        "Your True entries are at the end of each row (left padding): these sequences are "
        "right-padded, real tokens first and padding after.": p >= max_len - n,
        "Every entry of your mask is True: the lengths are ignored.": torch.ones(
            len(lengths), max_len, dtype=torch.bool
        ),
        "Your mask is transposed: return (B, max_len), one row per sequence.": good.T,
        "Your mask has max(lengths) columns, not max_len: the batch is padded to max_len, so "
        "build the positions with torch.arange(max_len).": p[:, :longest] < n,
    }


_PADDED_QUERIES = (
    "Your padding hides the rows of padded queries, which leaves them nothing to attend (fully "
    "masked rows: NaN with a -inf fill). Padding hides keys (columns) only, padding[:, None, "
    "None, :]: a query at a padded position still attends to the real tokens before it, and "
    "the loss ignores its output."
)


def combine_mistakes(padding: Tensor, causal: Tensor) -> dict[str, Tensor]:
    """Hint -> the mask a typical wrong ``combine_masks(padding, causal)`` returns."""
    B, T = padding.shape
    keys = padding[:, None, None, :]  # (B, 1, 1, T): padding over keys
    queries = padding[:, None, :, None]  # (B, 1, T, 1): padding over queries
    c = causal[None, None]  # (1, 1, T, T)
    own_causal = torch.ones(T, T, dtype=torch.bool).tril()
    good = oracle_combine_masks(padding, causal)
    # Padding over queries hides the padded keys too under any mask with s <= t: one hint.
    return distinct_mistakes(
        good,
        {
            "You combined the masks with | (or): a key may be attended only when BOTH masks "
            "allow it, so combine them with & (and).": keys | c,
            _PADDED_QUERIES: queries & c,
            _PADDED_QUERIES + " (Yours hides the padded keys too.)": queries & keys & c,
            "Your mask has no head axis: return (B, 1, T, T), so that it broadcasts over the "
            "heads of (B, H, T, T) scores.": (keys & c)[:, 0],
            "Your head axis is in the wrong place: the shape is (B, 1, T, T), batch first, "
            "then a head axis of size 1.": (keys & c)[:, 0][None],
            "Your mask ignores the padding: padded keys must be hidden from every query.": (
                c.expand(B, 1, T, T)
            ),
            "Your mask ignores the causal mask: the future must stay hidden too.": keys.expand(
                B, 1, T, T
            ),
            "Your padding mask is inverted: padding is True at the real tokens, so keep the "
            "keys where it is True.": ~keys & c,
            "Your causal part is transposed: causal[t, s] has queries t in rows and keys s in "
            "columns, and so does the result.": keys & c.transpose(-2, -1),
            "Your mask ignores the `causal` argument and builds its own lower triangle: use the "
            "mask you are given (it may be any (T, T) mask, e.g. a local window).": keys
            & own_causal[None, None],
        },
    )


CAUSAL = Oracle(lab05.CAUSAL, oracle_causal_mask, causal_mistakes)
PADDING = Oracle(lab05.PADDING, oracle_padding_mask, padding_mistakes)
COMBINE = Oracle(lab05.COMBINE, oracle_combine_masks, combine_mistakes)


hidden_check_causal_mask = CAUSAL.hidden(
    "hidden_check_causal_mask",
    lambda g: [(randint(3, 12, g),), (2,), (randint(13, 40, g),), (64,)],
    """Random sizes (seeded), a two-token and a long sequence, against the loop oracle.""",
)


def _padding_batches(g: torch.Generator) -> list[tuple[Sequence[int] | Tensor, int]]:
    cases: list[tuple[Sequence[int] | Tensor, int]] = []
    for kind in ("int64", "int32", "list"):
        B, max_len = randint(2, 6, g), randint(3, 12, g)
        lengths = [randint(0, max_len, g) for _ in range(B)]
        lengths[0], lengths[-1] = max_len, 0
        as_given = lengths if kind == "list" else torch.tensor(lengths, dtype=getattr(torch, kind))
        cases.append((as_given, max_len))
    return [*cases, (torch.tensor([2]), 7)]  # one sequence, max(lengths) < max_len


hidden_check_padding_mask = PADDING.hidden(
    "hidden_check_padding_mask",
    _padding_batches,
    """Random batches: empty and full sequences, int64 and int32 tensors, Python lists.""",
)


def _combine_batches(g: torch.Generator) -> list[tuple[Tensor, Tensor]]:
    cases = []
    for _ in range(2):
        B, T = randint(2, 5, g), randint(3, 9, g)
        lengths = [randint(1, T, g) for _ in range(B)]
        lengths[0] = T
        cases.append((oracle_padding_mask(lengths, T), oracle_causal_mask(T)))
    window = torch.tensor([[t - 2 <= s <= t for s in range(6)] for t in range(6)])  # (T, T)
    return [*cases, (oracle_padding_mask([6, 4, 0], 6), window)]


hidden_check_combine_masks = COMBINE.hidden(
    "hidden_check_combine_masks",
    _combine_batches,
    """Random batches with the causal mask, and a local-window mask the function must use
    (each query sees itself and the 2 keys before it).""",
)


def _expect_attention(fn: Callable[..., Any], *inputs: Any, tol: float = 1e-4) -> None:
    """``inputs``: ``q, k, v, mask, described`` against the oracle and the shared catalogue."""
    *qkv_mask, described = inputs
    wanted = attend64(*qkv_mask), attention_mistakes(*qkv_mask)
    expect_attention(fn, tuple(qkv_mask), described, *wanted, tol=tol)


def _random_case(
    g: torch.Generator,
    lead: tuple[int, ...],
    kind: str,
    *,
    scale: float = 1.0,
    push: tuple[float, float] = (0.0, 3.0),
) -> tuple[Tensor, Tensor, Tensor, Tensor, str]:
    """Inputs with a ``"causal"`` ``(T, T)``, ``"padding"`` (``(B, 1[, 1], S)``) or ``"random"``
    mask (the scores' shape, an empty row). An extra feature adds ``scale * push[0]`` to the
    scores of allowed keys and ``scale * push[1]`` to hidden ones (times the position under a
    causal mask): by default the hidden keys score highest. ``T != S`` except when causal."""
    T, S, dk, dv = randint(2, 6, g), randint(3, 8, g), randint(2, 6, g), randint(2, 5, g)
    if kind == "causal":
        S = T
    q = torch.randn(*lead, T, dk, generator=g) * scale
    k = torch.randn(*lead, S, dk, generator=g) * scale
    v = torch.randn(*lead, S, dv, generator=g)
    hidden = torch.zeros(*lead, S)  # how much each key's score is pushed up
    if kind == "causal":
        mask = oracle_causal_mask(T)  # (T, S)
        hidden = hidden + torch.arange(S, dtype=torch.float32)
        described = f"the causal ({T}, {T}) mask"
    elif kind == "padding":
        lengths = [randint(1, S, g) for _ in range(lead[0])]
        lengths[-1] = max(1, S - 2)
        real = oracle_padding_mask(lengths, S)  # (B, S)
        mask = real.reshape(lead[0], *([1] * len(lead)), S)  # (B, 1, S) or (B, 1, 1, S)
        hidden = hidden + (~real).float().reshape(lead[0], *([1] * (len(lead) - 1)), S)
        described = f"a key padding mask of shape {tuple(mask.shape)} (lengths {lengths})"
    else:
        mask = torch.rand(*lead, T, S, generator=g) < 0.6
        mask[..., 0, :] = False  # a query with nothing to attend
        mask[..., -1, 0] = True
        described = f"a random mask of shape {tuple(mask.shape)} with an empty row"
    hidden = push[0] + (push[1] - push[0]) * hidden
    q = torch.cat([q, torch.full((*lead, T, 1), 2.0 * scale)], dim=-1)  # (..., T, dk + 1)
    k = torch.cat([k, scale * hidden[..., None]], dim=-1)  # (..., S, dk + 1)
    return q, k, v, mask, described


def hidden_check_masked_attention(fn: Callable[..., Any], seed: int = 0) -> None:
    """Random shapes (T != S, key != value), masks of every broadcast shape, large scores."""
    g = generator(seed)
    for lead, kind in (
        ((), "causal"),
        ((3,), "padding"),
        ((2, 3), "causal"),
        ((2, 2), "padding"),
        ((2, 3), "random"),
        ((4,), "random"),
    ):
        _expect_attention(fn, *_random_case(g, lead, kind))
    q, k, v, mask, described = _random_case(g, (2, 2), "padding")
    _expect_attention(fn, q.double(), k.double(), v.double(), mask, described)
    # Padded keys scoring some 100 above the real ones: exp of the real scores underflows.
    q, k, v, mask, described = _random_case(g, (2, 2), "padding", push=(0.0, 150.0))
    _expect_attention(fn, q, k, v, mask, described + ", the padding scoring ~100 higher")
    # Real scores far below -1e4 (the padding lower still): a fill of -1e4 is not very negative.
    q, k, v, mask, described = _random_case(g, (2, 2), "padding", scale=100.0, push=(-6.0, -12.0))
    _expect_attention(
        fn, q, k, v, mask, described + ", scores in the tens of thousands below 0", tol=1e-3
    )


def hidden_check_masked_attention_dtypes(fn: Callable[..., Any], seed: int = 0) -> None:
    """float16 and bfloat16 (the fill value), and finite gradients through an empty row."""
    g = generator(seed)
    for dtype, tol in ((torch.float16, 1e-2), (torch.bfloat16, 5e-2)):
        for lead, kind in (((2, 2), "padding"), ((3,), "random"), ((2, 2), "causal")):
            q, k, v, mask, described = _random_case(g, lead, kind, scale=0.5)
            _expect_attention(fn, q.to(dtype), k.to(dtype), v.to(dtype), mask, described, tol=tol)
    q, k, v, mask, described = _random_case(g, (2, 2), "random")
    what = f"masked_attention(q, k, v, mask) with {described} (backward pass)"
    expect_finite_gradients(
        lambda *qkv: call_attention(fn, *qkv, mask, what, ban=lab05.ATTENTION_BAN), q, k, v, what
    )


_SMALL = (
    "The leak here is small (1e-3 of the input), but a leak of any size lets training cheat. "
    "Compare exactly (torch.equal) or with a tolerance far below it (torch.allclose's "
    "defaults), not atol=1e-2, and make the change to the future inputs of order 1."
)


def _probes(g: torch.Generator, D: int) -> list[Probe]:
    """Sequence maps with known causality on ``(B, T, D)`` inputs (closures over torch modules)."""
    with torch.random.fork_rng(devices=[]):  # seeded modules; the notebook's RNG untouched
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=g)))
        gru = nn.GRU(D, 5, batch_first=True)
        bigru = nn.GRU(D, 3, batch_first=True, bidirectional=True)
        conv = nn.Conv1d(D, 4, kernel_size=3)
        centred = nn.Conv1d(D, 4, kernel_size=3, padding=1)
        head = nn.Linear(D, 7)
    return [
        Probe("a GRU", lambda x: gru(x)[0], False),
        Probe(
            "a causal convolution (padded on the left)",
            lambda x: conv(F.pad(x.transpose(1, 2), (2, 0))).transpose(1, 2),
            False,
        ),
        Probe(
            "F.scaled_dot_product_attention(x, x, x, is_causal=True)",
            lambda x: F.scaled_dot_product_attention(x, x, x, is_causal=True),
            False,
        ),
        Probe("a linear layer to 7 outputs per position", head, False),
        Probe(
            "an exponential moving average over time",
            lambda x: torch.stack(
                [sum(0.5 ** (t - j) * x[:, j] for j in range(t + 1)) for t in range(x.shape[1])],
                dim=1,
            ),
            False,
        ),
        Probe("a two-way GRU", lambda x: bigru(x)[0], True),
        Probe(
            "a centred convolution (kernel 3, padding 1)",
            lambda x: centred(x.transpose(1, 2)).transpose(1, 2),
            True,
            READS_AHEAD,
        ),
        Probe(
            "F.scaled_dot_product_attention(x, x, x) without a mask",
            lambda x: F.scaled_dot_product_attention(x, x, x),
            True,
        ),
        Probe(
            "a map where output t also reads input t+2",
            lambda x: x + F.pad(x[:, 2:], (0, 0, 0, 2)),
            True,
            READS_AHEAD,
        ),
    ]


def hidden_check_depends_on_future(fn: Callable[..., Any], seed: int = 0) -> None:
    """GRUs, convolutions and attention, causal or not, on random ``(B, T, D)`` inputs."""
    g = generator(seed)
    B, T, D = randint(2, 4, g), randint(5, 8, g), randint(2, 5, g)
    x = torch.randn(B, T, D, generator=g)
    judge_detector(fn, _probes(g, D), x)


def hidden_check_depends_on_future_subtle(fn: Callable[..., Any], seed: int = 0) -> None:
    """Small leaks, leaks near the start only, one sequence, ``(B, T)`` inputs, large values."""
    g = generator(seed)
    B, T, D = randint(2, 3, g), randint(6, 9, g), randint(2, 4, g)
    x = torch.randn(B, T, D, generator=g)
    lookahead = randint(2, 3, g)

    judge_detector(
        fn,
        [
            Probe("(lambda x: x.flip(1))", lambda z: z.flip(1), True),
            Probe(
                "a map with a 1e-3 leak (x + 1e-3 * x.flip(1))",
                lambda z: z + 1e-3 * z.flip(1),
                True,
                _SMALL,
            ),
            Probe("(lambda x: 1000 * x.cumsum(dim=1))", lambda z: 1000.0 * z.cumsum(dim=1), False),
            Probe(
                f"a map where output 0 also reads input {lookahead}",
                lambda z: torch.cat([z[:, :1] + z[:, lookahead : lookahead + 1], z[:, 1:]], dim=1),
                True,
                READS_AHEAD,
            ),
        ],
        x,
    )
    judge_detector(
        fn,
        [
            Probe("x.cumsum(dim=1) on one sequence", lambda z: z.cumsum(dim=1), False),
            Probe(
                "a map where the second-to-last output reads the last input",
                lambda z: torch.cat([z[:, :-2], z[:, -2:-1] + z[:, -1:], z[:, -1:]], dim=1),
                True,
                "Only output T-2 reads ahead here (it also reads input T-1): check every cut "
                "t = 0 .. T-2, every output up to t, not only the first output.",
            ),
        ],
        x[:1],
    )
    tokens = torch.randn(B, T, generator=g)  # (B, T): one number per position
    judge_detector(
        fn,
        [
            Probe("(lambda x: x.cumsum(dim=1)) on (B, T) inputs", lambda z: z.cumsum(dim=1), False),
            Probe("(lambda x: x.flip(1)) on (B, T) inputs", lambda z: z.flip(1), True),
        ],
        tokens,
    )


def fixtures() -> dict[str, dict[str, Any]]:
    """The stored examples of :mod:`transformer_lab.checks.lab05`, keyed by the call."""
    out = CAUSAL.fixtures("check_causal_mask", [(4,), (1,), (7,)])
    lengths = [3, 1, 5, 0]  # as a tensor, then as a list (the stored flag)
    out |= PADDING.fixtures(
        "check_padding_mask", [(lengths, 6, True), (lengths, 6, False), ([2, 0], 3, True)]
    )
    combine = [
        (oracle_padding_mask(n, T), oracle_causal_mask(T)) for n, T in (([4, 2], 4), ([5, 3, 1], 5))
    ]
    out |= COMBINE.fixtures("check_combine_masks", combine)
    for name in ("causal", "padded"):
        q, k, v, mask, _ = attention_example(name)
        want = attend64(q, k, v, mask)
        key = f"masked_attention example {name!r}"
        out |= pair_entries(key, want, attention_mistakes(q, k, v, mask))
    return out

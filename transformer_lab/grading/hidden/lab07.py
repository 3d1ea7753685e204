"""Hidden checks of lab 07: per part an :class:`~transformer_lab.checks._generated.Oracle` (the
oracle, independent of the kit, with keyword options; a mistake's output is the oracle run with
the options its spec record gives); :func:`fixtures`, the visible checks' worked examples.
Sennrich et al. 2016; Holtzman et al. 2020.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from transformer_lab.checks import lab07
from transformer_lab.checks._common import call_forbidding, generator, randint
from transformer_lab.checks._generated import record_oracle
from transformer_lab.checks.lab07 import END_OF_WORD, SPECIALS, RandomStepFn, TableStepFn

UNK = SPECIALS.index("<unk>")
RHYME = (
    "a sailor went to sea sea sea to see what he could see see see but all that he could see "
    "see see was the bottom of the deep blue sea sea sea"
)
# Sennrich et al.'s example corpus: low x5, lower x2, newest x6, widest x3.
WORDS = " ".join(["low"] * 5 + ["lower"] * 2 + ["newest"] * 6 + ["widest"] * 3)
_DTYPES = (torch.float32, torch.float64, torch.float32)  # of three random batches of logits


def oracle_char_vocab(text: str) -> list[str]:
    """Every token, in id order: the specials, then the distinct characters by code point."""
    return list(SPECIALS) + sorted(set(text))


def oracle_char_encode(
    fit_text: str, text: str, *, seen: bool = False, specials: str = "first", drop: bool = False
) -> list[int]:
    """Ids of ``text`` for a tokenizer fitted on ``fit_text`` (unknown characters -> <unk>);
    options: characters in the order first seen, the specials ``"none"`` or ``"last"``, unknown
    characters dropped."""
    chars = list(dict.fromkeys(fit_text)) if seen else sorted(set(fit_text))
    start = 4 if specials == "first" else 0  # "none": no specials; "last": after the characters
    unk = UNK + len(chars) if specials == "last" else UNK
    return [chars.index(c) + start if c in chars else unk for c in text if c in chars or not drop]


def oracle_char_decode(
    fit_text: str, ids: Sequence[int], *, drop_specials: bool = False, sep: str = ""
) -> str:
    """Text of ``ids``: characters as themselves, specials by name (options: specials dropped,
    another separator)."""
    vocab = oracle_char_vocab(fit_text)
    return sep.join(vocab[i] for i in ids if i >= 4 or not drop_specials)


CHAR_ENCODE = record_oracle(lab07.CHAR_ENCODE, lab07.SPEC, "CharTokenizer", oracle_char_encode)
CHAR_DECODE = record_oracle(lab07.CHAR_DECODE, lab07.SPEC, "CharTokenizer", oracle_char_decode)
_ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'-\néèüßçñΩλ中文😀\t"
)


def _random_text(g: torch.Generator, letters: str, length: int) -> str:
    picks = torch.randint(0, len(letters), (length,), generator=g).tolist()
    return "".join(letters[i] for i in picks)


def hidden_check_char_tokenizer(cls: Callable[..., Any], seed: int = 0) -> None:
    """Random texts over random alphabets (accents, CJK, emoji, tabs): encode (unseen characters
    too) and decode (random ids, the text's own ids)."""
    g = generator(seed)
    encodes, decodes = [], []
    for _ in range(3):
        order = torch.randperm(len(_ALPHABET), generator=g).tolist()
        letters = "".join(_ALPHABET[i] for i in order[: randint(5, 30, g)])
        fit_text = _random_text(g, letters, randint(20, 200, g))
        unseen = _random_text(g, _ALPHABET, randint(5, 40, g))
        encodes += [(fit_text, fit_text), (fit_text, unseen)]
        size = len(oracle_char_vocab(fit_text))
        ids = torch.randint(0, size, (randint(3, 30, g),), generator=g).tolist()
        decodes += [(fit_text, ids), (fit_text, oracle_char_encode(fit_text, fit_text))]
    toks = lab07.fitted_tokenizers(cls, [fit_text for fit_text, _ in encodes])
    CHAR_ENCODE.judge(toks, encodes)
    CHAR_DECODE.judge(toks, decodes)


def hidden_check_char_tokenizer_edges(cls: Callable[..., Any], seed: int = 0) -> None:
    """Fitting again, empty texts, repeated characters, decoding every special."""
    g = generator(seed)
    first = _random_text(g, "abcdefgh", 30)
    second = _random_text(g, "xyz ", 12)
    tok = lab07.fitted_tokenizers(cls, [first])[first]
    what = f"CharTokenizer().fit({first!r}).fit({second!r})"
    call_forbidding(tok.fit, (second,), {}, ban=lab07.TOKENIZER_BAN, what=what)
    lab07.expect_vocab_size(tok, second, what)
    toks = {second: tok, **lab07.fitted_tokenizers(cls, ["aaaa", "zy x"])}
    encodes = [(second, second + "a"), ("aaaa", "aaaa"), ("aaaa", ""), ("aaaa", "ab")]
    CHAR_ENCODE.judge(toks, [*encodes, ("zy x", "")])
    CHAR_DECODE.judge(toks, [("zy x", []), ("zy x", [0, 1, 4, 5, 6, 7, 3, 2])])


def _fuse(symbols: Sequence[str], pair: tuple[str, str], *, how: str = "all") -> tuple[str, ...]:
    """``symbols`` with ``pair`` merged ``"all"`` left to right, ``"first"`` only, or ``"rtl"``."""
    seq = list(symbols)
    scan = range(len(seq) - 2, -1, -1) if how == "rtl" else range(len(seq) - 1)
    taken: list[int] = []  # where the pair is merged: no two occurrences overlap
    for i in scan:
        if tuple(seq[i : i + 2]) == tuple(pair) and not (taken and abs(i - taken[-1]) < 2):
            taken.append(i)
            if how == "first":
                break
    for i in sorted(taken, reverse=True):
        seq[i : i + 2] = [pair[0] + pair[1]]
    return tuple(seq)


def _pair_counts(
    corpus: Mapping[tuple[str, ...], int], *, overlap: bool = True, weighted: bool = True
) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for symbols, freq in corpus.items():
        weight = freq if weighted else 1
        i = 0
        while i < len(symbols) - 1:
            pair = (symbols[i], symbols[i + 1])
            counts[pair] = counts.get(pair, 0) + weight
            # Counted without overlaps, "a a a" holds (a, a) once: skip the pair just counted.
            i += 1 if overlap or symbols[i] != symbols[i + 1] else 2
    return counts


#: How a tie between equally frequent pairs is broken: the smallest pair (right), or wrongly.
_TIE_BREAKS: dict[str, Callable[[list[tuple[str, str]]], tuple[str, str]]] = {
    "min": min,
    "first": lambda tied: tied[0],
    "max": max,
    "concat": lambda tied: min(tied, key=lambda p: (p[0] + p[1], p)),
}


def oracle_bpe_train(
    text: str,
    num_merges: int,
    *,
    boundary: str = "word",
    tie: str = "min",
    overlap: bool = True,
    eow: bool = True,
    weighted: bool = True,
    merge: str = "all",
) -> list[tuple[str, str]]:
    """BPE training (the options make the mistakes)."""
    end = (END_OF_WORD,) if eow else ()
    if boundary == "word":  # each distinct word's symbols (</w> last) -> how often it occurs
        corpus: dict[tuple[str, ...], int] = Counter((*word, *end) for word in text.split())
    else:  # one sequence: the text with its spaces, or the words (and </w>) run together
        chain = (
            list(text.strip())
            if boundary == "text"
            else [s for word in text.split() for s in (*word, END_OF_WORD)]
        )
        corpus = {tuple(chain): 1} if chain else {}
    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        counts = _pair_counts(corpus, overlap=overlap, weighted=weighted)
        if not counts:
            break
        top = max(counts.values())
        merges.append(_TIE_BREAKS[tie]([pair for pair, c in counts.items() if c == top]))
        corpus = {_fuse(s, merges[-1], how=merge): c for s, c in corpus.items()}
    return merges


def oracle_bpe_encode(
    text: str,
    merges: Sequence[tuple[str, str]],
    *,
    order: str = "rank",
    how: str = "all",
    until_done: bool = True,
    eow: bool = True,
    whole_text: bool = False,
    keep_eow: bool = True,
) -> list[str]:
    """BPE encoding (the options make the mistakes)."""
    rank = {tuple(pair): r for r, pair in reversed(list(enumerate(merges)))}  # the first's rank
    end = [END_OF_WORD] if eow else []
    units = [[*text]] if whole_text else [[*word, *end] for word in text.split()]
    pieces: list[str] = []
    for symbols in units:
        if order == "longest":
            symbols = _longest_match(symbols, merges)
        elif order != "rank":  # each merge once, in the list's order or reversed
            for pair in merges if order == "list" else reversed(merges):
                symbols = list(_fuse(symbols, tuple(pair), how=how))
        else:
            while len(symbols) > 1:
                adjacent = [(symbols[i], symbols[i + 1]) for i in range(len(symbols) - 1)]
                present = [(rank[pair], pair) for pair in adjacent if pair in rank]
                if not present:
                    break
                symbols = list(_fuse(symbols, min(present)[1], how=how))
                if not until_done:
                    break
        pieces += symbols
    if not keep_eow:
        pieces = [p.removesuffix(END_OF_WORD) for p in pieces if p != END_OF_WORD]
    return pieces


def _longest_match(symbols: list[str], merges: Sequence[tuple[str, str]]) -> list[str]:
    """Greedy longest match against the merged pieces."""
    known = {a + b for a, b in merges}
    out: list[str] = []
    while symbols:
        j = next(j for j in range(len(symbols), 0, -1) if "".join(symbols[:j]) in known or j == 1)
        out.append("".join(symbols[:j]))
        symbols = symbols[j:]
    return out


BPE_TRAIN = record_oracle(lab07.BPE_TRAIN, lab07.SPEC, "bpe_train", oracle_bpe_train)
BPE_ENCODE = record_oracle(lab07.BPE_ENCODE, lab07.SPEC, "bpe_encode", oracle_bpe_encode)


def _random_words(g: torch.Generator, letters: str, n_words: int, longest: int = 7) -> str:
    vocab = [_random_text(g, letters, randint(1, longest, g)) for _ in range(max(3, n_words // 3))]
    picks = torch.randint(0, len(vocab), (n_words,), generator=g).tolist()
    seps = [" ", " ", " ", "  ", "\n", "\t"]
    return "".join(vocab[i] + seps[randint(0, len(seps) - 1, g)] for i in picks)


def _random_texts(g: torch.Generator) -> list[tuple[str, int]]:
    alphabets = ("abc", "abcde", "lowerstn")
    return [(_random_words(g, a, randint(15, 60, g)), randint(5, 40, g)) for a in alphabets]


hidden_check_bpe_train = BPE_TRAIN.hidden(
    "hidden_check_bpe_train",
    _random_texts,
    """Random texts (small alphabets: many ties; tabs and newlines), 5 to 40 merges.""",
)


def _train_edges(g: torch.Generator) -> list[tuple[str, int]]:
    fixed = [("low lower", 0), ("", 5), ("   \n ", 3), ("ab ab ba", 20), ("a b c a", 4)]
    fixed += [("aaaa aaa aa", 6), ("zy zy zy ab abc abc", 5), ("abc az az abc bc", 4)]
    return [*fixed, (RHYME, 25), (_random_words(g, "ab", 40, longest=9), 30)]


hidden_check_bpe_train_edges = BPE_TRAIN.hidden(
    "hidden_check_bpe_train_edges",
    _train_edges,
    """No merges, empty texts, more merges than pairs, one-letter words, ties, the rhyme.""",
)


def _learned(g: torch.Generator) -> list[tuple[str, list[tuple[str, str]]]]:
    cases = []
    for letters in ("abc", "abcde", "lowerstn"):
        text = _random_words(g, letters, randint(20, 60, g))
        merges = oracle_bpe_train(text, randint(5, 40, g))
        cases += [(text, merges), (_random_words(g, letters + "xy", 12), merges)]
    return cases


hidden_check_bpe_encode = BPE_ENCODE.hidden(
    "hidden_check_bpe_encode",
    _learned,
    """Merges learned on random texts, applied to the texts and to new words.""",
)


def _encode_edges(g: torch.Generator) -> list[tuple[str, list[tuple[str, str]]]]:
    rhyme = oracle_bpe_train(RHYME, 30)
    cases = [("", oracle_bpe_train(RHYME, 5)), ("to sea", [])]
    cases += [("aaaa aaaaa a", oracle_bpe_train("aaaa aaa aa", 6))]
    cases += [("the sailors saw seven seas, what a sight!", rhyme), ("Zoë   sees\tthe sea", rhyme)]
    text = _random_words(g, "ab", 40, longest=9)
    return [*cases, (_random_words(g, "ab", 15, longest=12), oracle_bpe_train(text, 30))]


hidden_check_bpe_encode_edges = BPE_ENCODE.hidden(
    "hidden_check_bpe_encode_edges",
    _encode_edges,
    """No merges, an empty text, repeated letters, unseen characters, the rhyme's merges.""",
)


def _float64(logits: Tensor) -> Tensor:
    return logits.detach().to("cpu", torch.float64)


def oracle_apply_temperature(
    logits: Tensor, t: float, *, times: bool = False, then: str = ""
) -> Tensor:
    """``logits / t`` in float64 (options: ``logits * t``; a softmax or log-softmax after)."""
    x = _float64(logits) * t if times else _float64(logits) / t
    return getattr(torch, then)(x, dim=-1) if then else x


def oracle_top_k_filter(
    logits: Tensor, k: int, *, more: int = 0, smallest: bool = False, fill: float = -math.inf
) -> Tensor:
    """Every logit >= the k-th largest of its row kept (ties too), the others ``-inf``
    (options: ``k + more`` kept, the smallest kept, another ``fill``)."""
    x = _float64(logits)
    y = -x if smallest else x
    kth = y.sort(dim=-1, descending=True).values[..., min(k + more, x.shape[-1]) - 1, None]
    return x.masked_fill(y < kth, fill)  # kth: (..., 1)


def oracle_top_p_filter(
    logits: Tensor, p: float, *, how: str = "crossing", ties: str = "low"
) -> Tensor:
    """Top-p in float64: keep while the mass before is < p, equal probabilities by lower id
    first (the options make the mistakes)."""
    x = _float64(logits)
    if p >= 1.0 and how == "crossing":  # p = 1 keeps every token, whatever the sums round to
        return x.clone()
    probs = torch.softmax(x, dim=-1)
    n = x.shape[-1]
    order = torch.arange(n).expand(x.shape)  # token ids in the order they are cumulated
    if how != "unsorted" and ties == "low":
        order = probs.sort(dim=-1, descending=True, stable=True).indices
    elif how != "unsorted":  # higher ids first among ties: sort the flipped row
        order = n - 1 - probs.flip(-1).sort(dim=-1, descending=True, stable=True).indices
    values = probs.gather(-1, order)
    before = values.cumsum(dim=-1).roll(1, dims=-1)  # the mass before each token ...
    before[..., 0] = 0.0  # ... none before the first
    keep = before + values <= p if how == "drop" else before < p
    keep[..., 0] = True  # the most likely token always stays
    return x.masked_fill(~keep.scatter(-1, order, keep), -math.inf)


TEMPERATURE = record_oracle(
    lab07.TEMPERATURE, lab07.SPEC, "apply_temperature", oracle_apply_temperature
)
TOP_K = record_oracle(lab07.TOP_K, lab07.SPEC, "top_k_filter", oracle_top_k_filter)
TOP_P = record_oracle(lab07.TOP_P, lab07.SPEC, "top_p_filter", oracle_top_p_filter)


def _random_logits(g: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    return (2.0 * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)


def _batches(g: torch.Generator, *shapes: tuple[int, ...]) -> list[Tensor]:
    """Random logits of the three ``shapes``, of the three :data:`_DTYPES`."""
    return [_random_logits(g, shape, dtype) for shape, dtype in zip(shapes, _DTYPES, strict=True)]


def _expect_value_error(fn: Callable[..., Any], name: str, logits: Tensor, bad: float) -> None:
    """``fn(logits, bad)`` (``name``) must raise ValueError."""
    try:
        call_forbidding(fn, (logits, bad), {}, ban=lab07.DECODING_BAN, what=name)
    except AssertionError as exc:
        if "ValueError" in str(exc):
            return
        raise
    raise AssertionError(
        f"{name} returned; it should raise ValueError (t > 0, k >= 1, 0 < p <= 1)."
    )


def hidden_check_apply_temperature(fn: Callable[..., Any], seed: int = 0) -> None:
    """Random batches, ``-inf`` entries, ``t = 1``; ``t <= 0`` raises ValueError."""
    g = generator(seed)
    cases = list(zip(_batches(g, (7,), (3, 11), (2, 3, 6)), (0.3, 1.7, 0.9), strict=True))
    for x, _ in cases:
        x[..., 1] = -math.inf
    logits = _random_logits(g, (2, 5), torch.float32)
    TEMPERATURE.judge(fn, [*cases, (logits, 1.0)])
    for bad in (0.0, -1.0):
        _expect_value_error(fn, f"apply_temperature(logits, t={bad})", logits, bad)


def _tied_rows(g: torch.Generator) -> list[tuple[Tensor, int]]:
    cases = []
    for shape, dtype in zip(((9,), (4, 13), (2, 3, 7)), _DTYPES, strict=True):
        logits = _random_logits(g, shape, dtype)
        # Round every other logit to a whole number, so that ties happen at the k-th value.
        logits[..., ::2] = logits[..., ::2].round()
        cases.append((logits, randint(1, shape[-1] - 1, g)))
    return cases


hidden_check_top_k_filter = TOP_K.hidden(
    "hidden_check_top_k_filter",
    _tied_rows,
    """Random batches (float32, float64, three dims) with several ``k``; rows with ties.""",
)


def hidden_check_top_k_filter_edges(fn: Callable[..., Any], seed: int = 0) -> None:
    """``k`` >= the vocabulary, ``k = 1``, ``-inf``, equal logits; ``k < 1`` raises ValueError."""
    logits = _random_logits(generator(seed), (3, 6), torch.float32)
    logits[0, 2] = -math.inf
    logits[1] = 0.5
    TOP_K.judge(fn, [(logits, k) for k in (6, 9, 1, 3)])
    _expect_value_error(fn, "top_k_filter(logits, k=0)", logits, 0)


def _safe_p(g: torch.Generator, logits: Tensor) -> float:
    """A ``p`` at least 0.01 away from every running mass of every row, sorted or not."""
    probs = torch.softmax(_float64(logits), dim=-1)
    masses = torch.cat([probs.sort(dim=-1, descending=True).values.cumsum(-1), probs.cumsum(-1)])
    for _ in range(100):
        p = 0.15 + 0.8 * float(torch.rand((), generator=g))
        if bool(((masses - p).abs() > 0.01).all()):
            return round(p, 3)
    return 0.5


def _nuclei(g: torch.Generator) -> list[tuple[Tensor, float]]:
    return [(x, _safe_p(g, x)) for x in _batches(g, (10,), (4, 12), (2, 3, 8))]


hidden_check_top_p_filter = TOP_P.hidden(
    "hidden_check_top_p_filter",
    _nuclei,
    """Random batches at ``p`` never within 0.01 of a running mass.""",
)


def hidden_check_top_p_filter_edges(fn: Callable[..., Any], seed: int = 0) -> None:
    """Ties, ``p = 1``, one token, a tiny ``p``, ``-inf``, large logits; ``p`` outside (0, 1]
    raises ValueError."""
    tied = torch.log(torch.tensor([[0.2, 0.4, 0.2, 0.2], [0.1, 0.3, 0.3, 0.3]]))  # (2, 4)
    inf = torch.tensor([[1.0, -math.inf, 3.0, 2.0, -math.inf]])
    big = torch.tensor([[1.0e4, 1.0e4 - 1.0, 1.0e4 - 3.0, 9.0e3]])
    # In float32 the first probability rounds to 1: p = 1 must keep every token all the same.
    tiny = torch.tensor([[30.0, 10.0, 9.0, 9.0, -1.0]])
    single = torch.tensor([[0.3], [-2.0]])  # one token: always kept
    logits = _random_logits(generator(seed), (3, 7), torch.float32)
    cases = (
        (tied, 0.5), (tied, 0.75), (tied, 1.0), (inf, 1.0), (inf, 0.8), (big, 0.9),
        (tiny, 1.0), (single, 0.5), (single, 1.0), (logits, 1e-4),
    )  # fmt: skip
    TOP_P.judge(fn, cases)
    for bad in (0.0, 1.5):
        _expect_value_error(fn, f"top_p_filter(logits, p={bad})", logits, bad)


def oracle_beam_search(
    step_fn: TableStepFn | RandomStepFn,
    beam_width: int,
    *,
    score: str = "logp",
    one: bool = False,
    stop_first: bool = False,
    final: str = "sum",
    ties: str = "beam",
    final_ties: str = "first",
    bos: bool = True,
) -> list[int]:
    """Beam search on ``step_fn.row`` (the options make the mistakes)."""
    rows, eos_id, max_len = step_fn.row, step_fn.eos_id, step_fn.max_len
    # Hypotheses as (seq, logp, score): the score is what the variant ranks by.
    alive: list[tuple[list[int], float, float]] = [([step_fn.bos_id], 0.0, 0.0)]
    finished: list[tuple[list[int], float, float]] = []
    while alive and len(alive[0][0]) < max_len:
        proposals = []
        for beam_rank, (seq, logp, value) in enumerate(alive):
            row = [float(x) for x in rows(seq).tolist()]
            order = sorted(range(len(row)), key=lambda i: (-row[i], i))[: 1 if one else beam_width]
            for token_rank, token in enumerate(order):
                new_logp = logp + row[token]
                new_value = {
                    "logp": new_logp,
                    "mean": new_logp / len(seq),  # len(seq) generated tokens after this one
                    "last": row[token],
                    "prob": value + math.exp(row[token]),
                }[score]
                key = (beam_rank, token_rank) if ties == "beam" else (-beam_rank, -token)
                proposals.append((-new_value, key, [*seq, token], new_logp, new_value))
        proposals.sort(key=lambda c: (c[0], c[1]))
        ranked = [(seq, logp, value) for _, _, seq, logp, value in proposals]
        finished += [c for c in ranked[:beam_width] if c[0][-1] == eos_id]
        alive = [c for c in ranked if c[0][-1] != eos_id][:beam_width]
        if stop_first and finished:
            return finished[0][0]
        # The kit's early stop, by the variant's own score (a final normalisation runs to the end).
        early = final == "sum" and final_ties == "first"
        if early and finished and alive and max(c[2] for c in finished) >= alive[0][2]:
            break
    pool = finished if final == "finished" and finished else finished + alive
    ranks = [c[2] / max(1, len(c[0]) - 1) if final == "mean" else c[2] for c in pool]
    winners = [c for c, r in zip(pool, ranks, strict=True) if r == max(ranks)]
    return winners[0 if final_ties == "first" else -1][0][0 if bos else 1 :]


BEAM = record_oracle(lab07.BEAM, lab07.SPEC, "beam_search", oracle_beam_search)


# Hand-built tables for the stated rules: {prefix: probabilities}, "default" for the others.
# Tokens: 0 BOS, 1 EOS, then words 2, 3, 4. No two tokens of a row tie where a beam is cut.
# fmt: off
_TIE_TABLE = {
    # Step 2 ties [0, 2, 3] and [0, 3, 2] (log .4 + log .35) for the beam's second place: the
    # better-ranked [0, 2]'s extension stays (had [0, 3, 2] stayed, it would have won).
    "table": {
        "[0]": [0.0, 0.15, 0.4, 0.35, 0.1],
        "[0, 2]": [0.0, 0.05, 0.1, 0.35, 0.5],
        "[0, 3]": [0.0, 0.07, 0.4, 0.23, 0.3],
        "[0, 2, 4]": [0.0, 0.5, 0.3, 0.15, 0.05],
        "[0, 2, 3]": [0.0, 0.9, 0.06, 0.03, 0.01],
        "[0, 3, 2]": [0.0, 0.95, 0.03, 0.015, 0.005],
    },
    "default": [0.0, 0.5, 0.3, 0.15, 0.05],
    "bos_id": 0, "eos_id": 1, "max_len": 5, "widths": [2],
}
_FINAL_TIE_TABLE = {
    # Step 2: the finished [0, 2, 1] ties the live [0, 3, 4] (log .5 + log .3), which ends with
    # probability 1: the hypothesis that finished first is the answer.
    "table": {
        "[0]": [0.0, 0.15, 0.5, 0.3, 0.05],
        "[0, 2]": [0.0, 0.3, 0.28, 0.22, 0.2],
        "[0, 3]": [0.0, 0.25, 0.15, 0.1, 0.5],
        "[0, 3, 4]": [0.0, 1.0, 0.0, 0.0, 0.0],
    },
    "default": [0.0, 0.5, 0.3, 0.15, 0.05],
    "bos_id": 0, "eos_id": 1, "max_len": 5, "widths": [2],
}
# fmt: on


def _separating() -> list[tuple[RandomStepFn, int]]:
    """Distributions on which every two beam mistakes return different hypotheses (ties aside)."""
    seeds = ((90, 6), (75, 6), (135, 8))
    return [(RandomStepFn(6, s, bos_id=0, eos_id=1, max_len=n), 3) for s, n in seeds]


def hidden_check_beam_search(fn: Callable[..., Any], seed: int = 0) -> None:
    """Random distributions (other BOS/EOS ids), widths 1 to 5, and the separating ones."""
    g = generator(seed)
    cases = []
    for _ in range(5):
        vocab = randint(5, 8, g)
        bos, eos = (0, 1) if randint(0, 1, g) else (vocab - 1, 2)
        step_fn = RandomStepFn(
            vocab, randint(0, 10**6, g), bos_id=bos, eos_id=eos, max_len=randint(3, 7, g)
        )
        cases.append((step_fn, randint(1, 5, g)))
    BEAM.judge(fn, [*cases, *_separating()])


def hidden_check_beam_search_rules(fn: Callable[..., Any], seed: int = 0) -> None:
    """The stated ties, ``max_len`` 1 and 2, a beam wider than the vocabulary, an immediate EOS."""
    cases: list[tuple[Any, int]] = [(TableStepFn(t), 2) for t in (_TIE_TABLE, _FINAL_TIE_TABLE)]
    g = generator(seed)
    for max_len, width in ((1, 3), (2, 2), (4, 12)):
        step_fn = RandomStepFn(6, randint(0, 10**6, g), bos_id=3, eos_id=5, max_len=max_len)
        cases.append((step_fn, width))
    eos_first = TableStepFn(
        {"table": {"[2]": [0.1, 0.1, 0.0, 0.05, 0.75]}, "default": [0.3, 0.3, 0.0, 0.1, 0.3],
         "bos_id": 2, "eos_id": 4, "max_len": 6}
    )  # fmt: skip
    # Once a case fails, the separating cases (scoring nothing here) tell mistakes apart.
    BEAM.judge(fn, [*cases, (eos_first, 2)], tell_apart=_separating())


# fmt: off
LECTURE_TABLE = {
    # Tokens: 0 <bos>, 1 <eos>, 2 "the", 3 "a", 4 "cat", 5 "dog", 6 "sat".
    # Greedy: the cat <eos> (.0525); beam 2 and 3: a cat sat <eos> (.2601).
    "table": {
        "[0]":          [0.0, 0.05, 0.5, 0.4, 0.03, 0.02, 0.0],
        "[0, 2]":       [0.0, 0.05, 0.03, 0.02, 0.35, 0.3, 0.25],
        "[0, 3]":       [0.0, 0.025, 0.0, 0.015, 0.85, 0.06, 0.05],
        "[0, 2, 4]":    [0.0, 0.3, 0.16, 0.14, 0.05, 0.07, 0.28],
        "[0, 2, 5]":    [0.0, 0.2, 0.15, 0.12, 0.08, 0.05, 0.4],
        "[0, 2, 6]":    [0.0, 0.6, 0.15, 0.12, 0.08, 0.05, 0.0],
        "[0, 3, 4]":    [0.0, 0.06, 0.02, 0.015, 0.0, 0.005, 0.9],
        "[0, 3, 5]":    [0.0, 0.3, 0.1, 0.06, 0.04, 0.0, 0.5],
        "[0, 3, 6]":    [0.0, 0.7, 0.12, 0.1, 0.05, 0.03, 0.0],
        "[0, 3, 4, 6]": [0.0, 0.85, 0.05, 0.04, 0.03, 0.02, 0.01],
    },
    "default": [0.0, 0.9, 0.035, 0.025, 0.02, 0.012, 0.008],
    "bos_id": 0, "eos_id": 1, "max_len": 5, "widths": [1, 2, 3],
    "words": ["<bos>", "<eos>", "the", "a", "cat", "dog", "sat"],
}
EOS_TABLE = {
    # Step 2: [0, 2, 1] finishes (.275) while [0, 3, 4] (.315) goes on and wins (.299).
    "table": {
        "[0]":       [0.0, 0.06, 0.55, 0.35, 0.04],
        "[0, 2]":    [0.0, 0.5, 0.05, 0.3, 0.15],
        "[0, 3]":    [0.0, 0.05, 0.03, 0.02, 0.9],
        "[0, 3, 4]": [0.0, 0.95, 0.03, 0.015, 0.005],
        "[0, 2, 3]": [0.0, 0.6, 0.2, 0.15, 0.05],
    },
    "default": [0.0, 0.4, 0.3, 0.2, 0.1],
    "bos_id": 0, "eos_id": 1, "max_len": 6, "widths": [2],
}
MAX_LEN_TABLE = {
    # The best hypothesis [0, 2, 2, 2] (.5985) has not ended when it reaches max_len = 4.
    "table": {
        "[0]":       [0.0, 0.2, 0.7, 0.1],
        "[0, 2]":    [0.0, 0.1, 0.9, 0.0],
        "[0, 2, 2]": [0.0, 0.05, 0.95, 0.0],
    },
    "default": [0.0, 0.5, 0.3, 0.2],
    "bos_id": 0, "eos_id": 1, "max_len": 4, "widths": [2],
}
LENGTH_TABLE = {
    # [0, 1] (.45) beats [0, 2, 3, 1] (.342) by total log-probability, not per token.
    "table": {
        "[0]":       [0.0, 0.45, 0.4, 0.15],
        "[0, 2]":    [0.0, 0.06, 0.04, 0.9],
        "[0, 2, 3]": [0.0, 0.95, 0.03, 0.02],
    },
    "default": [0.0, 0.5, 0.3, 0.2],
    "bos_id": 0, "eos_id": 1, "max_len": 5, "widths": [2],
}
# fmt: on


CHAR_TEXT = "the man ate the fish."


def fixtures() -> dict[str, dict[str, Any]]:
    """The visible checks' worked examples."""
    row = torch.tensor([2.0, -1.0, 0.5, 3.0, 0.0])
    batch = torch.tensor([[1.0, -2.0, 0.0, 4.0], [0.3, 0.2, -0.1, 0.0]])
    tie = torch.tensor([1.0, 3.0, 2.0, 2.0, 0.5, -1.0])
    unsorted = torch.log(torch.tensor([0.5, 0.1, 0.25, 0.15])) + 0.3
    tied = torch.log(torch.tensor([0.2, 0.4, 0.2, 0.2]))
    nuclei = [(unsorted, 0.65), (unsorted, 0.45), (tied, 0.5), (batch, 0.8), (batch, 1.0)]
    rhyme = oracle_bpe_train(RHYME, 20)
    decoded = [1, *oracle_char_encode(CHAR_TEXT, "a hat"), 3, 2]
    return {
        "beam lecture: table": {"expected": LECTURE_TABLE, "mistakes": {}},
        **CHAR_ENCODE.fixtures(
            "check_char_tokenizer encode", [(CHAR_TEXT, "the fish ate."), (CHAR_TEXT, "the cat!")]
        ),
        **CHAR_DECODE.fixtures("check_char_tokenizer decode", [(CHAR_TEXT, decoded)]),
        **BPE_TRAIN.fixtures("check_bpe_train", [(RHYME, 10), (WORDS, 6)]),
        **BPE_TRAIN.fixtures(
            "check_bpe_train_rules", [("aaa", 3), ("ab ac", 2), ("cd cd cd ab", 2), ("ab ab", 5)]
        ),
        **BPE_ENCODE.fixtures(
            "check_bpe_encode",
            [
                (RHYME, rhyme),
                ("the sailors saw a blue seal", rhyme),
                ("aaaa abcab bcaca", oracle_bpe_train("aba aac ab abc", 4)),
                ("abc bcab", oracle_bpe_train("bc bc bc ab ab", 3)),
                # The latest-learned pair first and the longest known piece cut "bbaa" apart.
                ("bbaa", oracle_bpe_train("baabbb baaaaa", 5)),
            ],
        ),
        **TEMPERATURE.fixtures("check_apply_temperature", [(row, 0.5), (row, 2.0), (batch, 0.7)]),
        **TOP_K.fixtures(
            "check_top_k_filter", [(tie, 1), (tie, 2), (tie, 3), (batch, 2), (batch, 4)]
        ),
        **TOP_P.fixtures("check_top_p_filter", nuclei),
        **BEAM.fixtures("check_beam_search", [(LECTURE_TABLE, width) for width in (1, 2, 3)]),
        **BEAM.fixtures(
            "check_beam_search_eos", [(EOS_TABLE, 2), (MAX_LEN_TABLE, 2), (LENGTH_TABLE, 2)]
        ),
    }


#: The hidden checks and :func:`fixtures`, by name.
__all__ = ["fixtures", *sorted(name for name in dir() if name.startswith("hidden_check_"))]

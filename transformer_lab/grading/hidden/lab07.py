"""Hidden checks of lab 07 (the NLP pipeline and decoding), their oracles and the fixtures.

The oracles are written from the rules the notebook states, as plain Python over lists and
floats, independent of :mod:`transformer_lab.tokenizers` and :mod:`transformer_lab.generation`:

* the character vocabulary (specials, then ``sorted(set(text))``), its encoding and decoding;
* BPE training that recounts every pair from scratch at every step, and encoding that merges
  the earliest-learned pair present until none is left;
* temperature, top-k and top-p one row at a time in float64;
* beam search with explicit ranks (total log-probability, then the rank of the beam extended,
  then the token's rank within its beam).

Each oracle has a ``*_variant`` twin whose flags reproduce the typical mistakes (merging across
words, ties to the wrong pair, overlapping pairs counted once, merges applied in the wrong order,
temperature as a product, top-k keeping k + 1 or dropping ties, top-p dropping the crossing
token or not sorting, scores not accumulated, finished hypotheses kept in the beam, ...). Each
check runs the student's code on all its inputs and names the one mistake whose outputs match
the student's on every input (:func:`~transformer_lab.checks._common.judge_cases`); a few fixed
inputs (two beam-search distributions, a BPE example) are there so that no two mistakes of the
catalogue agree on every input of their check.

:func:`fixtures` computes the visible checks' worked examples (``checks/fixtures/lab07.json``).

Reference: Sennrich, Haddow and Birch, "Neural Machine Translation of Rare Words with Subword
Units", ACL 2016; Holtzman et al., "The Curious Case of Neural Text Degeneration", ICLR 2020;
Prince, *Understanding Deep Learning*, sections 12.5 and 12.7.3.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from transformer_lab.checks._common import call_forbidding, expect_true, generator, randint
from transformer_lab.checks.lab07 import (
    DECODING_BAN,
    END_OF_WORD,
    SPECIALS,
    TEMPERATURE_HINT,
    TOKENIZER_BAN,
    TOP_K_HINT,
    TOP_P_HINT,
    Probe,
    RandomStepFn,
    TableStepFn,
    beam_probe,
    decode_with,
    encode_with,
    fitted_tokenizer,
    judge_beam,
    judge_decodes,
    judge_encodes,
    judge_logits,
    judge_merges,
    judge_pieces,
    judge_vocab_size,
    logits_probe,
    run_bpe_encode,
    run_bpe_train,
    vocab_size_of,
)
from transformer_lab.grading.hidden import fixture_entry

__all__ = [
    "fixtures",
    "hidden_check_apply_temperature",
    "hidden_check_beam_search",
    "hidden_check_beam_search_rules",
    "hidden_check_bpe_encode",
    "hidden_check_bpe_encode_edges",
    "hidden_check_bpe_train",
    "hidden_check_bpe_train_edges",
    "hidden_check_char_tokenizer",
    "hidden_check_char_tokenizer_edges",
    "hidden_check_top_k_filter",
    "hidden_check_top_k_filter_edges",
    "hidden_check_top_p_filter",
    "hidden_check_top_p_filter_edges",
    "oracle_apply_temperature",
    "oracle_beam_search",
    "oracle_bpe_encode",
    "oracle_bpe_train",
    "oracle_char_decode",
    "oracle_char_encode",
    "oracle_char_vocab",
    "oracle_top_k_filter",
    "oracle_top_p_filter",
]

UNK = SPECIALS.index("<unk>")
RHYME = (
    "a sailor went to sea sea sea to see what he could see see see but all that he could see "
    "see see was the bottom of the deep blue sea sea sea"
)
# Sennrich et al.'s example corpus: low x5, lower x2, newest x6, widest x3.
WORDS = " ".join(["low"] * 5 + ["lower"] * 2 + ["newest"] * 6 + ["widest"] * 3)


def _differing(mistakes: Mapping[str, Any], want: Any, same: Callable[[Any, Any], bool]) -> dict:
    """The mistakes whose output differs from ``want`` (what a stored example keeps: a mistake
    left out gives the expected output there)."""
    return {hint: out for hint, out in mistakes.items() if not same(out, want)}


def _equal(a: Any, b: Any) -> bool:
    return a == b


# ======================================================================================
# CharTokenizer
# ======================================================================================


def oracle_char_vocab(text: str) -> list[str]:
    """Every token, in id order: the specials, then the distinct characters by code point."""
    distinct = {c: None for c in text}
    return list(SPECIALS) + sorted(distinct, key=ord)


def oracle_char_encode(fit_text: str, text: str) -> list[int]:
    """Ids of ``text`` for a tokenizer fitted on ``fit_text`` (unknown characters -> <unk>)."""
    index = {token: i for i, token in enumerate(oracle_char_vocab(fit_text))}
    return [index.get(c, UNK) for c in text]


def oracle_char_decode(fit_text: str, ids: Sequence[int]) -> str:
    """Text of ``ids``: characters as themselves, specials by name."""
    vocab = oracle_char_vocab(fit_text)
    return "".join(vocab[i] for i in ids)


def char_encode_mistakes(fit_text: str, text: str) -> dict[str, list[int]]:
    """Hint -> the ids a typical wrong ``encode`` returns."""
    n = len(SPECIALS)
    first_seen = list(dict.fromkeys(fit_text))
    by_code = sorted(set(fit_text))
    out: dict[str, list[int]] = {}
    out[
        "Your characters are numbered in the order they first appear; sort them "
        "(sorted(set(text))) so that ids do not depend on where a character first occurs."
    ] = [first_seen.index(c) + n if c in first_seen else UNK for c in text]
    out[
        f"Your characters start at id 0; ids 0-{n - 1} belong to the special tokens "
        f"{', '.join(SPECIALS)}, so the characters start at {n}."
    ] = [by_code.index(c) if c in by_code else UNK for c in text]
    out[
        "Your special tokens come after the characters; they come first: ids 0-3 are "
        f"{', '.join(SPECIALS)}, the characters follow from id 4."
    ] = [by_code.index(c) if c in by_code else len(by_code) + UNK for c in text]
    out[
        "Your encode drops characters it has not seen; map each of them to <unk> (id 3), so "
        "that encode gives one id per character."
    ] = [by_code.index(c) + n for c in text if c in by_code]
    out["An unseen character becomes <unk> (id 3), not <pad> (id 0)."] = [
        by_code.index(c) + n if c in by_code else 0 for c in text
    ]
    return out


def char_decode_mistakes(fit_text: str, ids: Sequence[int]) -> dict[str, str]:
    """Hint -> the text a typical wrong ``decode`` returns."""
    vocab = oracle_char_vocab(fit_text)
    n = len(SPECIALS)
    out: dict[str, str] = {}
    out[
        "Your decode loses the special ids (<unk> included): write each special id as its "
        "name, e.g. '<unk>', so that no id is lost."
    ] = "".join(vocab[i] for i in ids if i >= n)
    out[
        "Your decode loses the unknown characters: write the id of <unk> as '<unk>', so that "
        "the text shows where something was not known."
    ] = "".join(vocab[i] for i in ids if i != UNK)
    out["Join the characters with nothing between them, not with spaces."] = " ".join(
        vocab[i] for i in ids
    )
    out["Your decode is off by the 4 special tokens: id i is the token vocab[i]."] = "".join(
        vocab[i + n] if i + n < len(vocab) else "?" for i in ids
    )
    return out


def _encode_probe(tok: Any, fit_text: str, text: str, extra: str = "") -> Probe:
    return Probe((tok, text), (fit_text, text), f"tokenizer.encode({text[:40]!r}){extra}")


def _char_encode_expected(probe: Probe) -> list[int]:
    return oracle_char_encode(*probe.key)


def _char_encode_mistakes(probe: Probe) -> dict[str, list[int]]:
    return char_encode_mistakes(*probe.key)


def _decode_probe(tok: Any, fit_text: str, ids: list[int]) -> Probe:
    return Probe((tok, ids), (fit_text, ids), f"tokenizer.decode({ids})")


def _char_decode_expected(probe: Probe) -> str:
    return oracle_char_decode(*probe.key)


def _char_decode_mistakes(probe: Probe) -> dict[str, str]:
    return char_decode_mistakes(*probe.key)


def _fitted_char_tokenizer(cls: Callable[..., Any], fit_text: str) -> Any:
    tok = fitted_tokenizer(cls, fit_text)
    chars = sorted(set(fit_text))
    judge_vocab_size(
        vocab_size_of(tok),
        len(SPECIALS) + len(chars),
        len(chars),
        f"CharTokenizer().fit({fit_text[:30]!r})",
    )
    return tok


_ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'-\néèüßçñΩλ中文😀\t"
)


def _random_text(g: torch.Generator, letters: str, length: int) -> str:
    picks = torch.randint(0, len(letters), (length,), generator=g).tolist()
    return "".join(letters[i] for i in picks)


def hidden_check_char_tokenizer(cls: Callable[..., Any], seed: int = 0) -> None:
    """Random texts over random alphabets (accents, CJK, emoji, tabs, newlines): ``vocab_size``,
    ``encode`` of the text and of texts with unseen characters, ``decode`` of random ids."""
    g = generator(seed)
    fits: list[tuple[Any, str]] = []
    encodes: list[Probe] = []
    decodes: list[Probe] = []
    for _ in range(3):
        order = torch.randperm(len(_ALPHABET), generator=g).tolist()
        letters = "".join(_ALPHABET[i] for i in order[: randint(5, 30, g)])
        fit_text = _random_text(g, letters, randint(20, 200, g))
        unseen = _random_text(g, _ALPHABET, randint(5, 40, g))
        tok = _fitted_char_tokenizer(cls, fit_text)
        encodes += [_encode_probe(tok, fit_text, t) for t in (fit_text, unseen)]
        vocab = oracle_char_vocab(fit_text)
        ids = torch.randint(0, len(vocab), (randint(3, 30, g),), generator=g).tolist()
        decodes.append(_decode_probe(tok, fit_text, ids))
        fits.append((tok, fit_text))
    judge_encodes(encodes, _char_encode_expected, _char_encode_mistakes)
    judge_decodes(decodes, _char_decode_expected, _char_decode_mistakes)
    for tok, fit_text in fits:
        round_trip = decode_with(tok, encode_with(tok, fit_text))
        expect_true(
            round_trip == fit_text,
            f"decode(encode(text)) returned {round_trip[:60]!r}, not the text fitted "
            f"{fit_text[:60]!r}: the two must be inverses on every character fit has seen.",
        )


def hidden_check_char_tokenizer_edges(cls: Callable[..., Any], seed: int = 0) -> None:
    """Fitting again replaces the vocabulary; empty texts; repeated characters; a text of one
    character; decoding every special."""
    g = generator(seed)
    first = _random_text(g, "abcdefgh", 30)
    second = _random_text(g, "xyz ", 12)
    tok = fitted_tokenizer(cls, first)
    call_forbidding(tok.fit, (second,), {}, ban=TOKENIZER_BAN, what=f"tokenizer.fit({second!r})")
    size = vocab_size_of(tok)
    want = len(SPECIALS) + len(set(second))
    if size == len(SPECIALS) + len(set(first) | set(second)):
        raise AssertionError(
            f"after fit({first!r}) then fit({second!r}) your vocab_size is {size}, expected "
            f"{want}: fit builds the vocabulary from the text it is given, replacing the old one."
        )
    judge_vocab_size(size, want, len(set(second)), f"...fit({second!r})")
    again = f" after fitting again on {second!r}"
    repeated = _fitted_char_tokenizer(cls, "aaaa")
    encodes = [_encode_probe(tok, second, second + "a", again)]
    encodes += [_encode_probe(repeated, "aaaa", t) for t in ("aaaa", "", "ab")]
    judge_encodes(encodes, _char_encode_expected, _char_encode_mistakes)
    tok = fitted_tokenizer(cls, "zy x")
    expect_true(
        encode_with(tok, "") == [],
        "tokenizer.encode('') should be [] (an empty text has no tokens).",
    )
    expect_true(decode_with(tok, []) == "", "tokenizer.decode([]) should be ''.")
    ids = [0, 1, 4, 5, 6, 7, 3, 2]
    judge_decodes([_decode_probe(tok, "zy x", ids)], _char_decode_expected, _char_decode_mistakes)


# ======================================================================================
# BPE
# ======================================================================================


def _word_symbols(text: str, *, eow: bool = True) -> dict[tuple[str, ...], int]:
    """Each distinct word as a tuple of symbols (``</w>`` last) -> how often it occurs."""
    corpus: dict[tuple[str, ...], int] = {}
    for word in text.split():
        key = tuple(word) + ((END_OF_WORD,) if eow else ())
        corpus[key] = corpus.get(key, 0) + 1
    return corpus


def _fuse(symbols: Sequence[str], pair: tuple[str, str], *, how: str = "all") -> tuple[str, ...]:
    """``symbols`` with ``pair`` merged: every occurrence left to right (``"all"``), only the
    first (``"first"``), or every occurrence right to left (``"rtl"``)."""
    left, right = pair
    seq = list(symbols)
    if how == "rtl":
        i = len(seq) - 2
        while i >= 0:
            if seq[i] == left and seq[i + 1] == right:
                seq[i : i + 2] = [left + right]
                i -= 2
            else:
                i -= 1
        return tuple(seq)
    out: list[str] = []
    i = 0
    done = False
    while i < len(seq):
        if not done and i + 1 < len(seq) and seq[i] == left and seq[i + 1] == right:
            out.append(left + right)
            i += 2
            done = how == "first"
        else:
            out.append(seq[i])
            i += 1
    return tuple(out)


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


def bpe_train_variant(
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
    """BPE training with the flags of the typical mistakes (the defaults are the oracle).

    Args:
        boundary: ``"word"`` (right), ``"text"`` (the whole text one sequence, spaces as
            symbols) or ``"chain"`` (the words with ``</w>`` run together).
        tie: ``"min"`` (right: the smallest pair), ``"first"`` (counted first), ``"max"``, or
            ``"concat"`` (the smallest merged string).
        overlap: count overlapping pairs ("aaa" has (a, a) twice).
        eow: end every word with ``</w>``.
        weighted: weight pairs by the word's frequency.
        merge: ``"all"`` (right), ``"first"`` occurrence only, or ``"rtl"`` (right to left).
    """
    if boundary == "word":
        corpus = _word_symbols(text, eow=eow)
    elif boundary == "text":
        corpus = {tuple(text.strip()): 1} if text.strip() else {}
    else:
        chain: list[str] = []
        for word in text.split():
            chain += [*word, END_OF_WORD]
        corpus = {tuple(chain): 1} if chain else {}
    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        counts = _pair_counts(corpus, overlap=overlap, weighted=weighted)
        if not counts:
            break
        top = max(counts.values())
        tied = [pair for pair, c in counts.items() if c == top]
        if tie == "min":
            best = min(tied)
        elif tie == "first":
            best = tied[0]
        elif tie == "max":
            best = max(tied)
        else:
            best = min(tied, key=lambda p: (p[0] + p[1], p))
        merges.append(best)
        corpus = {_fuse(s, best, how=merge): c for s, c in corpus.items()}
    return merges


def oracle_bpe_train(text: str, num_merges: int) -> list[tuple[str, str]]:
    """Reference BPE training (pairs recounted from scratch at every step)."""
    return bpe_train_variant(text, num_merges)


def bpe_train_mistakes(text: str, num_merges: int) -> dict[str, list[tuple[str, str]]]:
    """Hint -> the merges a typical wrong ``bpe_train`` returns."""
    variants: list[tuple[str, dict[str, Any]]] = [
        (
            "Your merges cross word boundaries: split the text into words on whitespace "
            f"(text.split()) and count pairs inside each word only (each word ends with "
            f"{END_OF_WORD}).",
            {"boundary": "chain"},
        ),
        (
            "Your merges cross word boundaries (spaces are symbols of one long sequence): "
            f"split the text into words and end each word with {END_OF_WORD}.",
            {"boundary": "text"},
        ),
        (
            "Your ties go to the pair counted first; when several pairs are equally frequent, "
            "merge the SMALLEST pair in Python's order (min of the (left, right) tuples).",
            {"tie": "first"},
        ),
        (
            "Your ties go to the largest pair; when several pairs are equally frequent, merge "
            "the SMALLEST pair in Python's order (min of the (left, right) tuples).",
            {"tie": "max"},
        ),
        (
            "Your ties compare the merged strings; compare the (left, right) tuples instead: "
            "('a', 'z') < ('ab', 'c') because 'a' < 'ab'.",
            {"tie": "concat"},
        ),
        (
            "You count overlapping pairs once: 'aaa' holds the pair (a, a) TWICE (positions "
            "0-1 and 1-2); count every adjacent pair.",
            {"overlap": False},
        ),
        (
            f"Your words do not end with {END_OF_WORD}: add it to every word before counting, "
            "so that a piece at the end of a word differs from the same letters inside one.",
            {"eow": False},
        ),
        (
            "You count each distinct word once; weight its pairs by how often the word occurs "
            "in the text.",
            {"weighted": False},
        ),
        (
            "You merge only the first occurrence of the pair in each word; merge every "
            "occurrence, left to right.",
            {"merge": "first"},
        ),
        (
            "You merge from the right; merge left to right: in 'aaa' the pair (a, a) becomes "
            "['aa', 'a'].",
            {"merge": "rtl"},
        ),
    ]
    return {hint: bpe_train_variant(text, num_merges, **flags) for hint, flags in variants}


def _word_to_symbols(word: str, *, eow: bool = True) -> list[str]:
    return list(word) + ([END_OF_WORD] if eow else [])


def bpe_encode_variant(
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
    """BPE encoding with the flags of the typical mistakes (the defaults are the oracle).

    Args:
        order: ``"rank"`` (right: earliest-learned pair present first), ``"reverse"`` (latest
            first), ``"longest"`` (greedy longest known piece, as WordPiece does) or
            ``"once"`` (one pass through the merges in order, each merging its first
            occurrence only).
        how: merge every occurrence (``"all"``), the ``"first"`` only, or right to left.
        until_done: repeat until no learned pair is left (else one merge per word).
        eow: end every word with ``</w>``.
        whole_text: encode the text as one sequence (spaces as symbols).
        keep_eow: keep the ``</w>`` markers in the output.
    """
    rank: dict[tuple[str, str], int] = {}
    for r, pair in enumerate(merges):
        rank.setdefault(tuple(pair), r)
    if order == "reverse":
        rank = {pair: -r for pair, r in rank.items()}
    if whole_text:
        units = [list(text) + ([END_OF_WORD] if eow else [])]
    else:
        units = [_word_to_symbols(w, eow=eow) for w in text.split()]
    pieces: list[str] = []
    for symbols in units:
        if order == "longest":
            symbols = _longest_match(symbols, merges)
        elif order == "once":
            for pair in merges:
                symbols = list(_fuse(symbols, tuple(pair), how="first"))
        elif order == "backwards":
            for pair in reversed(merges):
                symbols = list(_fuse(symbols, tuple(pair)))
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
    """Greedy longest match against the merged pieces (each a tuple of base symbols)."""
    spelled: dict[str, tuple[str, ...]] = {}

    def parts(piece: str) -> tuple[str, ...]:
        return spelled.get(piece, (piece,))

    known: set[tuple[str, ...]] = set()
    for a, b in merges:
        spelled[a + b] = parts(a) + parts(b)
        known.add(spelled[a + b])
    out: list[str] = []
    i = 0
    while i < len(symbols):
        for j in range(len(symbols), i, -1):
            if tuple(symbols[i:j]) in known or j == i + 1:
                out.append("".join(symbols[i:j]))
                i = j
                break
    return out


def oracle_bpe_encode(text: str, merges: Sequence[tuple[str, str]]) -> list[str]:
    """Reference BPE encoding: in each word, merge the earliest-learned pair present, repeat."""
    return bpe_encode_variant(text, merges)


def bpe_encode_mistakes(text: str, merges: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    """Hint -> the pieces a typical wrong ``bpe_encode`` returns."""
    variants: list[tuple[str, dict[str, Any]]] = [
        (
            "You merged the latest-learned pairs first; BPE repeatedly merges the pair whose "
            "merge came EARLIEST in the list, among the pairs present.",
            {"order": "reverse"},
        ),
        (
            "You applied the merges in reverse order; BPE repeatedly merges the pair whose "
            "merge came EARLIEST in the list, among the pairs present.",
            {"order": "backwards"},
        ),
        (
            "You cut each word into the longest known pieces; BPE replays the merges in the "
            "order learned instead (earliest-learned pair present first), which can cut "
            "differently.",
            {"order": "longest"},
        ),
        (
            "You merge only the first occurrence of each pair in a word; merge every "
            "occurrence, left to right.",
            {"order": "once"},
        ),
        (
            "You merge from the right; merge left to right ('aaa' with (a, a) gives ['aa', 'a']).",
            {"how": "rtl"},
        ),
        (
            "You stop after one merge per word; keep merging until no learned pair is left.",
            {"until_done": False},
        ),
        (
            f"Your words do not end with {END_OF_WORD}: the merges were learned on words "
            f"ending with it, so add it before merging (and keep it in the pieces).",
            {"eow": False},
        ),
        (
            "You encode the whole text as one sequence; split it into words on whitespace "
            "and encode each word on its own.",
            {"whole_text": True, "eow": False},
        ),
        (
            "You encode the whole text as one sequence (spaces included); split it into words "
            "on whitespace and encode each word on its own, ending it with </w>.",
            {"whole_text": True},
        ),
        (
            f"You dropped the {END_OF_WORD} markers; keep them in the pieces: they say where "
            "each word ends.",
            {"keep_eow": False},
        ),
    ]
    return {hint: bpe_encode_variant(text, merges, **flags) for hint, flags in variants}


def _merges_probe(fn: Callable[..., Any], text: str, num_merges: int) -> Probe:
    what = f"bpe_train({text[:37] + '...' if len(text) > 40 else text!r}, {num_merges})"
    return Probe((fn, text, num_merges), (text, num_merges), what)


def _expect_merges(probes: Sequence[Probe]) -> None:
    judge_merges(
        probes,
        lambda probe: oracle_bpe_train(*probe.key),
        lambda probe: bpe_train_mistakes(*probe.key),
    )


def _pieces_probe(fn: Callable[..., Any], text: str, merges: list[tuple[str, str]]) -> Probe:
    what = f"bpe_encode({text[:37] + '...' if len(text) > 40 else text!r}, merges)"
    return Probe((fn, text, merges), (text, merges), what)


def _expect_pieces(probes: Sequence[Probe]) -> None:
    judge_pieces(
        probes,
        lambda probe: oracle_bpe_encode(*probe.key),
        lambda probe: bpe_encode_mistakes(*probe.key),
    )


def _random_words(g: torch.Generator, letters: str, n_words: int, longest: int = 7) -> str:
    vocab = [_random_text(g, letters, randint(1, longest, g)) for _ in range(max(3, n_words // 3))]
    picks = torch.randint(0, len(vocab), (n_words,), generator=g).tolist()
    seps = [" ", " ", " ", "  ", "\n", "\t"]
    out = []
    for i in picks:
        out.append(vocab[i])
        out.append(seps[randint(0, len(seps) - 1, g)])
    return "".join(out)


def hidden_check_bpe_train(fn: Callable[..., Any], seed: int = 0) -> None:
    """Random texts (small alphabets, so many ties and repeated letters; tabs and newlines
    between words) against the oracle, 5 to 40 merges."""
    g = generator(seed)
    probes = []
    for letters in ("abc", "abcde", "lowerstn"):
        text = _random_words(g, letters, randint(15, 60, g))
        probes.append(_merges_probe(fn, text, randint(5, 40, g)))
    _expect_merges(probes)


def hidden_check_bpe_train_edges(fn: Callable[..., Any], seed: int = 0) -> None:
    """No merges asked, an empty text, more merges than there are pairs, one-letter words,
    word frequencies, ties between merged pieces, the lecture's rhyme at 25 merges."""
    expect_true(run_bpe_train(fn, "low lower", 0) == [], "bpe_train(text, 0) should be [].")
    expect_true(run_bpe_train(fn, "", 5) == [], "bpe_train('', 5) should be [] (no words).")
    expect_true(
        run_bpe_train(fn, "   \n ", 3) == [],
        "bpe_train of a text of whitespace only should be [] (no words).",
    )
    probes = [
        _merges_probe(fn, text, n)
        for text, n in (
            ("ab ab ba", 20),
            ("a b c a", 4),
            ("aaaa aaa aa", 6),
            ("zy zy zy ab abc abc", 5),
            ("abc az az abc bc", 4),
            (RHYME, 25),
        )
    ]
    g = generator(seed)
    probes.append(_merges_probe(fn, _random_words(g, "ab", 40, longest=9), 30))
    _expect_merges(probes)


def hidden_check_bpe_encode(fn: Callable[..., Any], seed: int = 0) -> None:
    """Merges learned (by the oracle) on random texts, applied to the texts themselves and to
    new words of the same letters."""
    g = generator(seed)
    probes = []
    for letters in ("abc", "abcde", "lowerstn"):
        text = _random_words(g, letters, randint(20, 60, g))
        merges = oracle_bpe_train(text, randint(5, 40, g))
        probes.append(_pieces_probe(fn, text, merges))
        probes.append(_pieces_probe(fn, _random_words(g, letters + "xy", 12), merges))
    _expect_pieces(probes)


def hidden_check_bpe_encode_edges(fn: Callable[..., Any], seed: int = 0) -> None:
    """No merges (characters and ``</w>``), an empty text, repeated letters, characters never
    seen in training, the rhyme's merges on new words."""
    expect_true(
        run_bpe_encode(fn, "", oracle_bpe_train(RHYME, 5)) == [],
        "bpe_encode('', merges) should be [] (no words).",
    )
    rhyme = oracle_bpe_train(RHYME, 30)
    probes = [
        _pieces_probe(fn, "to sea", []),
        _pieces_probe(fn, "aaaa aaaaa a", oracle_bpe_train("aaaa aaa aa", 6)),
        _pieces_probe(fn, "the sailors saw seven seas, what a sight!", rhyme),
        _pieces_probe(fn, "Zoë   sees\tthe sea", rhyme),
    ]
    g = generator(seed)
    text = _random_words(g, "ab", 40, longest=9)
    probes.append(
        _pieces_probe(fn, _random_words(g, "ab", 15, longest=12), oracle_bpe_train(text, 30))
    )
    _expect_pieces(probes)


# ======================================================================================
# apply_temperature, top_k_filter, top_p_filter
# ======================================================================================


def _rows(logits: Tensor) -> list[list[float]]:
    return logits.detach().to("cpu", torch.float64).reshape(-1, logits.shape[-1]).tolist()


def _from_rows(rows: list[list[float]], like: Tensor) -> Tensor:
    return torch.tensor(rows, dtype=torch.float64).reshape(like.shape)


def oracle_apply_temperature(logits: Tensor, t: float) -> Tensor:
    """``logits / t`` in float64, one value at a time."""
    return _from_rows([[x / t for x in row] for row in _rows(logits)], logits)


def temperature_mistakes(logits: Tensor, t: float) -> dict[str, Tensor]:
    """Hint -> what a typical wrong ``apply_temperature`` returns."""
    x = logits.detach().double()
    out = {
        "You multiplied by t; DIVIDE the logits by t (t < 1 sharpens the distribution, "
        "t > 1 flattens it).": x * t,
        "You returned probabilities; return the scaled LOGITS, logits / t (the softmax comes "
        "later, after any filter).": torch.softmax(x / t, dim=-1),
        "You returned log-probabilities; return logits / t, without normalising.": (
            torch.log_softmax(x / t, dim=-1)
        ),
        "You scaled the probabilities; the temperature divides the LOGITS: logits / t.": (
            torch.softmax(x, dim=-1) / t
        ),
        "You subtracted t; divide the logits by t.": x - t,
    }
    return out


def _kth_largest(row: list[float], k: int) -> float:
    return sorted(row, reverse=True)[min(k, len(row)) - 1]


def top_k_variant(logits: Tensor, k: int, *, how: str = "ties", fill: float = -math.inf) -> Tensor:
    """Top-k with the flags of the typical mistakes (the defaults are the oracle).

    Args:
        how: ``"ties"`` (right: keep every logit >= the k-th largest), ``"plus1"`` (k + 1
            kept), ``"minus1"``, ``"exact"`` (exactly k, lower ids first among ties),
            ``"smallest"`` (the k smallest), ``"global"`` (the k largest of the whole batch).
        fill: the value of removed entries.
    """
    rows = _rows(logits)
    out = []
    flat = sorted((x for row in rows for x in row), reverse=True)
    for row in rows:
        if how == "ties":
            kth = _kth_largest(row, k)
            keep = [x >= kth for x in row]
        elif how in ("plus1", "minus1"):
            kth = _kth_largest(row, max(1, k + (1 if how == "plus1" else -1)))
            keep = [x >= kth for x in row]
        elif how == "exact":
            ranked = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
            keep = [i in ranked for i in range(len(row))]
        elif how == "smallest":
            kth = sorted(row)[min(k, len(row)) - 1]
            keep = [x <= kth for x in row]
        else:
            kth = flat[min(k, len(flat)) - 1]
            keep = [x >= kth for x in row]
        out.append([x if kept else fill for x, kept in zip(row, keep, strict=True)])
    return _from_rows(out, logits)


def oracle_top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Reference top-k: every logit >= the k-th largest of its row is kept, others -inf."""
    return top_k_variant(logits, k)


def top_k_mistakes(logits: Tensor, k: int) -> dict[str, Tensor]:
    """Hint -> what a typical wrong ``top_k_filter`` returns."""
    variants = [
        ("You keep k + 1 tokens; keep the k largest (and any tied with the k-th).", "plus1"),
        ("You keep k - 1 tokens; keep the k largest (and any tied with the k-th).", "minus1"),
        (
            "You keep exactly k tokens and drop some tied with the k-th largest; keep EVERY "
            "token whose logit equals the k-th largest (compare with the value, e.g. "
            "logits < kth -> -inf).",
            "exact",
        ),
        ("You keep the k SMALLEST logits; keep the k largest.", "smallest"),
        (
            "You took the k largest of the whole batch; filter each row (the last dimension) "
            "on its own.",
            "global",
        ),
    ]
    return {hint: top_k_variant(logits, k, how=how) for hint, how in variants}


def top_p_variant(
    logits: Tensor, p: float, *, how: str = "crossing", ties: str = "low", fill: float = -math.inf
) -> Tensor:
    """Top-p with the flags of the typical mistakes (the defaults are the oracle).

    Args:
        how: ``"crossing"`` (right: keep while the mass before is < p), ``"drop"`` (keep only
            while the running mass including the token is <= p, plus the first), ``"unsorted"``
            (cumulate in token-id order), ``"logits"`` (cumulate the logits, not
            probabilities), ``"at_least"`` (keep tokens whose own probability is >= p).
        ties: ``"low"`` (right: equal probabilities ranked by lower id first) or ``"high"``.
    """
    out = []
    if p >= 1.0 and how == "crossing":  # p = 1 keeps every token, whatever the sums round to
        return logits.detach().to(torch.float64).clone()
    for row in _rows(logits):
        top = max(row)
        weights = [math.exp(x - top) if x != -math.inf else 0.0 for x in row]
        total = sum(weights)
        probs = [w / total for w in weights]
        ids = list(range(len(row)))
        if how != "unsorted":
            sign = 1 if ties == "low" else -1
            ids.sort(key=lambda i: (-probs[i], sign * i))
        values = row if how == "logits" else probs
        keep = [False] * len(row)
        mass = 0.0
        for rank, i in enumerate(ids):
            if how == "at_least":
                keep[i] = probs[i] >= p or rank == 0
                continue
            if how == "drop":
                keep[i] = rank == 0 or mass + values[i] <= p
            else:
                keep[i] = rank == 0 or mass < p
            mass += values[i]
        out.append([x if kept else fill for x, kept in zip(row, keep, strict=True)])
    return _from_rows(out, logits)


def oracle_top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Reference top-p (float64): keep each token whose preceding mass is < p, in order of
    probability (ties: lower id first); the most likely token always."""
    return top_p_variant(logits, p)


def top_p_mistakes(logits: Tensor, p: float) -> dict[str, Tensor]:
    """Hint -> what a typical wrong ``top_p_filter`` returns."""
    variants = [
        (
            "You drop the token that crosses p; keep it: a token stays when the mass BEFORE "
            "it is < p, so the kept tokens reach at least p (use cumsum - probs, or shift the "
            "mask right by one).",
            {"how": "drop"},
        ),
        (
            "You cumulate the probabilities in token-id order; sort each row by probability "
            "first (highest first), then cumulate.",
            {"how": "unsorted"},
        ),
        (
            "You cumulate the logits; cumulate the PROBABILITIES (softmax of the row), sorted.",
            {"how": "logits"},
        ),
        (
            "You keep the tokens whose own probability is >= p; top-p keeps the most likely "
            "tokens until their TOTAL probability reaches p.",
            {"how": "at_least"},
        ),
        (
            "Your ties go to the higher token id; rank equal probabilities by token id, LOWEST "
            "first (a stable sort: torch.sort(..., descending=True, stable=True)).",
            {"ties": "high"},
        ),
    ]
    return {hint: top_p_variant(logits, p, **flags) for hint, flags in variants}


def _same(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape or not torch.equal(torch.isneginf(a), torch.isneginf(b)):
        return False
    keep = ~torch.isneginf(b)
    return bool(torch.allclose(a[keep].double(), b[keep].double(), atol=1e-6, rtol=1e-6))


def _logits_probe(
    fn: Callable[..., Any], name: str, logits: Tensor, arg: float, hint: str
) -> Probe:
    return logits_probe(fn, name, logits, arg, (name, logits, arg), hint)


def _logits_oracles(name: str) -> tuple[Callable[..., Tensor], Callable[..., dict[str, Tensor]]]:
    return {
        "apply_temperature": (oracle_apply_temperature, temperature_mistakes),
        "top_k_filter": (oracle_top_k_filter, top_k_mistakes),
        "top_p_filter": (oracle_top_p_filter, top_p_mistakes),
    }[name]


def _expect_logits(probes: Sequence[Probe]) -> None:
    judge_logits(
        probes,
        lambda probe: _logits_oracles(probe.key[0])[0](*probe.key[1:]),
        lambda probe: _logits_oracles(probe.key[0])[1](*probe.key[1:]),
    )


def _random_logits(g: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
    return (2.0 * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)


def hidden_check_apply_temperature(fn: Callable[..., Any], seed: int = 0) -> None:
    """Random batches (float32 and float64, any leading dims) at temperatures below and above 1;
    ``-inf`` entries stay ``-inf``; ``t = 1`` changes nothing; ``t <= 0`` raises ValueError."""
    g = generator(seed)
    probes = []
    for shape, dtype, t in (
        ((7,), torch.float32, 0.3),
        ((3, 11), torch.float64, 1.7),
        ((2, 3, 6), torch.float32, 0.9),
    ):
        logits = _random_logits(g, shape, dtype)
        logits[..., 1] = -math.inf
        probes.append(_logits_probe(fn, "apply_temperature", logits, t, TEMPERATURE_HINT))
    logits = _random_logits(g, (2, 5), torch.float32)
    probes.append(_logits_probe(fn, "apply_temperature", logits, 1.0, "t = 1 changes nothing."))
    _expect_logits(probes)
    for bad in (0.0, -1.0):
        try:
            result = call_forbidding(
                fn, (logits, bad), {}, ban=DECODING_BAN, what=f"apply_temperature(logits, {bad})"
            )
        except AssertionError as exc:
            if "ValueError" in str(exc):
                continue
            raise
        raise AssertionError(
            f"apply_temperature(logits, t={bad}) returned {type(result).__name__}: a temperature "
            "must be > 0; raise ValueError naming t (for t -> 0 use greedy decoding, the argmax)."
        )


def hidden_check_top_k_filter(fn: Callable[..., Any], seed: int = 0) -> None:
    """Random batches (float32, float64, three dims) with several ``k``; rows with ties."""
    g = generator(seed)
    probes = []
    for shape, dtype in (
        ((9,), torch.float32),
        ((4, 13), torch.float64),
        ((2, 3, 7), torch.float32),
    ):
        logits = _random_logits(g, shape, dtype)
        # Round half the rows to whole numbers, so that ties happen at the k-th value.
        logits[..., ::2] = logits[..., ::2].round()
        k = randint(1, shape[-1] - 1, g)
        probes.append(_logits_probe(fn, "top_k_filter", logits, k, TOP_K_HINT))
    _expect_logits(probes)


def hidden_check_top_k_filter_edges(fn: Callable[..., Any], seed: int = 0) -> None:
    """``k`` equal to and larger than the vocabulary keeps everything; ``k = 1``; ``-inf``
    already present; a row of equal logits; ``k < 1`` raises ValueError."""
    g = generator(seed)
    logits = _random_logits(g, (3, 6), torch.float32)
    logits[0, 2] = -math.inf
    logits[1] = 0.5
    probes = []
    for k in (6, 9, 1, 3):
        every = " k >= the vocabulary size keeps every token." if k >= logits.shape[-1] else ""
        probes.append(_logits_probe(fn, "top_k_filter", logits, k, TOP_K_HINT + every))
    _expect_logits(probes)
    try:
        call_forbidding(fn, (logits, 0), {}, ban=DECODING_BAN, what="top_k_filter(logits, 0)")
    except AssertionError as exc:
        if "ValueError" in str(exc):
            return
        raise
    raise AssertionError(
        "top_k_filter(logits, k=0) should raise ValueError naming k: keeping no token leaves "
        "nothing to sample."
    )


def _safe_p(g: torch.Generator, logits: Tensor) -> float:
    """A ``p`` at least 0.01 away from every running mass of every row, sorted or not."""
    masses = []
    for row in _rows(logits):
        weights = [math.exp(x) for x in row]
        for order in (sorted(weights, reverse=True), weights):
            running = 0.0
            for q in order:
                running += q / sum(weights)
                masses.append(running)
    for _ in range(100):
        p = 0.15 + 0.8 * float(torch.rand((), generator=g))
        if all(abs(p - m) > 0.01 for m in masses):
            return round(p, 3)
    return 0.5


def hidden_check_top_p_filter(fn: Callable[..., Any], seed: int = 0) -> None:
    """Random batches (float32, float64, three dims) at several ``p`` (never closer than 0.01 to
    a running mass); unsorted rows; rows whose nucleus is one token."""
    g = generator(seed)
    probes = []
    for shape, dtype in (
        ((10,), torch.float32),
        ((4, 12), torch.float64),
        ((2, 3, 8), torch.float32),
    ):
        logits = _random_logits(g, shape, dtype)
        p = _safe_p(g, logits)
        probes.append(_logits_probe(fn, "top_p_filter", logits, p, TOP_P_HINT))
    _expect_logits(probes)


def hidden_check_top_p_filter_edges(fn: Callable[..., Any], seed: int = 0) -> None:
    """Ties at the boundary (lower id first), ``p = 1`` keeps everything (also where float32 sums
    reach 1 early), a single token, a tiny ``p`` keeps the most likely token, ``-inf`` already
    present, large logits (1e4), ``p`` outside (0, 1] raises ValueError."""
    tied = torch.log(torch.tensor([[0.2, 0.4, 0.2, 0.2], [0.1, 0.3, 0.3, 0.3]]))  # (2, 4)
    inf = torch.tensor([[1.0, -math.inf, 3.0, 2.0, -math.inf]])
    big = torch.tensor([[1.0e4, 1.0e4 - 1.0, 1.0e4 - 3.0, 9.0e3]])
    # In float32 the first token's probability rounds to 1, so a running sum reaches p = 1
    # before the others: p = 1 must keep them all the same.
    tiny = torch.tensor([[30.0, 10.0, 9.0, 9.0, -1.0]])
    single = torch.tensor([[0.3], [-2.0]])  # one token: always kept
    cases = (
        (tied, 0.5), (tied, 0.75), (tied, 1.0), (inf, 1.0), (inf, 0.8), (big, 0.9),
        (tiny, 1.0), (single, 0.5), (single, 1.0),
    )  # fmt: skip
    probes = [
        _logits_probe(
            fn,
            "top_p_filter",
            logits,
            p,
            TOP_P_HINT + (" p = 1 keeps every token." if p == 1.0 else ""),
        )
        for logits, p in cases
    ]
    g = generator(seed)
    logits = _random_logits(g, (3, 7), torch.float32)
    tiny_p = "A tiny p keeps only the most likely token of each row (it always stays)."
    probes.append(_logits_probe(fn, "top_p_filter", logits, 1e-4, tiny_p))
    _expect_logits(probes)
    for bad in (0.0, 1.5):
        try:
            call_forbidding(
                fn, (logits, bad), {}, ban=DECODING_BAN, what=f"top_p_filter(logits, {bad})"
            )
        except AssertionError as exc:
            if "ValueError" in str(exc):
                continue
            raise
        raise AssertionError(
            f"top_p_filter(logits, p={bad}) should raise ValueError naming p: p is a probability "
            "mass in (0, 1]."
        )


# ======================================================================================
# beam_search
# ======================================================================================


StepRows = Callable[[Sequence[int]], Tensor]


def beam_variant(
    rows: StepRows,
    bos_id: int,
    eos_id: int,
    beam_width: int,
    max_len: int,
    *,
    score: str = "logp",
    propose: str = "width",
    slots: bool = False,
    stop_first: bool = False,
    final: str = "sum",
    ties: str = "beam",
    final_ties: str = "first",
) -> list[int]:
    """Beam search with the flags of the typical mistakes (the defaults are the oracle).

    Args:
        rows: ``rows(prefix) -> (V,)`` log-probabilities (no prefix checks).
        score: ``"logp"`` (right: sum of log-probabilities), ``"last"`` (the last token's
            log-probability only), ``"prob"`` (sum of probabilities) or ``"mean"`` (the mean
            log-probability per generated token, at every step).
        propose: each live hypothesis proposes its ``"width"`` best tokens (right), ``"all"``
            tokens, or ``"one"`` (its best).
        slots: finished hypotheses keep their place in the beam (it shrinks). ``slots`` and
            ``propose="all"`` return the same hypothesis as the rule (what they add or drop
            scores below a finished hypothesis): correct variants, not mistakes.
        stop_first: return as soon as a hypothesis finishes.
        final: the final choice by ``"sum"`` (right), ``"mean"`` (per generated token) or
            ``"finished"`` (finished hypotheses only, when there are any).
        ties: equal scores ranked by the better beam (``"beam"``, right) or ``"reverse"``
            (later beams and higher ids first).
        final_ties: the final choice keeps the ``"first"`` best (right) or the ``"last"``.
    """
    alive: list[tuple[list[int], float, float]] = [([bos_id], 0.0, 0.0)]  # (seq, logp, score)
    finished: list[tuple[list[int], float, float]] = []
    while alive and len(alive[0][0]) < max_len:
        proposals = []
        for beam_rank, (seq, logp, value) in enumerate(alive):
            row = [float(x) for x in rows(seq).tolist()]
            order = sorted(range(len(row)), key=lambda i: (-row[i], i))
            if propose == "width":
                order = order[:beam_width]
            elif propose == "one":
                order = order[:1]
            for token_rank, token in enumerate(order):
                new_logp = logp + row[token]
                if score == "logp":
                    new_value = new_logp
                elif score == "mean":  # normalised by length at every step
                    new_value = new_logp / len(seq)  # len(seq) generated tokens after this one
                elif score == "last":
                    new_value = row[token]
                else:
                    new_value = value + math.exp(row[token])
                key = (beam_rank, token_rank) if ties == "beam" else (-beam_rank, -token)
                proposals.append((-new_value, key, [*seq, token], new_logp, new_value))
        proposals.sort(key=lambda c: (c[0], c[1]))
        ranked = [(seq, logp, value) for _, _, seq, logp, value in proposals]
        top = ranked[:beam_width]
        if slots:
            finished += [c for c in top if c[0][-1] == eos_id]
            alive = [c for c in top if c[0][-1] != eos_id]
        else:
            finished += [c for c in top if c[0][-1] == eos_id]
            alive = [c for c in ranked if c[0][-1] != eos_id][:beam_width]
        if stop_first and finished:
            return finished[0][0]
        # The kit's early stop: no live hypothesis can beat the best finished one any more, by
        # the variant's own score (students who normalise by length at the end usually run to
        # the end).
        early = final == "sum" and final_ties == "first"
        if early and finished and alive and max(c[2] for c in finished) >= alive[0][2]:
            break
    pool = finished if final == "finished" and finished else finished + alive

    def rank(c: tuple[list[int], float, float]) -> float:
        return c[2] / max(1, len(c[0]) - 1) if final == "mean" else c[2]

    best = max(rank(c) for c in pool)
    winners = [c for c in pool if rank(c) == best]
    return winners[0 if final_ties == "first" else -1][0]


def oracle_beam_search(
    rows: StepRows, bos_id: int, eos_id: int, beam_width: int, max_len: int
) -> list[int]:
    """Reference beam search (the rules of the notebook)."""
    return beam_variant(rows, bos_id, eos_id, beam_width, max_len)


_BEAM_MISTAKES: list[tuple[str, dict[str, Any]]] = [
    (
        "Your scores are not accumulated: rank a hypothesis by the SUM of the log-probabilities "
        "of all its tokens (score + logp[token]), not by its last token's.",
        {"score": "last"},
    ),
    (
        "You add probabilities; add LOG-probabilities (step_fn returns them): the probability "
        "of a sequence is the product of its tokens', and its log the sum.",
        {"score": "prob"},
    ),
    (
        "Each live hypothesis proposes its beam_width most likely next tokens, not only its "
        "best one.",
        {"propose": "one"},
    ),
    (
        "You stopped at the first hypothesis that produced EOS; a live one may still score "
        "better. Stop when no live hypothesis can beat the best finished one (or at max_len).",
        {"stop_first": True},
    ),
    (
        "You chose by the mean log-probability per token; this lab's beam search returns the "
        "hypothesis with the highest TOTAL log-probability (no length normalisation).",
        {"final": "mean"},
    ),
    (
        "You normalise by length at every step: your hypotheses are ranked by their mean "
        "log-probability per token while the search runs. This lab's beam search ranks them "
        "by the TOTAL log-probability throughout (no length normalisation, in the steps or at "
        "the end).",
        {"score": "mean"},
    ),
    (
        "You only returned a finished hypothesis; a hypothesis still live at max_len competes "
        "too, with its total log-probability.",
        {"final": "finished"},
    ),
    (
        "Your ties go the wrong way: among equal scores, the extension of the better-ranked "
        "hypothesis comes first, then the lower token id (sort with a stable sort on the "
        "score alone; torch.topk does not promise an order among equal values).",
        {"ties": "reverse"},
    ),
    (
        "Your final choice takes the last of several equally good hypotheses; take the first: "
        "finished before live, earlier finished before later.",
        {"final_ties": "last"},
    ),
]


def beam_mistakes(
    rows: StepRows, bos_id: int, eos_id: int, beam_width: int, max_len: int
) -> dict[str, list[int]]:
    """Hint -> the hypothesis a typical wrong ``beam_search`` returns."""
    args = (rows, bos_id, eos_id, beam_width, max_len)
    return {hint: beam_variant(*args, **flags) for hint, flags in _BEAM_MISTAKES}


def _beam_probe(fn: Callable[..., Any], step_fn: Any, beam_width: int) -> Probe:
    probe = beam_probe(fn, step_fn, beam_width, None)
    args = (step_fn.row, step_fn.bos_id, step_fn.eos_id, beam_width, step_fn.max_len)
    return probe._replace(key=args)


def _expect_beam(probes: Sequence[Probe], tell_apart: Sequence[Probe] = ()) -> None:
    judge_beam(
        probes,
        lambda probe: oracle_beam_search(*probe.key),
        lambda probe: beam_mistakes(*probe.key),
        tell_apart,
    )


def _separating_probes(fn: Callable[..., Any]) -> list[Probe]:
    """Probes on which the catalogue's mistakes return different hypotheses, ties aside."""
    return [
        _beam_probe(fn, RandomStepFn(6, seed, bos_id=0, eos_id=1, max_len=max_len), 3)
        for seed, max_len in _SEPARATING_BEAM_SEEDS
    ]


def hidden_check_beam_search(fn: Callable[..., Any], seed: int = 0) -> None:
    """Random next-token distributions (5 to 8 tokens, other BOS/EOS ids) at widths 1 to 5 and
    several ``max_len``, and two fixed ones that tell the typical mistakes apart, against the
    oracle."""
    g = generator(seed)
    probes = []
    for _ in range(5):
        vocab = randint(5, 8, g)
        bos, eos = (0, 1) if randint(0, 1, g) else (vocab - 1, 2)
        step_fn = RandomStepFn(
            vocab, randint(0, 10**6, g), bos_id=bos, eos_id=eos, max_len=randint(3, 7, g)
        )
        probes.append(_beam_probe(fn, step_fn, randint(1, 5, g)))
    # Two fixed distributions on which the catalogue's mistakes return different hypotheses
    # (random ones may let two of them agree everywhere: one diagnosis needs them apart).
    _expect_beam([*probes, *_separating_probes(fn)])


#: Seeds and max_len of :class:`RandomStepFn` (6 tokens, beam_width 3) that tell every pair of
#: the catalogue's mistakes apart, ties aside (the tables below hold those); the third tells a
#: length normalisation at every step from one in the final choice only.
_SEPARATING_BEAM_SEEDS = ((90, 6), (75, 6), (135, 8))

# Hand-built tables for the stated rules: {prefix: probabilities}, "default" for the others.
# Tokens: 0 BOS, 1 EOS, then words 2, 3, 4. No two tokens of a row tie where a beam is cut.
# fmt: off
_TIE_TABLE = {
    # Step 2 ties [0, 2, 3] and [0, 3, 2] exactly (log .4 + log .35 either way) for the second
    # place of the beam: the extension of the better-ranked hypothesis [0, 2] stays. Had
    # [0, 3, 2] stayed, it would have won ([0, 3, 2, 1] beats [0, 2, 3, 1]).
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
    # Step 2: the finished [0, 2, 1] and the live [0, 3, 4] score exactly alike (log .5 + log
    # .3 either way) and [0, 3, 4, 1] ends with probability 1: the hypothesis that finished
    # first is the answer.
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


def _table(spec: Mapping[str, Any]) -> TableStepFn:
    rows = {tuple(json.loads(k)): v for k, v in spec["table"].items()}
    ids = {name: spec[name] for name in ("bos_id", "eos_id", "max_len")}
    return TableStepFn(rows, spec["default"], **ids)


def hidden_check_beam_search_rules(fn: Callable[..., Any], seed: int = 0) -> None:
    """The stated ties (equal scores: the better-ranked beam's extension first; the final
    choice: the hypothesis that finished first), ``max_len = 1`` and ``2``, a beam wider than
    the vocabulary, an immediate EOS, other BOS/EOS ids."""
    probes = [
        _beam_probe(fn, _table(spec), spec["widths"][0]) for spec in (_TIE_TABLE, _FINAL_TIE_TABLE)
    ]
    g = generator(seed)
    for max_len, width in ((1, 3), (2, 2), (4, 12)):
        step_fn = RandomStepFn(6, randint(0, 10**6, g), bos_id=3, eos_id=5, max_len=max_len)
        probes.append(_beam_probe(fn, step_fn, width))
    eos_first = TableStepFn(
        {(2,): [0.1, 0.1, 0.0, 0.05, 0.75]}, [0.3, 0.3, 0.0, 0.1, 0.3], bos_id=2, eos_id=4,
        max_len=6,
    )  # fmt: skip
    probes.append(_beam_probe(fn, eos_first, 2))
    # The rules' probes may leave two mistakes alike (adding probabilities, or normalising by
    # length at every step, with a beam wider than the vocabulary): once one fails, the
    # separating probes tell them apart (they score nothing here).
    _expect_beam(probes, tell_apart=_separating_probes(fn))


# ======================================================================================
# The visible checks' worked examples
# ======================================================================================

# fmt: off
LECTURE_TABLE = {
    # Tokens: 0 <bos>, 1 <eos>, 2 "the", 3 "a", 4 "cat", 5 "dog", 6 "sat".
    # Greedy: the (.5) cat (.35) <eos> (.3) = .0525; beam 2 and 3: a (.4) cat (.85) sat (.9)
    # <eos> (.85) = .2601.
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
    # Step 2: [0, 2, 1] finishes (.275) while [0, 3, 4] (.315) is still better; it finishes
    # with .95 and wins (.299).
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
CHAR_PROBES = {"probe fitted": "the fish ate.", "probe unseen": "the cat!"}


def fixtures() -> dict[str, dict[str, Any]]:
    """The stored examples of :mod:`transformer_lab.checks.lab07`, keyed by what they are."""
    out: dict[str, dict[str, Any]] = {}
    # CharTokenizer
    out["char text"] = fixture_entry(CHAR_TEXT)
    out["char chars"] = fixture_entry(sorted(set(CHAR_TEXT)))
    for key, text in CHAR_PROBES.items():
        out[f"char {key}: text"] = fixture_entry(text)
        want = oracle_char_encode(CHAR_TEXT, text)
        out[f"char {key}: encode"] = fixture_entry(
            want, _differing(char_encode_mistakes(CHAR_TEXT, text), want, _equal)
        )
    ids = [1, *oracle_char_encode(CHAR_TEXT, "a hat"), 3, 2]
    out["char decode: ids"] = fixture_entry(ids)
    decoded = oracle_char_decode(CHAR_TEXT, ids)
    out["char decode"] = fixture_entry(
        decoded, _differing(char_decode_mistakes(CHAR_TEXT, ids), decoded, _equal)
    )
    # bpe_train
    for key, text, n in (
        ("rhyme", RHYME, 10),
        ("words", WORDS, 6),
        ("overlap", "aaa", 3),
        ("ties", "ab ac", 2),
        ("frequency", "cd cd cd ab", 2),
        ("stop", "ab ab", 5),
    ):
        out[f"bpe_train {key}: input"] = fixture_entry([text, n])
        merges = oracle_bpe_train(text, n)
        wrong = _differing(bpe_train_mistakes(text, n), merges, _equal)
        out[f"bpe_train {key}"] = fixture_entry(
            [list(m) for m in merges], {h: [list(m) for m in v] for h, v in wrong.items()}
        )
    # bpe_encode
    rhyme_merges = oracle_bpe_train(RHYME, 20)
    for key, text, merges in (
        ("rhyme", RHYME, rhyme_merges),
        ("unseen", "the sailors saw a blue seal", rhyme_merges),
        ("order", "aaaa abcab bcaca", oracle_bpe_train("aba aac ab abc", 4)),
        ("longest", "abc bcab", oracle_bpe_train("bc bc bc ab ab", 3)),
        # The latest-learned pair first and the longest known piece cut "bbaa" differently.
        ("ranks", "bbaa", oracle_bpe_train("baabbb baaaaa", 5)),
    ):
        out[f"bpe_encode {key}: input"] = fixture_entry([text, [list(m) for m in merges]])
        pieces = oracle_bpe_encode(text, merges)
        out[f"bpe_encode {key}"] = fixture_entry(
            pieces, _differing(bpe_encode_mistakes(text, merges), pieces, _equal)
        )
    # Filters
    row = torch.tensor([2.0, -1.0, 0.5, 3.0, 0.0])
    batch = torch.tensor([[1.0, -2.0, 0.0, 4.0], [0.3, 0.2, -0.1, 0.0]])
    examples: dict[str, list[tuple[str, Tensor, float]]] = {
        "apply_temperature": [
            ("t=0.5", row, 0.5),
            ("t=2", row, 2.0),
            ("batch t=0.7", batch, 0.7),
        ],
        "top_k_filter": [
            ("k=1", torch.tensor([1.0, 3.0, 2.0, 2.0, 0.5, -1.0]), 1),
            ("k=2 tie", torch.tensor([1.0, 3.0, 2.0, 2.0, 0.5, -1.0]), 2),
            ("k=3", torch.tensor([1.0, 3.0, 2.0, 2.0, 0.5, -1.0]), 3),
            ("batch k=2", batch, 2),
            ("k=V", batch, 4),
        ],
        "top_p_filter": [
            ("p=0.65", torch.log(torch.tensor([0.5, 0.1, 0.25, 0.15])) + 0.3, 0.65),
            ("p=0.45", torch.log(torch.tensor([0.5, 0.1, 0.25, 0.15])) + 0.3, 0.45),
            ("tie p=0.5", torch.log(torch.tensor([0.2, 0.4, 0.2, 0.2])), 0.5),
            ("batch p=0.8", batch, 0.8),
            ("p=1", batch, 1.0),
        ],
    }
    makers: dict[str, tuple[Callable[..., Tensor], Callable[..., dict[str, Tensor]]]] = {
        "apply_temperature": (oracle_apply_temperature, temperature_mistakes),
        "top_k_filter": (oracle_top_k_filter, top_k_mistakes),
        "top_p_filter": (oracle_top_p_filter, top_p_mistakes),
    }
    for name, items in examples.items():
        oracle, mistakes = makers[name]
        keys = [f"{name} {label}" for label, _, _ in items]
        out[f"{name}: examples"] = fixture_entry(keys)
        for key, (_, logits, arg) in zip(keys, items, strict=True):
            out[f"{key}: logits"] = fixture_entry(logits)
            out[f"{key}: argument"] = fixture_entry([arg])
            want = oracle(logits, arg)
            out[key] = fixture_entry(want, _differing(mistakes(logits, arg), want, _same))
    # beam_search
    for key, spec in (
        ("beam lecture", LECTURE_TABLE),
        ("beam eos", EOS_TABLE),
        ("beam max_len", MAX_LEN_TABLE),
        ("beam length", LENGTH_TABLE),
    ):
        out[f"{key}: table"] = fixture_entry(dict(spec))
        step_fn = _table(spec)
        for width in spec["widths"]:
            args = (step_fn.row, spec["bos_id"], spec["eos_id"], width, spec["max_len"])
            best = oracle_beam_search(*args)
            out[f"{key}: beam_width={width}"] = fixture_entry(
                best, _differing(beam_mistakes(*args), best, _equal)
            )
    return out

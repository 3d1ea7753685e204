"""Lab 07 checks against a catalogue of typical mistakes and of correct variants (no nbgrader).

Each wrong implementation must fail the checks that should catch it, with a message naming the
mistake; each correct variant (dictionaries or lists, recounting or incremental BPE, merges
replayed one by one or by rank, loops or vectorised filters, beam search with lists or tensors,
beams that shrink or propose every token) must pass every check, visible and hidden. Calling
the kit's version earns nothing; a verbatim copy of the kit's code (moved to other lines) passes.
"""

from __future__ import annotations

import heapq
import importlib.util
import itertools
import json
import math
import sys
import types
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import transformer_lab.generation as kit_generation
import transformer_lab.tokenizers as kit_tokenizers
from transformer_lab.checks import _generated, lab07
from transformer_lab.grading.hidden import lab07 as hidden07

EOW = "</w>"
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")


def _outcomes(checks: dict[str, Callable[[Any], None]], fn: Any) -> dict[str, str]:
    """check name -> "" when it passes, else its message."""
    out = {}
    for name, check in checks.items():
        try:
            check(fn)
            out[name] = ""
        except AssertionError as exc:
            out[name] = str(exc)
    return out


def _expect(outcomes: dict[str, str], failing: list[str], words: str) -> None:
    assert sorted(n for n, msg in outcomes.items() if msg) == sorted(failing), outcomes
    for name in failing:
        assert words in outcomes[name], (name, outcomes[name])


def _kit_copy(name: str) -> types.ModuleType:
    """The kit's module executed again one line lower: the same code, other code objects."""
    source = Path(importlib.util.find_spec(name).origin).read_text()
    module = types.ModuleType(f"{name}_copy")
    sys.modules[module.__name__] = module
    exec(compile("\n" + source, f"<copy of {name}>", "exec"), module.__dict__)
    return module


KIT_TOKENIZERS = _kit_copy("transformer_lab.tokenizers")
KIT_GENERATION = _kit_copy("transformer_lab.generation")


# ======================================================================================
# CharTokenizer
# ======================================================================================

CHAR_CHECKS = {
    "visible": lab07.check_char_tokenizer,
    "hidden": lambda c: hidden07.hidden_check_char_tokenizer(c, seed=701),
    "edges": lambda c: hidden07.hidden_check_char_tokenizer_edges(c, seed=702),
}


class CharGood:
    """The notebook's answer: dictionaries both ways, vocab_size a property."""

    def __init__(self) -> None:
        self.itos = list(SPECIALS)
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    def fit(self, text: str) -> CharGood:
        self.itos = list(SPECIALS) + sorted(set(text))
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        return self

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(c, 3) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.itos[i] for i in ids)


class CharGoodAttribute:
    """A correct variant: lists only, vocab_size an attribute set by fit, ids as a tensor."""

    def __init__(self) -> None:
        self.chars: list[str] = []
        self.vocab_size = 4

    def fit(self, text: str) -> CharGoodAttribute:
        self.chars = []
        for c in sorted(text):
            if not self.chars or self.chars[-1] != c:
                self.chars.append(c)
        self.vocab_size = 4 + len(self.chars)
        return self

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.chars.index(c) + 4 if c in self.chars else 3 for c in text])

    def decode(self, ids: list[int]) -> str:
        names = ["<pad>", "<bos>", "<eos>", "<unk>"]
        return "".join(names[i] if i < 4 else self.chars[i - 4] for i in ids)


class CharFirstSeen(CharGood):
    def fit(self, text: str) -> CharFirstSeen:
        self.itos = list(SPECIALS) + list(dict.fromkeys(text))
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        return self


class CharNoSpecials(CharGood):
    def fit(self, text: str) -> CharNoSpecials:
        self.itos = sorted(set(text))
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        return self

    @property
    def vocab_size(self) -> int:
        return len(self.itos) + 4

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(c, 3) for c in text]


class CharSpecialsLast(CharGood):
    def fit(self, text: str) -> CharSpecialsLast:
        self.itos = sorted(set(text)) + list(SPECIALS)
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        return self

    def encode(self, text: str) -> list[int]:
        return [self.stoi.get(c, self.stoi["<unk>"]) for c in text]


class CharUnknownRaises(CharGood):
    def encode(self, text: str) -> list[int]:
        return [self.stoi[c] for c in text]


class CharUnknownDropped(CharGood):
    def encode(self, text: str) -> list[int]:
        return [self.stoi[c] for c in text if c in self.stoi]


class CharDecodeLosesSpecials(CharGood):
    def decode(self, ids: list[int]) -> str:
        return "".join(self.itos[i] for i in ids if i >= 4)


class CharDecodeSpaces(CharGood):
    def decode(self, ids: list[int]) -> str:
        return " ".join(self.itos[i] for i in ids)


class CharSizeWithoutSpecials(CharGood):
    @property
    def vocab_size(self) -> int:
        return len(self.itos) - 4


class CharFitReturnsNone(CharGood):
    def fit(self, text: str) -> None:  # type: ignore[override]
        super().fit(text)


class CharRefitAccumulates(CharGood):
    def fit(self, text: str) -> CharRefitAccumulates:
        seen = set(self.itos[4:]) | set(text)
        self.itos = list(SPECIALS) + sorted(seen)
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        return self


class CharSizeMethod(CharGood):
    def vocab_size(self) -> int:  # type: ignore[override]
        return len(self.itos)


class CharSubclassesKit(kit_tokenizers.Tokenizer):
    """Reuses the kit's machinery (its encode and decode)."""

    def fit(self, text: str) -> CharSubclassesKit:
        self._set_vocab(sorted(set(text)))
        return self

    def tokenize(self, text: str) -> list[str]:
        return list(text)

    def detokenize(self, tokens: list[str]) -> str:
        return "".join(tokens)


class CharWrapsKit:
    def __init__(self) -> None:
        self.tok = kit_tokenizers.CharTokenizer()

    def fit(self, text: str) -> CharWrapsKit:
        self.tok.fit(text)
        return self

    @property
    def vocab_size(self) -> int:
        return self.tok.vocab_size

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


class CharNotImplemented:
    def __init__(self) -> None:
        raise NotImplementedError()


@pytest.mark.parametrize("cls", [CharGood, CharGoodAttribute, KIT_TOKENIZERS.CharTokenizer])
def test_correct_char_tokenizers_pass_every_check(cls) -> None:
    assert _outcomes(CHAR_CHECKS, cls) == dict.fromkeys(CHAR_CHECKS, "")


#: (the mistake, the checks that must fail, words their messages must contain)
CHAR_MISTAKES = [
    (CharFirstSeen, ["visible", "hidden", "edges"], "in the order they first appear"),
    (CharNoSpecials, ["visible", "hidden", "edges"], "characters start at id 0"),
    (CharSpecialsLast, ["visible", "hidden", "edges"], "come after the characters"),
    (CharUnknownRaises, ["visible", "hidden", "edges"], "becomes <unk> (id 3)"),
    (CharUnknownDropped, ["visible", "hidden", "edges"], "drops characters it has not seen"),
    (CharDecodeLosesSpecials, ["visible", "hidden", "edges"], "loses the special ids"),
    (CharDecodeSpaces, ["visible", "hidden", "edges"], "nothing between them"),
    (CharSizeWithoutSpecials, ["visible", "hidden", "edges"], "count the 4 special tokens"),
    (CharFitReturnsNone, ["visible", "hidden", "edges"], "return self"),
    (CharRefitAccumulates, ["edges"], "one id per DISTINCT character fitted"),
    (CharSizeMethod, ["visible", "hidden", "edges"], "it should be an int"),
]


@pytest.mark.parametrize(("cls", "failing", "words"), CHAR_MISTAKES)
def test_char_tokenizer_mistakes_fail_with_a_message_naming_them(cls, failing, words) -> None:
    _expect(_outcomes(CHAR_CHECKS, cls), failing, words)


@pytest.mark.parametrize("cls", [CharSubclassesKit, CharWrapsKit])
def test_char_tokenizer_calling_the_kit_earns_nothing(cls) -> None:
    outcomes = _outcomes(CHAR_CHECKS, cls)
    assert all("does not allow" in msg for msg in outcomes.values()), outcomes
    assert kit_tokenizers.CharTokenizer().fit("ab").encode("ba") == [5, 4]


def test_char_tokenizer_not_implemented_says_so() -> None:
    outcomes = _outcomes(CHAR_CHECKS, CharNotImplemented)
    assert all("not implemented yet" in msg for msg in outcomes.values()), outcomes


# ======================================================================================
# bpe_train
# ======================================================================================

TRAIN_CHECKS = {
    "visible": lab07.check_bpe_train,
    "rules": lab07.check_bpe_train_rules,
    "hidden": lambda f: hidden07.hidden_check_bpe_train(f, seed=711),
    "edges": lambda f: hidden07.hidden_check_bpe_train_edges(f, seed=712),
}


def _merge(word: tuple[str, ...], pair: tuple[str, str], how: str = "ltr") -> tuple[str, ...]:
    """Merge ``pair`` in ``word``: every occurrence left to right (``"ltr"``), right to left
    (``"rtl"``), or the first occurrence only (``"once"``)."""
    if how == "rtl":
        out_r: list[str] = []
        i = len(word) - 1
        while i >= 0:
            if i > 0 and (word[i - 1], word[i]) == pair:
                out_r.append(word[i - 1] + word[i])
                i -= 2
            else:
                out_r.append(word[i])
                i -= 1
        return tuple(reversed(out_r))
    out: list[str] = []
    i = 0
    merged_once = False
    while i < len(word):
        hit = i + 1 < len(word) and (word[i], word[i + 1]) == pair
        if hit and not (how == "once" and merged_once):
            out.append(word[i] + word[i + 1])
            merged_once = True
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def student_bpe_train(
    text: str,
    num_merges: int,
    *,
    words_of: str = "split",
    tie: str = "min",
    overlap: bool = True,
    eow: bool = True,
    weighted: bool = True,
    how: str = "ltr",
    stop: bool = True,
) -> list[tuple[str, str]]:
    """How a student writes it (Counter over words, pairs recounted every step), with the
    typical mistakes as flags."""
    if words_of == "split":
        vocab = Counter(tuple(w) + ((EOW,) if eow else ()) for w in text.split())
    elif words_of == "spaces":
        vocab = Counter([tuple(text.strip())]) if text.strip() else Counter()
    else:  # one chain of all words
        chain = tuple(c for w in text.split() for c in (*w, EOW))
        vocab = Counter([chain]) if chain else Counter()
    merges = []
    for _ in range(num_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for word, freq in vocab.items():
            if overlap:
                for a, b in itertools.pairwise(word):
                    pairs[a, b] += freq if weighted else 1
            else:  # a pair just counted is skipped: "a a a" holds (a, a) only once
                i = 0
                while i + 1 < len(word):
                    pairs[word[i], word[i + 1]] += freq if weighted else 1
                    i += 2 if word[i] == word[i + 1] else 1
        if not pairs:
            if stop:
                break
            raise ValueError("max() arg is an empty sequence")
        if tie == "min":
            best = min(pairs, key=lambda p: (-pairs[p], p))
        elif tie == "first":
            best = pairs.most_common(1)[0][0]
        elif tie == "max":
            best = max(pairs, key=lambda p: (pairs[p], p))
        else:
            best = min(pairs, key=lambda p: (-pairs[p], p[0] + p[1]))
        merges.append(best)
        vocab = Counter({_merge(w, best, how): f for w, f in vocab.items()})
    return merges


def bpe_train_heap(text: str, num_merges: int) -> list[tuple[str, str]]:
    """A correct variant: words as lists of strings, pair counts in a dict, a heap for the max."""
    words = {}
    for w in text.split():
        key = " ".join([*w, EOW])
        words[key] = words.get(key, 0) + 1
    merges = []
    while len(merges) < num_merges:
        counts: dict[tuple[str, str], int] = {}
        for key, freq in words.items():
            symbols = key.split(" ")
            for i in range(len(symbols) - 1):
                counts[symbols[i], symbols[i + 1]] = (
                    counts.get((symbols[i], symbols[i + 1]), 0) + freq
                )
        if not counts:
            break
        best = heapq.nsmallest(1, counts, key=lambda p: (-counts[p], p))[0]
        merges.append(best)
        new = {}
        for key, freq in words.items():
            symbols = key.split(" ")
            out, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            new[" ".join(out)] = freq
        words = new
    return merges


def bpe_train_calls_kit(text: str, num_merges: int) -> list[tuple[str, str]]:
    return kit_tokenizers.bpe_train(text, num_merges)


def bpe_train_uses_kit_tokenizer(text: str, num_merges: int) -> list[tuple[str, str]]:
    return kit_tokenizers.BPETokenizer().fit(text, num_merges).merges


def bpe_train_not_implemented(text: str, num_merges: int) -> list[tuple[str, str]]:
    raise NotImplementedError()


@pytest.mark.parametrize("fn", [student_bpe_train, bpe_train_heap, KIT_TOKENIZERS.bpe_train])
def test_correct_bpe_train_passes_every_check(fn) -> None:
    assert _outcomes(TRAIN_CHECKS, fn) == dict.fromkeys(TRAIN_CHECKS, "")


#: (the mistake, the checks that must fail, words their messages must contain)
TRAIN_MISTAKES = [
    ({"words_of": "chain"}, ["visible", "rules", "hidden", "edges"], "cross word boundaries"),
    ({"words_of": "spaces"}, ["visible", "rules", "hidden", "edges"], "cross word boundaries"),
    ({"tie": "first"}, ["visible", "rules", "hidden", "edges"], "counted first"),
    ({"tie": "max"}, ["visible", "rules", "hidden", "edges"], "the largest pair"),
    ({"tie": "concat"}, ["rules", "hidden", "edges"], "compare the merged strings"),
    (
        {"overlap": False},
        ["visible", "rules", "hidden", "edges"],
        "holds the pair (a, a) TWICE",
    ),
    ({"eow": False}, ["visible", "rules", "hidden", "edges"], "do not end with </w>"),
    ({"weighted": False}, ["visible", "rules", "hidden", "edges"], "how often the word occurs"),
    ({"how": "once"}, ["hidden", "edges"], "only the first occurrence"),
    ({"how": "rtl"}, ["rules", "hidden", "edges"], "merge from the right"),
    ({"stop": False}, ["rules", "edges"], "Stop early when no pair is left"),
]


@pytest.mark.parametrize(("flags", "failing", "words"), TRAIN_MISTAKES)
def test_bpe_train_mistakes_fail_with_a_message_naming_them(flags, failing, words) -> None:
    def fn(text: str, num_merges: int) -> list[tuple[str, str]]:
        return student_bpe_train(text, num_merges, **flags)

    _expect(_outcomes(TRAIN_CHECKS, fn), failing, words)


@pytest.mark.parametrize("fn", [bpe_train_calls_kit, bpe_train_uses_kit_tokenizer])
def test_bpe_train_calling_the_kit_earns_nothing(fn) -> None:
    outcomes = _outcomes(TRAIN_CHECKS, fn)
    assert all("does not allow" in msg for msg in outcomes.values()), outcomes


def test_bpe_train_not_implemented_says_so() -> None:
    outcomes = _outcomes(TRAIN_CHECKS, bpe_train_not_implemented)
    assert all("not implemented yet" in msg for msg in outcomes.values()), outcomes


# ======================================================================================
# bpe_encode
# ======================================================================================

ENCODE_CHECKS = {
    "visible": lab07.check_bpe_encode,
    "hidden": lambda f: hidden07.hidden_check_bpe_encode(f, seed=721),
    "edges": lambda f: hidden07.hidden_check_bpe_encode_edges(f, seed=722),
}


def student_bpe_encode(
    text: str,
    merges: list[tuple[str, str]],
    *,
    order: str = "rank",
    how: str = "ltr",
    until_done: bool = True,
    eow: bool = True,
    per_word: bool = True,
    keep_eow: bool = True,
) -> list[str]:
    """The rank loop of the notebook's answer, with the typical mistakes as flags."""
    rank = {tuple(m): i for i, m in enumerate(merges)}
    units = [[*w, EOW] if eow else list(w) for w in text.split()] if per_word else [list(text)]
    pieces: list[str] = []
    for symbols in units:
        if order == "reverse":
            for pair in reversed(merges):
                symbols = list(_merge(tuple(symbols), tuple(pair)))
        elif order == "sequential_once":
            for pair in merges:
                symbols = list(_merge(tuple(symbols), tuple(pair), "once"))
        else:
            while len(symbols) > 1:
                pairs = [(rank.get(p, math.inf), p) for p in itertools.pairwise(symbols)]
                r, best = min(pairs)
                if r == math.inf:
                    break
                symbols = list(_merge(tuple(symbols), best, how))
                if not until_done:
                    break
        pieces += symbols
    if not keep_eow:
        pieces = [p.replace(EOW, "") for p in pieces if p != EOW]
    return pieces


def bpe_encode_sequential(text: str, merges: list[tuple[str, str]]) -> list[str]:
    """A correct variant: replay the merges one after another, each on the whole word."""
    out = []
    for w in text.split():
        symbols = (*w, EOW)
        for pair in merges:
            symbols = _merge(symbols, tuple(pair))
        out += symbols
    return out


def bpe_encode_longest(text: str, merges: list[tuple[str, str]]) -> list[str]:
    """A mistake: the longest known piece first (as WordPiece does)."""
    known = {a + b for a, b in merges}
    out = []
    for w in text.split():
        s = w + EOW
        i = 0
        while i < len(s):
            j = len(s) if s.startswith(EOW, i) and i == len(s) - len(EOW) else i + 1
            for end in range(len(s), i, -1):
                if s[i:end] in known:
                    j = end
                    break
            out.append(s[i:j])
            i = j
    return out


def bpe_encode_calls_kit(text: str, merges: list[tuple[str, str]]) -> list[str]:
    return kit_tokenizers.bpe_encode(text, merges)


@pytest.mark.parametrize(
    "fn", [student_bpe_encode, bpe_encode_sequential, KIT_TOKENIZERS.bpe_encode]
)
def test_correct_bpe_encode_passes_every_check(fn) -> None:
    assert _outcomes(ENCODE_CHECKS, fn) == dict.fromkeys(ENCODE_CHECKS, "")


#: (the mistake, the checks that must fail, words their messages must contain)
ENCODE_MISTAKES = [
    ({"order": "reverse"}, ["visible", "hidden", "edges"], "came EARLIEST in the list"),
    ({"order": "sequential_once"}, ["visible", "hidden", "edges"], "only the first occurrence"),
    ({"how": "rtl"}, ["visible", "hidden", "edges"], "merge from the right"),
    ({"until_done": False}, ["visible", "hidden", "edges"], "one merge per word"),
    ({"eow": False}, ["visible", "hidden", "edges"], "do not end with </w>"),
    ({"per_word": False}, ["visible", "hidden", "edges"], "whole text as one sequence"),
    ({"keep_eow": False}, ["visible", "hidden", "edges"], "dropped the </w> markers"),
]


@pytest.mark.parametrize(("flags", "failing", "words"), ENCODE_MISTAKES)
def test_bpe_encode_mistakes_fail_with_a_message_naming_them(flags, failing, words) -> None:
    def fn(text: str, merges: list[tuple[str, str]]) -> list[str]:
        return student_bpe_encode(text, merges, **flags)

    _expect(_outcomes(ENCODE_CHECKS, fn), failing, words)


def test_bpe_encode_longest_match_is_named() -> None:
    _expect(_outcomes(ENCODE_CHECKS, bpe_encode_longest), ["visible", "hidden", "edges"], "longest")


def test_bpe_encode_calling_the_kit_earns_nothing() -> None:
    outcomes = _outcomes(ENCODE_CHECKS, bpe_encode_calls_kit)
    assert all("does not allow" in msg for msg in outcomes.values()), outcomes


# ======================================================================================
# apply_temperature, top_k_filter, top_p_filter
# ======================================================================================

TEMPERATURE_CHECKS = {
    "visible": lab07.check_apply_temperature,
    "hidden": lambda f: hidden07.hidden_check_apply_temperature(f, seed=731),
}
TOP_K_CHECKS = {
    "visible": lab07.check_top_k_filter,
    "hidden": lambda f: hidden07.hidden_check_top_k_filter(f, seed=741),
    "edges": lambda f: hidden07.hidden_check_top_k_filter_edges(f, seed=742),
}
TOP_P_CHECKS = {
    "visible": lab07.check_top_p_filter,
    "hidden": lambda f: hidden07.hidden_check_top_p_filter(f, seed=751),
    "edges": lambda f: hidden07.hidden_check_top_p_filter_edges(f, seed=752),
}


def temperature(logits: torch.Tensor, t: float) -> torch.Tensor:
    if t <= 0:
        raise ValueError(f"t={t} must be > 0")
    return logits / t


def temperature_reciprocal(logits: torch.Tensor, t: float) -> torch.Tensor:
    if not t > 0:
        raise ValueError(f"temperature must be positive, got {t}")
    return logits * (1.0 / t)


def temperature_times(logits: torch.Tensor, t: float) -> torch.Tensor:
    if t <= 0:
        raise ValueError("t")
    return logits * t


def temperature_probabilities(logits: torch.Tensor, t: float) -> torch.Tensor:
    if t <= 0:
        raise ValueError("t")
    return torch.softmax(logits / t, dim=-1)


def temperature_in_place(logits: torch.Tensor, t: float) -> torch.Tensor:
    if t <= 0:
        raise ValueError("t")
    return logits.div_(t)


def temperature_no_check(logits: torch.Tensor, t: float) -> torch.Tensor:
    return logits / t


def temperature_log_softmax(logits: torch.Tensor, t: float) -> torch.Tensor:
    if t <= 0:
        raise ValueError("t")
    return torch.log_softmax(logits / t, dim=-1)


def temperature_calls_kit(logits: torch.Tensor, t: float) -> torch.Tensor:
    return kit_generation.apply_temperature(logits, t)


@pytest.mark.parametrize(
    "fn", [temperature, temperature_reciprocal, KIT_GENERATION.apply_temperature]
)
def test_correct_temperatures_pass_every_check(fn) -> None:
    assert _outcomes(TEMPERATURE_CHECKS, fn) == dict.fromkeys(TEMPERATURE_CHECKS, "")


#: (the mistake, the checks that must fail, words their messages must contain)
TEMPERATURE_MISTAKES = [
    (temperature_times, ["visible", "hidden"], "You multiplied by t"),
    (temperature_probabilities, ["visible", "hidden"], "You returned probabilities"),
    (temperature_log_softmax, ["visible", "hidden"], "log-probabilities"),
    (temperature_in_place, ["visible", "hidden"], "in place"),
    (temperature_no_check, ["hidden"], "raise ValueError"),
]


@pytest.mark.parametrize(("fn", "failing", "words"), TEMPERATURE_MISTAKES)
def test_temperature_mistakes_fail_with_a_message_naming_them(fn, failing, words) -> None:
    _expect(_outcomes(TEMPERATURE_CHECKS, fn), failing, words)


def top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k < 1:
        raise ValueError(f"k={k} must be >= 1")
    k = min(k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_k_sorted_loops(logits: torch.Tensor, k: int) -> torch.Tensor:
    """A correct variant: rows one by one, sort instead of topk, float64 inside."""
    if k < 1:
        raise ValueError("k must be positive")
    out = logits.clone()
    flat = out.reshape(-1, logits.shape[-1])
    for row in flat:
        kth = torch.sort(row.double(), descending=True).values[min(k, row.numel()) - 1]
        row[row.double() < kth] = -math.inf
    return out


def top_k_plus_one(logits: torch.Tensor, k: int) -> torch.Tensor:
    return top_k(logits, k + 1)


def top_k_exact(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k < 1:
        raise ValueError("k")
    k = min(k, logits.shape[-1])
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(
        -1, torch.topk(logits, k, dim=-1).indices, True
    )
    return logits.masked_fill(~keep, float("-inf"))


def top_k_in_place(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k < 1:
        raise ValueError("k")
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    logits[logits < kth] = float("-inf")
    return logits


def top_k_zeros(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k < 1:
        raise ValueError("k")
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, 0.0)


def top_k_smallest(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k < 1:
        raise ValueError("k")
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1, largest=False).values[..., -1:]
    return logits.masked_fill(logits > kth, float("-inf"))


def top_k_too_large_fails(logits: torch.Tensor, k: int) -> torch.Tensor:
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_k_calls_kit(logits: torch.Tensor, k: int) -> torch.Tensor:
    return kit_generation.top_k_filter(logits, k)


@pytest.mark.parametrize("fn", [top_k, top_k_sorted_loops, KIT_GENERATION.top_k_filter])
def test_correct_top_k_passes_every_check(fn) -> None:
    assert _outcomes(TOP_K_CHECKS, fn) == dict.fromkeys(TOP_K_CHECKS, "")


#: (the mistake, the checks that must fail, words their messages must contain)
TOP_K_MISTAKES = [
    (top_k_plus_one, ["visible", "hidden", "edges"], "k + 1"),
    (top_k_exact, ["visible", "hidden", "edges"], "ties at that value are all kept"),
    (top_k_in_place, ["visible", "hidden", "edges"], "in place"),
    (top_k_zeros, ["visible", "hidden", "edges"], "not 0"),
    (top_k_smallest, ["visible", "hidden", "edges"], "SMALLEST"),
    (top_k_too_large_fails, ["edges"], "It raised on k above the vocabulary size"),
]


@pytest.mark.parametrize(("fn", "failing", "words"), TOP_K_MISTAKES)
def test_top_k_mistakes_fail_with_a_message_naming_them(fn, failing, words) -> None:
    _expect(_outcomes(TOP_K_CHECKS, fn), failing, words)


def top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    if not 0 < p <= 1:
        raise ValueError(f"p={p} must be in (0, 1]")
    if p == 1:  # every token, though float32 sums may reach 1 early
        return logits.clone()
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    before = probs.cumsum(dim=-1) - probs  # (..., V): mass of the tokens ranked before
    remove = before >= p
    remove[..., 0] = False
    remove = remove.scatter(-1, order, remove)
    return logits.masked_fill(remove, float("-inf"))


def top_p_loops(logits: torch.Tensor, p: float) -> torch.Tensor:
    """A correct variant: rows one by one, Python sorting, exp(x - logsumexp(x))."""
    if p <= 0 or p > 1:
        raise ValueError("p out of range")
    out = logits.clone()
    for row in out.reshape(-1, logits.shape[-1]):
        probs = torch.exp(row.double() - torch.logsumexp(row.double(), dim=0)).tolist()
        order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
        mass = 0.0
        for rank, i in enumerate(order):
            if rank > 0 and mass >= p:
                row[i] = -math.inf
            mass += probs[i]
    return out


def top_p_drops_crossing(logits: torch.Tensor, p: float) -> torch.Tensor:
    if not 0 < p <= 1:
        raise ValueError("p")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    cumulative = torch.softmax(sorted_logits.float(), dim=-1).cumsum(dim=-1)
    remove = cumulative > p
    remove[..., 0] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))


def top_p_unsorted(logits: torch.Tensor, p: float) -> torch.Tensor:
    if not 0 < p <= 1:
        raise ValueError("p")
    if p == 1:  # the one mistake: no sorting (p = 1 keeps every token, as it should)
        return logits.clone()
    probs = torch.softmax(logits.float(), dim=-1)
    remove = probs.cumsum(dim=-1) - probs >= p
    remove[..., 0] = False
    return logits.masked_fill(remove, float("-inf"))


def top_p_high_ids_first(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Sorts ascending (stable) and flips: equal probabilities come higher id first."""
    if not 0 < p <= 1:
        raise ValueError("p")
    if p == 1:
        return logits.clone()
    ascending, order = torch.sort(logits, dim=-1, stable=True)
    sorted_logits, order = ascending.flip(-1), order.flip(-1)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    remove = probs.cumsum(dim=-1) - probs >= p
    remove[..., 0] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))


def top_p_in_place(logits: torch.Tensor, p: float) -> torch.Tensor:
    out = top_p(logits, p)
    logits.copy_(out)
    return logits


def top_p_no_range_check(logits: torch.Tensor, p: float) -> torch.Tensor:
    if p == 1:
        return logits.clone()
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    remove = probs.cumsum(dim=-1) - probs >= p
    remove[..., 0] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))


def top_p_sums_to_one_early(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Right but for p = 1, where a float32 running sum reaches 1 before the last tokens."""
    if not 0 < p <= 1:
        raise ValueError(f"p={p} must be in (0, 1]")
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    remove = probs.cumsum(dim=-1) - probs >= p
    remove[..., 0] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))


def top_p_calls_kit(logits: torch.Tensor, p: float) -> torch.Tensor:
    return kit_generation.top_p_filter(logits, p)


@pytest.mark.parametrize("fn", [top_p, top_p_loops, KIT_GENERATION.top_p_filter])
def test_correct_top_p_passes_every_check(fn) -> None:
    assert _outcomes(TOP_P_CHECKS, fn) == dict.fromkeys(TOP_P_CHECKS, "")


#: (the mistake, the checks that must fail, words their messages must contain)
TOP_P_MISTAKES = [
    (top_p_drops_crossing, ["visible", "hidden", "edges"], "drop the token that crosses p"),
    (top_p_unsorted, ["visible", "hidden", "edges"], "token-id order"),
    (top_p_high_ids_first, ["visible", "edges"], "LOWEST id first"),
    (top_p_in_place, ["visible", "hidden", "edges"], "in place"),
    (top_p_no_range_check, ["edges"], "raise ValueError"),
    (top_p_sums_to_one_early, ["edges"], "expected [[30.0, 10.0, 9.0, 9.0, -1.0]]"),
]


@pytest.mark.parametrize(("fn", "failing", "words"), TOP_P_MISTAKES)
def test_top_p_mistakes_fail_with_a_message_naming_them(fn, failing, words) -> None:
    _expect(_outcomes(TOP_P_CHECKS, fn), failing, words)


@pytest.mark.parametrize(
    ("fn", "checks"),
    [
        (temperature_calls_kit, TEMPERATURE_CHECKS),
        (top_k_calls_kit, TOP_K_CHECKS),
        (top_p_calls_kit, TOP_P_CHECKS),
    ],
)
def test_filters_calling_the_kit_earn_nothing(fn, checks) -> None:
    outcomes = _outcomes(checks, fn)
    assert all("does not allow" in msg for msg in outcomes.values()), outcomes


# ======================================================================================
# beam_search
# ======================================================================================

BEAM_CHECKS = {
    "visible": lab07.check_beam_search,
    "eos": lab07.check_beam_search_eos,
    "hidden": lambda f: hidden07.hidden_check_beam_search(f, seed=761),
    "rules": lambda f: hidden07.hidden_check_beam_search_rules(f, seed=762),
}


def student_beam(
    step_fn: Callable[[list[int]], torch.Tensor],
    bos_id: int,
    eos_id: int,
    beam_width: int,
    max_len: int,
    *,
    score: str = "logp",
    per_beam: str = "width",
    refill: bool = True,
    early: str = "rule",
    final: str = "sum",
    order: str = "stable",
    final_ties: str = "first",
    extend_finished: bool = False,
    count_bos: bool = True,
    with_bos: bool = True,
) -> list[int]:
    """Lists of (score, tokens), Python sorting; the typical mistakes as flags."""
    beams = [(0.0, [bos_id])]
    finished: list[tuple[float, list[int]]] = []
    limit = max_len if count_bos else max_len + 1
    while beams and len(beams[0][1]) < limit:
        proposals = []
        for total, seq in beams:
            logp = step_fn(seq)
            k = {"width": beam_width, "all": logp.numel(), "one": 1}[per_beam]
            ranked = sorted(range(logp.numel()), key=lambda i: (-float(logp[i]), i))[:k]
            for token in ranked:
                lp = float(logp[token])
                n = len(seq)  # generated tokens once this one is added
                new = {
                    "logp": total + lp,
                    "last": lp,
                    "prob": total + math.exp(lp),
                    "mean": (total * (n - 1) + lp) / n,  # length-normalised at every step
                }[score]
                proposals.append((new, [*seq, token]))
        if order == "stable":
            proposals.sort(key=lambda c: -c[0])
        else:
            proposals.sort(key=lambda c: (c[0], c[1]), reverse=True)
        top = proposals[:beam_width]
        if extend_finished:
            beams = top
            continue
        finished += [c for c in top if c[1][-1] == eos_id]
        pool = proposals if refill else top
        beams = [c for c in pool if c[1][-1] != eos_id][:beam_width]
        if early == "first" and finished:
            return finished[0][1]
        if early == "rule" and finished and beams and max(f[0] for f in finished) >= beams[0][0]:
            break
    candidates = finished + beams if not (final == "finished" and finished) else finished
    if final == "mean":
        key = [c[0] / max(1, len(c[1]) - 1) for c in candidates]
    else:
        key = [c[0] for c in candidates]
    best = max(key)
    index = key.index(best) if final_ties == "first" else len(key) - 1 - key[::-1].index(best)
    seq = candidates[index][1]
    return seq if with_bos else seq[1:]


def beam_tensors(step_fn, bos_id: int, eos_id: int, beam_width: int, max_len: int) -> list[int]:
    """A correct variant: scores in a tensor, a stable sort over (beams x beam_width) proposals,
    no early stop (runs until every beam has finished or max_len)."""
    seqs = [[bos_id]]
    scores = torch.zeros(1, dtype=torch.float64)
    finished: list[tuple[float, list[int]]] = []
    while seqs and len(seqs[0]) < max_len:
        logp = torch.stack([step_fn(s).double() for s in seqs])  # (B, V)
        k = min(beam_width, logp.shape[1])
        top = torch.sort(logp, dim=-1, descending=True, stable=True)
        cand = (scores[:, None] + top.values[:, :k]).flatten()  # (B * k,)
        tokens = top.indices[:, :k].flatten()
        order = torch.sort(cand, descending=True, stable=True).indices
        new_seqs, new_scores = [], []
        for rank, j in enumerate(order.tolist()):
            seq = [*seqs[j // k], int(tokens[j])]
            if seq[-1] == eos_id:
                if rank < beam_width:
                    finished.append((float(cand[j]), seq))
            elif len(new_seqs) < beam_width:
                new_seqs.append(seq)
                new_scores.append(float(cand[j]))
        seqs, scores = new_seqs, torch.tensor(new_scores, dtype=torch.float64)
    pool = finished + list(zip(scores.tolist(), seqs, strict=True))
    return max(pool, key=lambda c: c[0])[1]


def beam_calls_kit(step_fn, bos_id: int, eos_id: int, beam_width: int, max_len: int) -> list[int]:
    return kit_generation.beam_search(step_fn, bos_id, eos_id, beam_width, max_len)


@pytest.mark.parametrize(
    "fn",
    [
        student_beam,
        beam_tensors,
        KIT_GENERATION.beam_search,
        lambda *a: student_beam(*a, per_beam="all"),
        lambda *a: student_beam(*a, refill=False),
        lambda *a: student_beam(*a, early="none"),
    ],
    ids=["lists", "tensors", "kit-copy", "propose-all", "no-refill", "no-early-stop"],
)
def test_correct_beam_searches_pass_every_check(fn) -> None:
    assert _outcomes(BEAM_CHECKS, fn) == dict.fromkeys(BEAM_CHECKS, "")


#: (the mistake, the checks that must fail, words their messages must contain)
BEAM_MISTAKES = [
    ({"score": "last"}, ["visible", "hidden", "rules"], "not accumulated"),
    ({"score": "prob"}, ["hidden", "rules"], "You add probabilities"),
    ({"per_beam": "one"}, ["visible", "eos", "hidden", "rules"], "not only its best one"),
    ({"early": "first"}, ["visible", "eos", "hidden"], "first hypothesis that produced"),
    ({"final": "mean", "early": "none"}, ["eos", "hidden", "rules"], "mean log-probability"),
    ({"score": "mean"}, ["hidden", "rules"], "at every step"),
    ({"final": "finished"}, ["eos", "hidden"], "only returned a finished"),
    ({"order": "reverse"}, ["rules"], "ties go the wrong way"),
    ({"final_ties": "last", "early": "none"}, ["rules"], "takes the last"),
    (
        {"extend_finished": True},
        ["visible", "eos", "hidden", "rules"],
        "already ended with EOS",
    ),
    ({"count_bos": False}, ["eos", "hidden", "rules"], "max_len counts every token"),
    ({"with_bos": False}, ["visible", "eos", "hidden", "rules"], "starting with BOS"),
]


@pytest.mark.parametrize(("flags", "failing", "words"), BEAM_MISTAKES)
def test_beam_search_mistakes_fail_with_a_message_naming_them(flags, failing, words) -> None:
    def fn(step_fn, bos_id, eos_id, beam_width, max_len):
        return student_beam(step_fn, bos_id, eos_id, beam_width, max_len, **flags)

    _expect(_outcomes(BEAM_CHECKS, fn), failing, words)


def test_beam_search_calling_the_kit_earns_nothing() -> None:
    outcomes = _outcomes(BEAM_CHECKS, beam_calls_kit)
    assert all("does not allow" in msg for msg in outcomes.values()), outcomes


# ======================================================================================
# The oracles and the worked examples
# ======================================================================================


def test_oracles_agree_with_the_kit() -> None:
    # The oracles are independent code: on random inputs they agree with the kit's answers.
    g = torch.Generator().manual_seed(0)
    text = hidden07._random_words(g, "abcde", 80)
    merges = hidden07.oracle_bpe_train(text, 40)
    assert merges == kit_tokenizers.bpe_train(text, 40)
    assert hidden07.oracle_bpe_encode(text, merges) == kit_tokenizers.bpe_encode(text, merges)
    tok = kit_tokenizers.CharTokenizer().fit(text)
    assert hidden07.oracle_char_encode(text, text + "Z") == tok.encode(text + "Z")
    logits = torch.randn(4, 9, generator=g)
    torch.testing.assert_close(
        hidden07.oracle_top_k_filter(logits, 3), kit_generation.top_k_filter(logits, 3).double()
    )
    torch.testing.assert_close(
        hidden07.oracle_top_p_filter(logits, 0.7), kit_generation.top_p_filter(logits, 0.7).double()
    )
    step_fn = lab07.RandomStepFn(7, 3, bos_id=0, eos_id=1, max_len=6)
    for width in (1, 2, 4):
        want = kit_generation.beam_search(step_fn.row, 0, 1, width, 6)
        assert hidden07.oracle_beam_search(step_fn, width) == want


def test_worked_examples_are_the_documented_ones() -> None:
    # What the notebook tells students about its examples.
    assert hidden07.oracle_bpe_train("aaa", 3) == [("a", "a"), ("a", EOW), ("aa", "a" + EOW)]
    assert hidden07.oracle_bpe_train("ab ac", 2) == [("a", "b"), ("a", "c")]
    step_fn = lab07.TableStepFn(hidden07.LECTURE_TABLE)
    beams = {w: hidden07.oracle_beam_search(step_fn, w) for w in (1, 2, 3)}
    assert beams == {1: [0, 2, 4, 1], 2: [0, 3, 4, 6, 1], 3: [0, 3, 4, 6, 1]}
    assert math.isclose(math.exp(lab07.sequence_score(step_fn, beams[1])), 0.0525, rel_tol=1e-5)
    assert math.isclose(math.exp(lab07.sequence_score(step_fn, beams[2])), 0.2601, rel_tol=1e-5)


def test_generated_checks_keep_their_names_and_read_their_cases_back() -> None:
    # The checks generated from a part (checks/_generated.py) are called by name from the test
    # cells and wrapped by name by the guard; their stored cases come back as the call's args.
    for check in (lab07.check_bpe_train, lab07.check_top_p_filter, lab07.check_beam_search_eos):
        assert check.__name__.startswith("check_") and check.__doc__
    assert hidden07.hidden_check_bpe_train.__name__ == "hidden_check_bpe_train"
    logits, p = lab07.TOP_P.examples("check_top_p_filter")[0].args
    assert logits.dtype == torch.float32 and logits.shape == (4,) and p == 0.65
    step_fn, width = lab07.BEAM.examples("check_beam_search")[1].args
    assert isinstance(step_fn, lab07.TableStepFn) and width == 2


def test_stored_examples_keep_only_the_mistakes_that_differ() -> None:
    # A mistake that gives the expected output on an example is left out (it matches there).
    stored = hidden07.BPE_TRAIN.fixtures("x", [("ab ac", 2)])
    want = stored["x 0"]["expected"]
    assert stored["x: cases"]["expected"] == [["ab ac", 2]] and want == [["a", "b"], ["a", "c"]]
    assert stored["x 0"]["mistakes"] and want not in stored["x 0"]["mistakes"].values()
    mistakes = hidden07.BPE_TRAIN.mistakes("ab ac", 2)
    assert set(stored["x 0"]["mistakes"]) < set(mistakes)  # counting once agrees here, ...
    with pytest.raises(ValueError, match="oracle"):
        lab07.BPE_TRAIN.judge(student_bpe_train, [_generated.Given(("ab", 1))])


def test_fixtures_are_up_to_date() -> None:
    from transformer_lab.grading.fixtures import check_fixtures

    assert check_fixtures(Path(__file__).resolve().parents[1], ["07_nlp_pipeline"]) == []


def test_the_lab_07_diagrams_draw() -> None:
    from matplotlib.figure import Figure

    from transformer_lab import diagrams

    merges = hidden07.oracle_bpe_train(hidden07.RHYME, 5)
    words = ["sea", "seas"]
    steps = [[hidden07.oracle_bpe_encode(w, merges[:k]) for w in words] for k in (0, 5)]
    assert isinstance(diagrams.bpe_merges_figure(words, steps, ["0", "5"]), Figure)
    with pytest.raises(ValueError, match="labels"):
        diagrams.bpe_merges_figure(words, steps, ["0"])
    assert isinstance(
        diagrams.one_hot_lookup([4, 5, 4], ["a", "b", "a"], torch.randn(7, 3)), Figure
    )
    probs = torch.softmax(torch.randn(5), -1)
    assert isinstance(diagrams.decoding_distributions({"p": probs}, list("abcde")), Figure)
    spec = hidden07.LECTURE_TABLE
    table = {tuple(json.loads(k)): v for k, v in spec["table"].items()}
    figure = diagrams.beam_tree(table, spec["words"], {"greedy": [0, 2, 4, 1]}, min_prob=0.25)
    assert isinstance(figure, Figure)

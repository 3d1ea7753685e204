"""Tokenizers: characters, words and byte-pair encoding (BPE), with JSON save/load.

A Transformer reads integer ids, so text must first be cut into *tokens* and each token given an
id. This module holds the three classic choices the NLP-pipeline lab compares:

* :class:`CharTokenizer`: one token per character. Tiny vocabulary, long sequences, never an
  unknown word (only unknown characters).
* :class:`WordTokenizer`: one token per word or punctuation mark. Short sequences, but a huge
  vocabulary and every unseen word becomes ``<unk>``.
* :class:`BPETokenizer`: byte-pair encoding at the character level (Sennrich et al.). Start from
  characters and repeatedly merge the most frequent adjacent pair; frequent words end up as one
  token, rare words as a few sub-word pieces. Built on the module-level functions
  :func:`bpe_train` and :func:`bpe_encode`.

Conventions shared by all three:

* Special tokens come first: by default ``<pad>``=0, ``<bos>``=1, ``<eos>``=2, ``<unk>``=3, matching
  the kit's DataModules (pad=0, bos=1, eos=2). ``specials`` can be changed; ``unk=None`` makes an
  unknown character/word raise ``ValueError`` instead of mapping to ``<unk>`` (our choice by
  default is ``<unk>``: a tokenizer fitted on a training split must still read a validation split).
* Special tokens are never produced from text: ``encode("<pad>")`` spells the characters out.
  ``encode(..., add_bos=True, add_eos=True)`` adds them explicitly.
* ``decode(encode(text)) == text`` for :class:`CharTokenizer` (any text made of known
  characters); for the other two it holds up to whitespace: :class:`WordTokenizer` writes one
  space between words and none before closing punctuation, :class:`BPETokenizer` joins words
  with single spaces (whitespace runs, newlines included, become one space, as in the paper).
* BPE uses a separate end-of-word symbol ``</w>`` appended to every word before training, so a
  piece that ends a word ("er</w>") differs from the same letters inside one ("er"). Ties between
  equally frequent pairs go to the lexicographically smallest pair, which makes training
  deterministic.

Lab 07 (the NLP pipeline) grades :meth:`CharTokenizer.fit`, :func:`bpe_train` and
:func:`bpe_encode` (with their helpers ``_merge_pair`` and ``_encode_word``), marked
``@graded``: the student package leaves them out until the lab's deadline. The rest stays in:
the DataModules (synthetic tasks, Tiny Shakespeare's fixed alphabet via
:meth:`CharTokenizer.from_symbols`) and ``transformer-lab generate`` encode and decode with
:class:`CharTokenizer` from lab 04 on, so its ``encode``/``decode`` are shared machinery, not
locked. Before lab 07's deadline a student package cannot fit a :class:`CharTokenizer` on a
text (``CharCorpusDataModule(path=...)``) nor use :class:`BPETokenizer`.

Reference: R. Sennrich, B. Haddow, A. Birch, "Neural Machine Translation of Rare Words with
Subword Units", ACL 2016 (algorithm 1).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any, ClassVar

from torch import Tensor

from transformer_lab.graded import graded

__all__ = [
    "DEFAULT_SPECIALS",
    "END_OF_WORD",
    "BPETokenizer",
    "CharTokenizer",
    "Tokenizer",
    "WordTokenizer",
    "bpe_encode",
    "bpe_train",
    "load_tokenizer",
    "tokenizer_from_dict",
]

DEFAULT_SPECIALS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>")
END_OF_WORD = "</w>"
_FORMAT = "transformer_lab.tokenizer"
_VERSION = 1


# ----------------------------------------------------------------------------- base class


class Tokenizer:
    """Shared machinery: special tokens, the id <-> token tables, save/load.

    Subclasses define how text is cut into tokens (:meth:`tokenize`) and glued back
    (:meth:`detokenize`). Ids ``0 .. len(specials)-1`` are the special tokens; the learned
    vocabulary follows in a deterministic order.

    Args:
        specials: names of the special tokens, in id order.
        unk: which special stands for unknown tokens; None to raise ``ValueError`` instead.

    Raises:
        ValueError: if specials repeat or ``unk`` is not one of them.
    """

    kind: ClassVar[str] = ""

    def __init__(
        self, specials: Sequence[str] = DEFAULT_SPECIALS, unk: str | None = "<unk>"
    ) -> None:
        specials = tuple(specials)
        if len(set(specials)) != len(specials):
            raise ValueError(f"specials={specials} contains duplicates")
        if unk is not None and unk not in specials:
            raise ValueError(f"unk={unk!r} is not one of specials={specials}")
        self.specials = specials
        self.unk = unk
        self._set_vocab([])

    # -- vocabulary --------------------------------------------------------------------------

    def _set_vocab(self, tokens: Iterable[str]) -> None:
        tokens = list(tokens)
        if len(set(tokens)) != len(tokens):
            dupes = sorted(t for t, c in Counter(tokens).items() if c > 1)
            raise ValueError(f"vocabulary contains duplicate tokens: {dupes[:10]}")
        self.vocab: list[str] = tokens  # learned tokens; id = len(specials) + index
        self._ids = {t: i + len(self.specials) for i, t in enumerate(tokens)}

    @property
    def vocab_size(self) -> int:
        """Number of ids: special tokens plus the learned vocabulary."""
        return len(self.specials) + len(self.vocab)

    def _special_id(self, name: str) -> int | None:
        return self.specials.index(name) if name in self.specials else None

    @property
    def pad_id(self) -> int | None:
        """Id of ``<pad>`` (None when absent)."""
        return self._special_id("<pad>")

    @property
    def bos_id(self) -> int | None:
        """Id of ``<bos>`` (None when absent)."""
        return self._special_id("<bos>")

    @property
    def eos_id(self) -> int | None:
        """Id of ``<eos>`` (None when absent)."""
        return self._special_id("<eos>")

    @property
    def unk_id(self) -> int | None:
        """Id of the unknown token (None when unknown tokens raise)."""
        return None if self.unk is None else self.specials.index(self.unk)

    def token_to_id(self, token: str) -> int:
        """Id of a learned token; unknown tokens map to ``<unk>`` or raise ``ValueError``."""
        found = self._ids.get(token)
        if found is not None:
            return found
        if self.unk is None:
            raise ValueError(
                f"token {token!r} is not in the vocabulary of this {type(self).__name__} "
                "(built with unk=None); fit on text that contains it or allow unk='<unk>'"
            )
        return self.specials.index(self.unk)

    def id_to_token(self, index: int) -> str:
        """The token (or special name) of an id.

        Raises:
            ValueError: if ``index`` is outside ``[0, vocab_size)``.
        """
        if not 0 <= index < self.vocab_size:
            raise ValueError(f"id {index} is outside the vocabulary [0, {self.vocab_size})")
        n = len(self.specials)
        return self.specials[index] if index < n else self.vocab[index - n]

    # -- text <-> ids ------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[str]:
        """Cut text into tokens (strings); subclasses define how."""
        raise NotImplementedError

    def detokenize(self, tokens: list[str]) -> str:
        """Glue tokens back into text; subclasses define how."""
        raise NotImplementedError

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Text to ids.

        Args:
            text: the string to encode.
            add_bos: prepend ``<bos>``.
            add_eos: append ``<eos>``.

        Returns:
            A list of ints in ``[0, vocab_size)``.

        Raises:
            ValueError: for unknown tokens when ``unk`` is None, or a missing ``<bos>``/``<eos>``.
        """
        ids = [self.token_to_id(t) for t in self.tokenize(text)]
        if add_bos:
            ids.insert(0, self._require_special("<bos>"))
        if add_eos:
            ids.append(self._require_special("<eos>"))
        return ids

    def decode(self, ids: Sequence[int] | Tensor, *, skip_special: bool = False) -> str:
        """Ids to text.

        Args:
            ids: a list of ints or a 1-D tensor ``(T,)``.
            skip_special: drop special tokens instead of writing their names (e.g. ``<pad>``).

        Returns:
            The text.

        Raises:
            ValueError: for an id outside the vocabulary or a tensor that is not 1-D.
        """
        if isinstance(ids, Tensor):
            if ids.dim() != 1:
                raise ValueError(
                    f"decode expects a 1-D tensor of ids, got shape {tuple(ids.shape)}"
                )
            ids = ids.tolist()
        n = len(self.specials)
        out: list[str] = []
        pending: list[str] = []
        for index in ids:
            token = self.id_to_token(int(index))
            if int(index) < n:
                if skip_special:
                    continue
                # A special is written verbatim, separated from the text around it.
                if pending:
                    out.append(self.detokenize(pending))
                    pending = []
                out.append(token)
            else:
                pending.append(token)
        if pending:
            out.append(self.detokenize(pending))
        return self._join_segments(out)

    def _join_segments(self, segments: list[str]) -> str:
        return "".join(segments)

    def _require_special(self, name: str) -> int:
        found = self._special_id(name)
        if found is None:
            raise ValueError(f"{name} is not among specials={self.specials}")
        return found

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, specials={self.specials})"

    # -- persistence -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild the tokenizer, as JSON-friendly data."""
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "type": self.kind,
            "specials": list(self.specials),
            "unk": self.unk,
            "vocab": list(self.vocab),
            **self._extra_state(),
        }

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore subclass fields; ``state`` has been checked by :func:`tokenizer_from_dict`."""

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> Tokenizer:
        """Rebuild a tokenizer saved by :meth:`to_dict`.

        Raises:
            ValueError: if ``state`` is malformed or holds another kind of tokenizer.
        """
        tok = tokenizer_from_dict(state)
        if cls is not Tokenizer and not isinstance(tok, cls):
            raise ValueError(f"state holds a {type(tok).__name__}, not a {cls.__name__}")
        return tok

    def save(self, path: str | Path) -> None:
        """Write the tokenizer to ``path`` as JSON (UTF-8)."""
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False, indent=1), "utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Read a tokenizer written by :meth:`save`.

        Raises:
            FileNotFoundError: if ``path`` does not exist.
            ValueError: if the file is not valid JSON, not a tokenizer file, or malformed.
        """
        text = Path(path).read_text("utf-8")
        try:
            state = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not a valid tokenizer file: not JSON ({err})") from None
        try:
            return cls.from_dict(state)
        except ValueError as err:
            raise ValueError(f"{path} is not a valid tokenizer file: {err}") from None


def _check_str_list(state: dict[str, Any], key: str) -> list[str]:
    value = state.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"'{key}' must be a list of strings, got {type(value).__name__}")
    return value


def tokenizer_from_dict(state: dict[str, Any]) -> Tokenizer:
    """Rebuild whichever tokenizer ``state`` (from :meth:`Tokenizer.to_dict`) describes.

    Raises:
        ValueError: naming the first problem found (wrong format, unknown type, missing or
            ill-typed field).
    """
    if not isinstance(state, dict):
        raise ValueError(f"expected a JSON object, got {type(state).__name__}")
    if state.get("format") != _FORMAT:
        raise ValueError(f"'format' is {state.get('format')!r}, expected {_FORMAT!r}")
    if state.get("version") != _VERSION:
        raise ValueError(f"'version' is {state.get('version')!r}, this kit reads {_VERSION}")
    kinds = {c.kind: c for c in (CharTokenizer, WordTokenizer, BPETokenizer)}
    kind = state.get("type")
    if kind not in kinds:
        raise ValueError(f"'type' is {kind!r}, expected one of {sorted(kinds)}")
    specials = _check_str_list(state, "specials")
    vocab = _check_str_list(state, "vocab")
    unk = state.get("unk")
    if unk is not None and not isinstance(unk, str):
        raise ValueError(f"'unk' must be a string or null, got {type(unk).__name__}")
    tok = kinds[kind](specials=specials, unk=unk)
    tok._load_extra_state(state)
    tok._set_vocab(vocab)
    return tok


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Read any tokenizer saved with :meth:`Tokenizer.save` (the JSON names its type)."""
    return Tokenizer.load(path)


# ----------------------------------------------------------------------------- characters


class CharTokenizer(Tokenizer):
    """One token per character.

    How to use::

        tok = CharTokenizer().fit("hello world")
        ids = tok.encode("hello")       # [7, 6, 8, 8, 9]: 4 specials, then " dehlorw"
        tok.decode(ids)                 # "hello"
        tok.vocab_size                  # 12

    Args:
        specials: special token names, ids ``0 ..``; default pad, bos, eos, unk.
        unk: the special for unknown characters, or None to raise ``ValueError`` on them.
    """

    kind: ClassVar[str] = "char"

    @graded("07_nlp_pipeline")
    def fit(self, text: str) -> CharTokenizer:
        """Build the vocabulary: every distinct character of ``text``, sorted by code point.

        Returns:
            ``self``, so ``CharTokenizer().fit(text)`` reads naturally.
        """
        self._set_vocab(sorted(set(text)))
        return self

    @classmethod
    def from_symbols(
        cls,
        symbols: Iterable[str],
        specials: Sequence[str] = DEFAULT_SPECIALS,
        unk: str | None = None,
    ) -> CharTokenizer:
        """A tokenizer over a fixed alphabet, in the given order (no fitting).

        Used for synthetic tasks: ``from_symbols("0123456789", specials=("<pad>", "<bos>",
        "<eos>"))`` gives digit ``d`` the id ``3 + d``.

        Raises:
            ValueError: if a symbol is not a single character or repeats.
        """
        symbols = list(symbols)
        bad = [s for s in symbols if len(s) != 1]
        if bad:
            raise ValueError(f"symbols must be single characters, got {bad[:5]}")
        if unk is not None and unk not in specials:
            unk = None
        tok = cls(specials=specials, unk=unk)
        tok._set_vocab(symbols)
        return tok

    def tokenize(self, text: str) -> list[str]:
        """The characters of ``text``."""
        return list(text)

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Text to ids, one per character (see :meth:`Tokenizer.encode`)."""
        lookup = self._ids.get
        ids = [lookup(c, -1) for c in text]  # one dict lookup per character: corpora are long
        if -1 in ids:
            first = ids.index(-1)
            unknown = self.token_to_id(text[first])  # raises when unk is None
            ids = [unknown if i == -1 else i for i in ids]
        if add_bos:
            ids.insert(0, self._require_special("<bos>"))
        if add_eos:
            ids.append(self._require_special("<eos>"))
        return ids

    def detokenize(self, tokens: list[str]) -> str:
        """Concatenate characters."""
        return "".join(tokens)


# ----------------------------------------------------------------------------- words

# A word is letters/digits/underscore, with inner apostrophes ("don't"); any other non-space
# character is a token of its own.
_WORD_RE = re.compile(r"\w+(?:'\w+)*|[^\w\s]")
_NO_SPACE_BEFORE = frozenset(".,;:!?)]}%")
_NO_SPACE_AFTER = frozenset("([{$")


class WordTokenizer(Tokenizer):
    """One token per word or punctuation mark.

    Text is split into words (``\\w+`` with inner apostrophes) and single punctuation characters;
    whitespace only separates tokens. Decoding writes one space between tokens except before
    ``.,;:!?)]}%`` and after ``([{$``, so ordinary prose round-trips exactly.

    How to use::

        tok = WordTokenizer().fit("the man ate the fish. the fish ate the man.")
        tok.encode("the fish ate")      # [4, 7, 6]: "the" is most frequent
        tok.decode(tok.encode("the man ate the fish."))  # "the man ate the fish."

    Args:
        specials: special token names, ids ``0 ..``; default pad, bos, eos, unk.
        unk: the special for unknown words, or None to raise ``ValueError`` on them.
        lower: lowercase text before splitting.
    """

    kind: ClassVar[str] = "word"

    def __init__(
        self,
        specials: Sequence[str] = DEFAULT_SPECIALS,
        unk: str | None = "<unk>",
        lower: bool = False,
    ) -> None:
        super().__init__(specials=specials, unk=unk)
        self.lower = lower

    def fit(self, text: str, *, min_freq: int = 1, max_size: int | None = None) -> WordTokenizer:
        """Build the vocabulary from ``text``: most frequent first, ties alphabetical.

        Args:
            text: training text.
            min_freq: drop tokens seen fewer times.
            max_size: keep at most this many learned tokens (specials not counted).

        Returns:
            ``self``.
        """
        if min_freq < 1:
            raise ValueError(f"min_freq={min_freq} must be >= 1")
        if max_size is not None and max_size < 0:
            raise ValueError(f"max_size={max_size} must be >= 0")
        counts = Counter(self.tokenize(text))
        ranked = sorted(
            (t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t)
        )
        self._set_vocab(ranked if max_size is None else ranked[:max_size])
        return self

    @classmethod
    def from_vocab(
        cls,
        words: Iterable[str],
        specials: Sequence[str] = DEFAULT_SPECIALS,
        unk: str | None = "<unk>",
        lower: bool = False,
    ) -> WordTokenizer:
        """A tokenizer over a fixed list of words, in the given order (no fitting)."""
        tok = cls(specials=specials, unk=unk, lower=lower)
        tok._set_vocab(words)
        return tok

    def tokenize(self, text: str) -> list[str]:
        """Words and punctuation marks of ``text`` (lowercased when ``lower``)."""
        return _WORD_RE.findall(text.lower() if self.lower else text)

    def detokenize(self, tokens: list[str]) -> str:
        """Join tokens with single spaces, none before closing or after opening punctuation."""
        out: list[str] = []
        for token in tokens:
            if out and token not in _NO_SPACE_BEFORE and out[-1] not in _NO_SPACE_AFTER:
                out.append(" ")
            out.append(token)
        return "".join(out)

    def _join_segments(self, segments: list[str]) -> str:
        return " ".join(segments)

    def _extra_state(self) -> dict[str, Any]:
        return {"lower": self.lower}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        lower = state.get("lower", False)
        if not isinstance(lower, bool):
            raise ValueError(f"'lower' must be true or false, got {lower!r}")
        self.lower = lower


# ----------------------------------------------------------------------------- BPE


def _words(text: str) -> list[str]:
    return text.split()


@graded("07_nlp_pipeline")
def _merge_pair(symbols: Sequence[str], pair: tuple[str, str]) -> list[str]:
    """Replace each non-overlapping occurrence of ``pair`` (left to right) by one symbol."""
    first, second = pair
    out: list[str] = []
    i = 0
    while i < len(symbols):
        if i + 1 < len(symbols) and symbols[i] == first and symbols[i + 1] == second:
            out.append(first + second)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


@graded("07_nlp_pipeline")
def bpe_train(text: str, num_merges: int) -> list[tuple[str, str]]:
    """Learn BPE merges from ``text``.

    Words are the whitespace-separated pieces of ``text``; each becomes its characters followed by
    ``</w>``. Each step counts adjacent symbol pairs over all words (weighted by word frequency,
    overlapping occurrences such as the two ``(a, a)`` in "aaa" both counted), merges the most
    frequent pair everywhere, and records it. Ties go to the smallest pair in Python's string
    order. Training stops early when no pair is left (every word is one symbol).

    Example: ``bpe_train("low low lower", 2)`` counts ``(l, o)`` and ``(o, w)`` 3 times each, so
    merges ``(l, o)`` first (it sorts first), then ``(lo, w)`` (3 times).

    Args:
        text: training text.
        num_merges: how many merges to learn (at most).

    Returns:
        The merges in the order learned, e.g. ``[("l", "o"), ("lo", "w")]``.

    Raises:
        ValueError: if ``num_merges`` is negative.
    """
    if num_merges < 0:
        raise ValueError(f"num_merges={num_merges} must be >= 0")
    counts = Counter(_words(text))
    words = [[*w, END_OF_WORD] for w in counts]
    freq = list(counts.values())
    # Pair counts are updated incrementally: only words that contain the merged pair change.
    pair_counts: Counter[tuple[str, str]] = Counter()
    where: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
    for i, symbols in enumerate(words):
        for pair in pairwise(symbols):
            pair_counts[pair] += freq[i]
            where[pair].add(i)

    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges and pair_counts:
        best = min(pair_counts, key=lambda p: (-pair_counts[p], p))
        merges.append(best)
        for i in sorted(where.pop(best)):
            old = words[i]
            new = _merge_pair(old, best)
            if len(new) == len(old):  # stale index entry: the pair is gone from this word
                continue
            for pair in pairwise(old):
                pair_counts[pair] -= freq[i]
                if pair_counts[pair] == 0:
                    del pair_counts[pair]
            for pair in pairwise(new):
                pair_counts[pair] += freq[i]
                where[pair].add(i)
            words[i] = new
    return merges


@graded("07_nlp_pipeline")
def _encode_word(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Apply merges to one word, lowest rank first, until none applies."""
    symbols = [*word, END_OF_WORD]
    while len(symbols) > 1:
        pairs = set(pairwise(symbols))
        best = min(pairs, key=lambda p: ranks.get(p, len(ranks)))
        if best not in ranks:
            break
        symbols = _merge_pair(symbols, best)
    return symbols


@graded("07_nlp_pipeline")
def bpe_encode(text: str, merges: Sequence[tuple[str, str]]) -> list[str]:
    """Segment ``text`` with learned merges.

    Each whitespace-separated word starts as its characters plus ``</w>``; the merges are then
    applied in the order they were learned (repeatedly the earliest-learned pair present), which
    reproduces exactly the segmentation training gave its own words.

    Example: with ``[("l", "o"), ("lo", "w")]``, "lowest low" becomes
    ``["low", "e", "s", "t", "</w>", "low", "</w>"]``.

    Args:
        text: text to segment.
        merges: output of :func:`bpe_train`.

    Returns:
        The pieces, in order; ``"".join(pieces).replace("</w>", " ")`` is the text with single
        spaces (plus one trailing space).
    """
    ranks = {tuple(pair): r for r, pair in enumerate(merges)}
    cache: dict[str, list[str]] = {}
    pieces: list[str] = []
    for word in _words(text):
        if word not in cache:
            cache[word] = _encode_word(word, ranks)
        pieces.extend(cache[word])
    return pieces


class BPETokenizer(Tokenizer):
    """Character-level byte-pair encoding with an end-of-word marker ``</w>``.

    The vocabulary is: specials, the characters seen in training (sorted), ``</w>``, then each
    merged piece in the order it was learned. A character never seen in training becomes
    ``<unk>`` (or raises with ``unk=None``). Whitespace is normalised: decoding joins words with
    single spaces.

    How to use::

        tok = BPETokenizer().fit("low low lower lowest", num_merges=10)
        tok.merges[:2]                  # [("l", "o"), ("lo", "w")]
        tok.tokenize("lower")           # ["lower</w>"]; tok.tokenize("slow") -> ["s", "low</w>"]
        tok.decode(tok.encode("low lower"))  # "low lower"

    Args:
        specials: special token names, ids ``0 ..``; default pad, bos, eos, unk.
        unk: the special for unknown characters, or None to raise ``ValueError`` on them.
    """

    kind: ClassVar[str] = "bpe"

    def __init__(
        self, specials: Sequence[str] = DEFAULT_SPECIALS, unk: str | None = "<unk>"
    ) -> None:
        super().__init__(specials=specials, unk=unk)
        self.merges: list[tuple[str, str]] = []

    def fit(self, text: str, num_merges: int = 200) -> BPETokenizer:
        """Learn ``num_merges`` merges (:func:`bpe_train`) and build the vocabulary.

        Returns:
            ``self``.
        """
        self.merges = bpe_train(text, num_merges)
        chars = sorted(set("".join(_words(text))))
        tokens = [*chars, END_OF_WORD]
        seen = set(tokens)
        for a, b in self.merges:
            if a + b not in seen:  # ("a", "bc") and ("ab", "c") both spell "abc"
                seen.add(a + b)
                tokens.append(a + b)
        self._set_vocab(tokens)
        return self

    def tokenize(self, text: str) -> list[str]:
        """The BPE pieces of ``text`` (:func:`bpe_encode`)."""
        return bpe_encode(text, self.merges)

    def detokenize(self, tokens: list[str]) -> str:
        """Concatenate pieces; each ``</w>`` becomes a space, the last one is dropped."""
        return "".join(tokens).replace(END_OF_WORD, " ").rstrip(" ")

    def _join_segments(self, segments: list[str]) -> str:
        return " ".join(segments)

    def _extra_state(self) -> dict[str, Any]:
        return {"merges": [list(m) for m in self.merges]}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        merges = state.get("merges")
        if not isinstance(merges, list) or not all(
            isinstance(m, list) and len(m) == 2 and all(isinstance(s, str) for s in m)
            for m in merges
        ):
            raise ValueError("'merges' must be a list of [left, right] string pairs")
        self.merges = [(a, b) for a, b in merges]

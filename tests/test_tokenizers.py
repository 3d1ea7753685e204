"""Tokenizers: round trips, special ids, BPE merges worked out by hand, JSON save/load."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from transformer_lab.tokenizers import (
    END_OF_WORD,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    WordTokenizer,
    bpe_encode,
    bpe_train,
    load_tokenizer,
)

TEXT = "the man ate the fish.\nthe fish ate the man, and the big dog saw a cat!"


def _fitted(kind: str) -> Tokenizer:
    if kind == "char":
        return CharTokenizer().fit(TEXT)
    if kind == "word":
        return WordTokenizer().fit(TEXT)
    return BPETokenizer().fit(TEXT, num_merges=20)


KINDS = ["char", "word", "bpe"]


@pytest.mark.parametrize("kind", KINDS)
def test_specials_come_first(kind: str) -> None:
    tok = _fitted(kind)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.vocab_size == 4 + len(tok.vocab)
    ids = tok.encode("the fish", add_bos=True, add_eos=True)
    assert ids[0] == 1 and ids[-1] == 2
    assert all(4 <= i < tok.vocab_size for i in ids[1:-1])


def test_char_round_trip_is_exact() -> None:
    tok = CharTokenizer().fit(TEXT)
    assert tok.vocab == sorted(set(TEXT))
    for text in [TEXT, "", "  the\n\nman  ", TEXT[::-1]]:
        assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode("abc")) == 3


def test_word_round_trip_and_spacing() -> None:
    text = "Hello, world! (yes) the dog's bone: 50% of $5."
    tok = WordTokenizer().fit(text)
    assert tok.decode(tok.encode(text)) == text
    assert tok.tokenize("don't stop.") == ["don't", "stop", "."]
    # Whitespace is normalised: runs of spaces and newlines become single spaces.
    assert tok.decode(tok.encode("Hello,\n\n  world!")) == "Hello, world!"


def test_word_vocab_order_frequency_then_alphabet() -> None:
    tok = WordTokenizer().fit("b a b c c c")
    assert tok.vocab == ["c", "b", "a"]
    assert WordTokenizer().fit("b a b c c c", min_freq=2).vocab == ["c", "b"]
    assert WordTokenizer().fit("b a b c c c", max_size=1).vocab == ["c"]
    assert WordTokenizer(lower=True).fit("The the").vocab == ["the"]


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_on_normalised_text(kind: str) -> None:
    tok = _fitted(kind)
    normalised = " ".join(TEXT.split())
    if kind == "char":
        assert tok.decode(tok.encode(TEXT)) == TEXT
    elif kind == "word":
        assert tok.decode(tok.encode(normalised)) == normalised
    else:
        assert tok.decode(tok.encode(TEXT)) == normalised


@pytest.mark.parametrize("kind", KINDS)
def test_unknown_maps_to_unk_or_raises(kind: str) -> None:
    tok = _fitted(kind)
    ids = tok.encode("the zebra" if kind == "word" else "the #")
    assert tok.unk_id in ids
    cls = type(tok)
    strict = cls(unk=None)
    strict = strict.fit(TEXT, num_merges=5) if kind == "bpe" else strict.fit(TEXT)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        strict.encode("zebra" if kind == "word" else "#")


@pytest.mark.parametrize("kind", KINDS)
def test_decode_specials_and_tensors(kind: str) -> None:
    tok = _fitted(kind)
    ids = tok.encode("the man", add_bos=True, add_eos=True)
    assert tok.decode(ids, skip_special=True) == "the man"
    assert tok.decode(torch.tensor(ids), skip_special=True) == "the man"
    assert tok.decode(ids).startswith("<bos>")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip(kind: str, tmp_path: Path) -> None:
    tok = _fitted(kind)
    path = tmp_path / f"{kind}.json"
    tok.save(path)
    again = type(tok).load(path)
    assert type(again) is type(tok)
    assert again.vocab == tok.vocab and again.specials == tok.specials
    assert again.encode(TEXT) == tok.encode(TEXT)
    assert load_tokenizer(path).encode(TEXT) == tok.encode(TEXT)
    if kind == "bpe":
        assert again.merges == tok.merges  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"format": "something else"}', "'format'"),
        (
            '{"format": "transformer_lab.tokenizer", "version": 1, "type": "morse"}',
            "'type'",
        ),
        (
            '{"format": "transformer_lab.tokenizer", "version": 1, "type": "char", '
            '"specials": ["<pad>"], "unk": null, "vocab": "abc"}',
            "'vocab' must be a list",
        ),
        (
            '{"format": "transformer_lab.tokenizer", "version": 1, "type": "bpe", '
            '"specials": [], "unk": null, "vocab": [], "merges": [["a"]]}',
            "'merges'",
        ),
        (
            '{"format": "transformer_lab.tokenizer", "version": 1, "type": "char", '
            '"specials": [], "unk": null, "vocab": ["a", "a"]}',
            "duplicate",
        ),
    ],
)
def test_load_malformed_file_raises_clear_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        load_tokenizer(path)
    assert "bad.json" in str(info.value)


def test_load_wrong_kind_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "char.json"
    CharTokenizer().fit("abc").save(path)
    with pytest.raises(ValueError, match="not a BPETokenizer"):
        BPETokenizer.load(path)


def test_from_symbols_fixed_ids() -> None:
    tok = CharTokenizer.from_symbols("0123456789", specials=("<pad>", "<bos>", "<eos>"))
    assert tok.encode("09") == [3, 12]
    assert tok.unk_id is None
    with pytest.raises(ValueError, match="'x'"):
        tok.encode("x")


# ----------------------------------------------------------------------------- BPE by hand


def test_bpe_merges_worked_by_hand() -> None:
    # Words: low x2, lower x1, newest x1, each followed by </w>.
    # Step 1: (l,o) and (o,w) both occur 3 times (2 in "low", 1 in "lower"); the tie goes to
    #         the smaller pair, ("l", "o"). (w,</w>) and (w,e) occur twice.
    # Step 2: (lo,w) occurs 3 times, nothing else more than twice -> ("lo", "w").
    # Step 3: (low,</w>) occurs twice (from "low" x2); every other pair once -> ("low", "</w>").
    text = "low low lower newest"
    assert bpe_train(text, 3) == [("l", "o"), ("lo", "w"), ("low", END_OF_WORD)]
    assert bpe_encode("lower low", bpe_train(text, 3)) == [
        "low",
        "e",
        "r",
        END_OF_WORD,
        "low</w>",
    ]


def test_bpe_stops_when_every_word_is_one_symbol() -> None:
    merges = bpe_train("ab ab", 10)
    assert merges == [("a", "b"), ("ab", END_OF_WORD)]
    assert bpe_encode("ab", merges) == ["ab</w>"]
    assert bpe_train("", 5) == []
    with pytest.raises(ValueError, match="num_merges=-1"):
        bpe_train("ab", -1)


def test_bpe_counts_overlapping_pairs() -> None:
    # "aaa</w>": (a,a) occurs twice (overlapping), (a,</w>) once -> (a,a) wins; merging left to
    # right gives "aa a </w>".
    merges = bpe_train("aaa", 1)
    assert merges == [("a", "a")]
    assert bpe_encode("aaa", merges) == ["aa", "a", END_OF_WORD]


def _reference_bpe_train(text: str, num_merges: int) -> list[tuple[str, str]]:
    """Independent oracle: recount every pair from scratch at every step."""
    corpus = Counter(tuple([*w, END_OF_WORD]) for w in text.split())
    merges = []
    for _ in range(num_merges):
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in corpus.items():
            for i in range(len(word) - 1):
                pairs[word[i], word[i + 1]] += count
        if not pairs:
            break
        best = sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
        merges.append(best)
        new_corpus: Counter[tuple[str, ...]] = Counter()
        for word, count in corpus.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new_corpus[tuple(out)] += count
        corpus = new_corpus
    return merges


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bpe_train_matches_naive_reference(seed: int) -> None:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcab") for _ in range(rng.randint(1, 6))) for _ in range(60)]
    text = " ".join(words)
    merges = bpe_train(text, 25)
    assert merges == _reference_bpe_train(text, 25)
    # Encoding the training text reproduces the segmentation training ended with.
    pieces = bpe_encode(text, merges)
    assert "".join(pieces).replace(END_OF_WORD, " ").split() == words


def test_bpe_tokenizer_compresses_and_is_deterministic(tiny_shakespeare_path: Path) -> None:
    text = tiny_shakespeare_path.read_text("utf-8")[:20_000]
    a = BPETokenizer().fit(text, num_merges=100)
    b = BPETokenizer().fit(text, num_merges=100)
    assert a.merges == b.merges and a.vocab == b.vocab
    sample = text[:2000]
    ids = a.encode(sample)
    assert len(ids) < 0.6 * len(CharTokenizer().fit(text).encode(sample))
    assert a.decode(ids) == " ".join(sample.split())


def test_saved_file_is_plain_json(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    WordTokenizer(lower=True).fit("A b").save(path)
    state = json.loads(path.read_text())
    assert state["type"] == "word" and state["lower"] is True and state["vocab"] == ["a", "b"]

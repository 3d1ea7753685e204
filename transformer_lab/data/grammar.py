"""A small sentence grammar: word-order translation and a language-modelling corpus.

"the man ate the fish" and "the fish ate the man" use the same words and mean opposite things:
only the order says who ate whom. This module generates such sentences from a tiny English
grammar, seeded, and pairs each with its translation into *Verbal*, a made-up language with
its own words and a different word order, so that translating means moving words around, not
just looking them up.

English (subject - verb - object, modifiers first)::

    sentence := NP VERB NP
    NP       := DET [ADJ] NOUN          ("the big man", "a cat", "the dogs")

Verbal (subject - object - verb, modifiers after the noun, the determiner last)::

    sentence := NP' NP' VERB'
    NP'      := NOUN' [ADJ'] DET'       ("tor gran la" = "the big man")

Agreement makes the task more than reordering:

* English: a plural noun ("men"); in the present tense the verb agrees with the subject ("the
  man eats", "the men eat"); "a" only goes with singular nouns.
* Verbal: nouns take a plural form ("tor" -> "tori"), the determiner agrees ("la" singular,
  "li" plural, "un" = "a"), and the verb agrees with the subject in number in *both* tenses
  (present "-a"/"-an", past "-o"/"-on"). In the past tense English does not show the subject's
  number on the verb ("the men ate"), so the translator must look back at the subject.

Example: "the big men ate a fish" -> "tori gran li pesk un mangon".

The language-modelling corpus is the English side alone; predicting "eats" rather than "eat"
after "the hungry king" is the classic agreement probe (Linzen et al., 2016), in miniature.

Reference: the toy-translation idea follows the word-order examples of Prince, *Understanding
Deep Learning* (2023), ch. 12; agreement probing: T. Linzen, E. Dupoux, Y. Goldberg, "Assessing
the Ability of LSTMs to Learn Syntax-Sensitive Dependencies", TACL 2016.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from transformer_lab.data.synthetic import BOS_ID, EOS_ID, IGNORE_INDEX, PAD_ID, to_seq2seq
from transformer_lab.tokenizers import WordTokenizer

__all__ = [
    "ADJECTIVES",
    "MAX_SENTENCE_WORDS",
    "NOUNS",
    "VERBS",
    "GrammarConfig",
    "Sentence",
    "agreement_probes",
    "english_tokenizer",
    "english_vocabulary",
    "grammar_text",
    "make_grammar_lm",
    "make_grammar_translation",
    "sample_sentences",
    "shared_tokenizer",
    "target_vocabulary",
    "verbal_tokenizer",
]

# English singular, English plural, Verbal singular, Verbal plural.
NOUNS: tuple[tuple[str, str, str, str], ...] = (
    ("man", "men", "tor", "tori"),
    ("woman", "women", "sela", "selai"),
    ("child", "children", "kimo", "kimoi"),
    ("dog", "dogs", "hun", "huni"),
    ("cat", "cats", "mau", "maui"),
    ("fish", "fishes", "pesk", "peski"),
    ("bird", "birds", "avi", "avii"),
    ("king", "kings", "rek", "reki"),
)
# English past, present 3rd singular, present plural, Verbal stem.
VERBS: tuple[tuple[str, str, str, str], ...] = (
    ("ate", "eats", "eat", "mang"),
    ("saw", "sees", "see", "vid"),
    ("chased", "chases", "chase", "kur"),
    ("liked", "likes", "like", "am"),
    ("found", "finds", "find", "trov"),
)
# English, Verbal. All start with a consonant so "a" never needs to become "an".
ADJECTIVES: tuple[tuple[str, str], ...] = (
    ("big", "gran"),
    ("small", "pik"),
    ("tall", "alt"),
    ("young", "nov"),
    ("hungry", "fam"),
    ("happy", "fel"),
)
# Verbal verb endings by (tense, plural subject).
_VERB_ENDINGS = {
    ("present", False): "a",
    ("present", True): "an",
    ("past", False): "o",
    ("past", True): "on",
}
_TENSES = ("past", "present")
MAX_SENTENCE_WORDS = 7  # DET ADJ NOUN VERB DET ADJ NOUN


@dataclass(frozen=True)
class GrammarConfig:
    """How sentences are drawn.

    Attributes:
        adjective_prob: chance that a noun phrase carries an adjective.
        plural_prob: chance that a noun is plural.
        indefinite_prob: chance that a singular noun takes "a" instead of "the".
        present_prob: chance of the present tense (else past).
    """

    adjective_prob: float = 0.5
    plural_prob: float = 0.3
    indefinite_prob: float = 0.3
    present_prob: float = 0.5

    def __post_init__(self) -> None:
        bad = {k: v for k, v in vars(self).items() if not 0.0 <= v <= 1.0}
        if bad:
            raise ValueError(
                ", ".join(f"{k}={v}" for k, v in bad.items()) + " must be probabilities in [0, 1]"
            )


@dataclass(frozen=True)
class _NounPhrase:
    noun: int
    adjective: int | None
    plural: bool
    indefinite: bool

    def english(self) -> list[str]:
        det = "a" if self.indefinite else "the"
        adj = [] if self.adjective is None else [ADJECTIVES[self.adjective][0]]
        noun = NOUNS[self.noun][1 if self.plural else 0]
        return [det, *adj, noun]

    def verbal(self) -> list[str]:
        det = "un" if self.indefinite else ("li" if self.plural else "la")
        adj = [] if self.adjective is None else [ADJECTIVES[self.adjective][1]]
        noun = NOUNS[self.noun][3 if self.plural else 2]
        return [noun, *adj, det]


@dataclass(frozen=True)
class Sentence:
    """One sentence of the grammar, with both of its renderings."""

    subject: _NounPhrase
    verb: int
    tense: str
    obj: _NounPhrase

    def english(self) -> list[str]:
        """English words, subject - verb - object."""
        past, sing, plur, _ = VERBS[self.verb]
        verb = past if self.tense == "past" else (plur if self.subject.plural else sing)
        return [*self.subject.english(), verb, *self.obj.english()]

    def verbal(self) -> list[str]:
        """Verbal words, subject - object - verb."""
        verb = VERBS[self.verb][3] + _VERB_ENDINGS[self.tense, self.subject.plural]
        return [*self.subject.verbal(), *self.obj.verbal(), verb]


def sample_sentences(
    n: int, *, generator: torch.Generator, config: GrammarConfig | None = None
) -> list[Sentence]:
    """Draw ``n`` sentences, every choice from ``generator``.

    Args:
        n: number of sentences.
        generator: the source of randomness (the global RNG is never used).
        config: probabilities of adjectives, plurals, "a" and the present tense.

    Returns:
        A list of :class:`Sentence`.
    """
    if n < 0:
        raise ValueError(f"n={n} must be >= 0")
    cfg = config or GrammarConfig()
    u = torch.rand(n, 10, generator=generator).tolist()  # 10 uniform draws per sentence

    def phrase(draws: list[float]) -> _NounPhrase:
        plural = draws[2] < cfg.plural_prob
        return _NounPhrase(
            noun=min(int(draws[0] * len(NOUNS)), len(NOUNS) - 1),
            adjective=(
                min(int(draws[1] / cfg.adjective_prob * len(ADJECTIVES)), len(ADJECTIVES) - 1)
                if draws[1] < cfg.adjective_prob
                else None
            ),
            plural=plural,
            indefinite=not plural and draws[3] < cfg.indefinite_prob,
        )

    return [
        Sentence(
            subject=phrase(row[0:4]),
            verb=min(int(row[8] * len(VERBS)), len(VERBS) - 1),
            tense="present" if row[9] < cfg.present_prob else "past",
            obj=phrase(row[4:8]),
        )
        for row in u
    ]


def agreement_probes(
    n: int, *, generator: torch.Generator, config: GrammarConfig | None = None
) -> list[tuple[list[str], str, str]]:
    """Minimal pairs for testing subject-verb agreement in a language model.

    Each probe is a subject noun phrase and two present-tense verbs, the one that agrees with it
    and the one that does not: ``(["the", "hungry", "kings"], "eat", "eats")``. A model that
    learned agreement gives the first verb the higher probability after the prefix.

    Args:
        n: number of probes.
        generator: the source of randomness.
        config: sentence probabilities (the tense is always present here).

    Returns:
        A list of ``(prefix words, agreeing verb, non-agreeing verb)``.
    """
    probes = []
    for s in sample_sentences(n, generator=generator, config=config):
        _, singular, plural, _ = VERBS[s.verb]
        good, bad = (plural, singular) if s.subject.plural else (singular, plural)
        probes.append((s.subject.english(), good, bad))
    return probes


def english_vocabulary() -> list[str]:
    """Every English word the grammar can produce, sorted."""
    words = {"the", "a"}
    words.update(w for noun in NOUNS for w in noun[:2])
    words.update(w for verb in VERBS for w in verb[:3])
    words.update(adj[0] for adj in ADJECTIVES)
    return sorted(words)


def target_vocabulary() -> list[str]:
    """Every Verbal word the grammar can produce, sorted."""
    words = {"la", "li", "un"}
    words.update(w for noun in NOUNS for w in noun[2:])
    words.update(verb[3] + end for verb in VERBS for end in _VERB_ENDINGS.values())
    words.update(adj[1] for adj in ADJECTIVES)
    return sorted(words)


def english_tokenizer() -> WordTokenizer:
    """Word tokenizer over :func:`english_vocabulary` (pad, bos, eos, unk = 0, 1, 2, 3)."""
    return WordTokenizer.from_vocab(english_vocabulary())


def verbal_tokenizer() -> WordTokenizer:
    """Word tokenizer over :func:`target_vocabulary` (pad, bos, eos, unk = 0, 1, 2, 3)."""
    return WordTokenizer.from_vocab(target_vocabulary())


def shared_tokenizer() -> WordTokenizer:
    """One word tokenizer over both languages (pad, bos, eos, unk = 0, 1, 2, 3).

    The two word lists do not overlap, so any id sequence, source or target, decodes with it;
    sharing one vocabulary across languages is common in translation systems.
    """
    return WordTokenizer.from_vocab(sorted(set(english_vocabulary()) | set(target_vocabulary())))


def _pad(rows: list[list[int]], length: int) -> tuple[Tensor, Tensor]:
    out = torch.full((len(rows), length), PAD_ID, dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out, lengths


def make_grammar_translation(
    n: int,
    *,
    generator: torch.Generator,
    config: GrammarConfig | None = None,
    src_tokenizer: WordTokenizer | None = None,
    tgt_tokenizer: WordTokenizer | None = None,
) -> dict[str, Tensor]:
    """English-to-Verbal translation pairs in the seq2seq format.

    Args:
        n: number of pairs ``N``.
        generator: the source of randomness.
        config: sentence probabilities.
        src_tokenizer, tgt_tokenizer: word tokenizers (default: :func:`english_tokenizer`,
            :func:`verbal_tokenizer`).

    Returns:
        ``src``, ``src_padding_mask`` ``(N, 7)``; ``tgt_in``, ``tgt_out``, ``tgt_padding_mask``
        ``(N, 8)`` (BOS + up to 7 words / up to 7 words + EOS), padded with 0.
    """
    src_tok = src_tokenizer or english_tokenizer()
    tgt_tok = tgt_tokenizer or verbal_tokenizer()
    sentences = sample_sentences(n, generator=generator, config=config)
    src, src_len = _pad(
        [[src_tok.token_to_id(w) for w in s.english()] for s in sentences], MAX_SENTENCE_WORDS
    )
    tgt, tgt_len = _pad(
        [[tgt_tok.token_to_id(w) for w in s.verbal()] for s in sentences], MAX_SENTENCE_WORDS
    )
    src_mask = torch.arange(MAX_SENTENCE_WORDS)[None, :] < src_len[:, None]  # (N, S)
    return to_seq2seq(src, src_mask, tgt, tgt_len)


def make_grammar_lm(
    n: int,
    *,
    generator: torch.Generator,
    config: GrammarConfig | None = None,
    tokenizer: WordTokenizer | None = None,
) -> dict[str, Tensor]:
    """English sentences for language modelling, one sentence per row.

    Each row is ``BOS w1 .. wk EOS`` padded with 0; ``tokens`` drops its last id and ``targets``
    is the row shifted left by one, with -100 where the next id is padding. Every word and the
    final EOS are scored.

    Args:
        n: number of sentences ``N``.
        generator: the source of randomness.
        config: sentence probabilities.
        tokenizer: word tokenizer (default :func:`english_tokenizer`).

    Returns:
        ``tokens``, ``targets`` ``(N, 8)``.
    """
    tok = tokenizer or english_tokenizer()
    sentences = sample_sentences(n, generator=generator, config=config)
    rows = [[BOS_ID, *(tok.token_to_id(w) for w in s.english()), EOS_ID] for s in sentences]
    seq, _ = _pad(rows, MAX_SENTENCE_WORDS + 2)  # (N, 9)
    tokens = seq[:, :-1]  # (N, 8)
    targets = seq[:, 1:].masked_fill(seq[:, 1:] == PAD_ID, IGNORE_INDEX)  # (N, 8)
    return {"tokens": tokens, "targets": targets}


def grammar_text(n: int, *, seed: int = 0, config: GrammarConfig | None = None) -> str:
    """A plain-text corpus of ``n`` English sentences, one per line ("the man ate a fish.").

    Used as the offline stand-in for Tiny Shakespeare by the character-level LM.
    """
    generator = torch.Generator().manual_seed(seed)
    lines = (
        " ".join(s.english()) + "." for s in sample_sentences(n, generator=generator, config=config)
    )
    return "\n".join(lines) + "\n"

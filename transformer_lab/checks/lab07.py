"""Visible checks of lab 07 (the NLP pipeline and decoding), called by the visible test cells.

The student writes a character tokenizer (``CharTokenizer``), byte-pair encoding (``bpe_train``,
``bpe_encode``) and the decoding pieces of a language model: ``apply_temperature``,
``top_k_filter``, ``top_p_filter`` and ``beam_search``.

No oracle lives here. Every visible check runs the student's code on worked examples whose
expected results, and the results of the typical mistakes on them, are stored in
``fixtures/lab07.json`` (written from the hidden checks' oracles by ``labs build``): a wrong
answer is told the one stored mistake it reproduces on EVERY example of the check
(:func:`~transformer_lab.checks._common.judge_cases`), or that it is none of them, with the
smallest example it gets wrong. Messages show values in the shape the student passed. The
stand-ins the checks hand to the student's code live here too, because the hidden module's
functions are refused inside a ban:

* :class:`TableStepFn`, a next-token distribution read from a hand-built table of prefixes
  (and :class:`RandomStepFn`, a seeded random one for every prefix), for ``beam_search``. Both
  refuse what a correct search never asks: a prefix that does not start with BOS, that already
  ended with EOS, or that already holds ``max_len`` tokens.

The rules the checks hold the student to are stated in the notebook and in the docstrings of the
``check_*`` functions: the tokenizer's specials ``<pad>, <bos>, <eos>, <unk>`` = ids 0-3 and the
characters after them in sorted order; BPE's words split on whitespace and ended with ``</w>``,
overlapping pairs counted, ties to the smallest pair, merges applied earliest-learned first; the
filters' removed entries at ``-inf``, ties at the top-k boundary kept, the token that crosses
``p`` kept (probability ties ranked by token id, lowest first); beam search's scores summed
log-probabilities, EOS hypotheses set aside, ties to the better-ranked beam.

While the student's code runs, the kit's own answers are refused (``Ban``):
``transformer_lab.tokenizers`` for the tokenizers, ``transformer_lab.generation`` for decoding.

Reference: Prince, *Understanding Deep Learning*, sections 12.5 and 12.7.3; Sennrich, Haddow and
Birch, "Neural Machine Translation of Rare Words with Subword Units", ACL 2016; Holtzman et al.,
"The Curious Case of Neural Text Degeneration", ICLR 2020.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from transformer_lab.checks import spec
from transformer_lab.checks._common import (
    Case,
    call_forbidding,
    expect_shape,
    expect_true,
    judge_cases,
    stored_data,
)

__all__ = [
    "DECODING_BAN",
    "END_OF_WORD",
    "SPECIALS",
    "TOKENIZER_BAN",
    "Probe",
    "RandomStepFn",
    "TableStepFn",
    "check_apply_temperature",
    "check_beam_search",
    "check_beam_search_eos",
    "check_bpe_encode",
    "check_bpe_train",
    "check_bpe_train_rules",
    "check_char_tokenizer",
    "check_top_k_filter",
    "check_top_p_filter",
    "example",
    "logits_input_kind",
    "same_logits",
    "sequence_score",
]

#: The special tokens of the lab's ``CharTokenizer``, ids 0, 1, 2, 3.
SPECIALS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>")
#: The end-of-word symbol of BPE.
END_OF_WORD = "</w>"

#: The lab's spec (``specs/lab07.toml``): its bans and shared tolerances.
SPEC = spec.load("07_nlp_pipeline")
TOKENIZER_BAN = SPEC.ban("tokenizer")
DECODING_BAN = SPEC.ban("decoding")


def example(key: str) -> tuple[Any, dict[str, Any]]:
    """A stored worked example: ``(expected, {hint: what that mistake returns})``, as JSON data.

    Tensors are stored as nested lists (``-inf`` included); turn them back with
    ``torch.tensor(..., dtype=torch.float64)``.
    """
    return stored_data("lab07", key)


def _tensor(data: Any) -> Tensor:
    return torch.tensor(data, dtype=torch.float64)


class Probe(NamedTuple):
    """One input of a check: what the student's code gets, how to look up the answer.

    Attributes:
        args: what the student's function is called with (the function or tokenizer first).
        key: how the check finds the expected output and the mistakes' outputs (a stored
            example's name, or the oracle's arguments).
        what: the call as the student would write it, for messages.
        rule: what a right answer does here (said when no typical mistake matches).
    """

    args: tuple[Any, ...]
    key: Any
    what: str
    rule: str = ""


Lookup = Callable[[Probe], Any]


def _equal(a: Any, b: Any) -> bool:
    return a == b


def stored_lookups() -> tuple[Lookup, Callable[[Probe], Mapping[str, Any]]]:
    """``(expected, mistakes)`` of probes whose ``key`` names a stored example."""
    return (lambda probe: example(probe.key)[0]), (lambda probe: example(probe.key)[1])


# ======================================================================================
# CharTokenizer
# ======================================================================================


_ON_ERROR = {
    "encode": "A character that fit never saw becomes <unk> (id 3): look it up with a default, "
    "e.g. self.stoi.get(ch, 3).",
    "decode": "Every id from 0 to vocab_size - 1 has a token: the specials by name, then the "
    "characters.",
}


def _method(tok: Any, name: str, *args: Any, what: str) -> Any:
    """Call ``tok.<name>(*args)`` under the tokenizer ban."""
    method = getattr(tok, name, None)
    if method is None:
        raise AssertionError(f"your CharTokenizer has no method `{name}`: the lab asks for it.")
    return call_forbidding(
        method, args, {}, ban=TOKENIZER_BAN, what=what, on_error=_ON_ERROR.get(name, "")
    )


def vocab_size_of(tok: Any) -> int:
    """``tok.vocab_size`` (a property or an attribute), read under the ban."""
    try:  # read, not looked up on the type: the grader's judge sees the tokenizer from outside
        size = call_forbidding(
            lambda: tok.vocab_size, (), {}, ban=TOKENIZER_BAN, what="tokenizer.vocab_size"
        )
    except AssertionError as exc:
        if "raised AttributeError" in str(exc):
            raise AssertionError(
                "your CharTokenizer has no `vocab_size`: the lab asks for it."
            ) from None
        raise
    if callable(size):
        raise AssertionError(
            "tokenizer.vocab_size is a method; make it a property (put @property above "
            "`def vocab_size(self)`) or an attribute, so that `tok.vocab_size` is a number."
        )
    if isinstance(size, Tensor) and size.numel() == 1:
        size = size.item()
    if isinstance(size, bool) or not isinstance(size, int):
        raise AssertionError(
            f"tokenizer.vocab_size is {size!r} ({type(size).__name__}); it should be an int."
        )
    return size


def fitted_tokenizer(cls: Callable[..., Any], text: str) -> Any:
    """``cls()`` then ``.fit(text)``, under the ban; checks that ``fit`` returns the tokenizer."""
    tok = call_forbidding(cls, (), {}, ban=TOKENIZER_BAN, what="CharTokenizer()")
    returned = _method(tok, "fit", text, what=f"CharTokenizer().fit({text!r})")
    expect_true(
        returned is tok,
        f"CharTokenizer().fit({text!r}) returned {type(returned).__name__}, not the tokenizer: "
        "end fit with `return self`, so that `tok = CharTokenizer().fit(text)` works.",
    )
    return tok


def encode_with(tok: Any, text: str) -> list[int]:
    """``tok.encode(text)`` under the ban, as a list of Python ints."""
    what = f"tokenizer.encode({text!r})"
    got = _method(tok, "encode", text, what=what)
    if isinstance(got, Tensor):
        got = got.tolist()
    if not isinstance(got, list | tuple) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in got
    ):
        raise AssertionError(f"{what} returned {got!r}; it should return a list of ints.")
    return list(got)


def decode_with(tok: Any, ids: list[int]) -> str:
    """``tok.decode(ids)`` under the ban; it must be a string."""
    what = f"tokenizer.decode({ids})"
    got = _method(tok, "decode", list(ids), what=what)
    if not isinstance(got, str):
        raise AssertionError(f"{what} returned {type(got).__name__}; it should return a str.")
    return got


def judge_vocab_size(got: int, want: int, n_chars: int, what: str) -> None:
    """``vocab_size`` against the expected count, naming the usual slip."""
    if got == want:
        return
    shown = f"{what}.vocab_size is {got}, expected {want}"
    if got == n_chars:
        raise AssertionError(
            f"{shown}: count the {len(SPECIALS)} special tokens {', '.join(SPECIALS)} too "
            f"(ids 0-{len(SPECIALS) - 1}), then one id per distinct character."
        )
    raise AssertionError(
        f"{shown}: the 4 special tokens plus one id per DISTINCT character of the text fitted."
    )


def _ids_rule(case: Case[Probe]) -> str:
    if len(case.got) != len(case.want):
        return (
            "encode gives exactly one id per character, unknown characters included (they "
            f"become <unk>, id {SPECIALS.index('<unk>')})."
        )
    return (
        f"Ids 0-3 are the specials {', '.join(SPECIALS)}; the characters fitted follow in sorted "
        "order (sorted(set(text))), from id 4."
    )


def judge_encodes(
    probes: Sequence[Probe], expected: Lookup, mistakes: Callable[[Probe], Mapping[str, Any]]
) -> None:
    """``encode`` on every probe (``args = (tokenizer, text)``); one diagnosis for them all."""
    judge_cases(
        probes,
        lambda probe: encode_with(*probe.args),
        expected,
        mistakes,
        same=_equal,
        what=lambda probe: probe.what,
        describe=lambda case: f"{case.what} returned {case.got}, expected {case.want}.",
        rule=_ids_rule,
        size=lambda probe: len(probe.args[1]),
    )


def judge_decodes(
    probes: Sequence[Probe], expected: Lookup, mistakes: Callable[[Probe], Mapping[str, Any]]
) -> None:
    """``decode`` on every probe (``args = (tokenizer, ids)``); one diagnosis for them all."""
    judge_cases(
        probes,
        lambda probe: decode_with(*probe.args),
        expected,
        mistakes,
        same=_equal,
        what=lambda probe: probe.what,
        describe=lambda case: f"{case.what} returned {case.got!r}, expected {case.want!r}.",
        rule="decode writes each character id as its character, with nothing between them, and "
        "each special id as its name (for example '<unk>').",
        size=lambda probe: len(probe.args[1]),
    )


def check_char_tokenizer(cls: Callable[..., Any]) -> None:
    """The worked example: fit on a sentence, ``vocab_size``, ``encode`` (one unseen character)
    and ``decode`` (with special ids), against the stored expected results."""
    text, _ = example("char text")
    tok = fitted_tokenizer(cls, text)
    chars, _ = example("char chars")
    judge_vocab_size(
        vocab_size_of(tok), len(SPECIALS) + len(chars), len(chars), f"CharTokenizer().fit({text!r})"
    )
    probes = []
    for probe in ("probe fitted", "probe unseen"):
        probe_text, _ = example(f"char {probe}: text")
        probes.append(
            Probe((tok, probe_text), f"char {probe}: encode", f"tokenizer.encode({probe_text!r})")
        )
    judge_encodes(probes, *stored_lookups())
    ids, _ = example("char decode: ids")
    judge_decodes([Probe((tok, ids), "char decode", f"tokenizer.decode({ids})")], *stored_lookups())


# ======================================================================================
# bpe_train and bpe_encode
# ======================================================================================


def _short(text: str, limit: int = 40) -> str:
    return repr(text) if len(text) <= limit else repr(text[: limit - 3] + "...")


def run_bpe_train(fn: Callable[..., Any], text: str, num_merges: int) -> list[tuple[str, str]]:
    """The student's ``bpe_train(text, num_merges)`` under the ban, as a list of pairs."""
    what = f"bpe_train({_short(text)}, {num_merges})"
    got = call_forbidding(
        fn,
        (text, num_merges),
        {},
        ban=TOKENIZER_BAN,
        what=what,
        on_error="Stop early when no pair is left to merge (every word is one symbol).",
    )
    if not isinstance(got, list | tuple):
        raise AssertionError(
            f"{what} returned {type(got).__name__}; it should return a list of (left, right) "
            "pairs of strings."
        )
    pairs = []
    for item in got:
        if (
            not isinstance(item, list | tuple)
            or len(item) != 2
            or not all(isinstance(s, str) for s in item)
        ):
            raise AssertionError(
                f"{what} returned an item {item!r}; each merge is a pair of strings, e.g. "
                "('l', 'o')."
            )
        pairs.append((item[0], item[1]))
    return pairs


def _first_difference(got: Sequence[Any], want: Sequence[Any]) -> int:
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return i
    return min(len(got), len(want))


def _describe_merges(case: Case[Probe]) -> str:
    got, want = case.got, case.want
    i = _first_difference(got, want)
    if i < len(got) and i < len(want):
        return f"{case.what}: merge {i} (counting from 0) is {got[i]}, expected {want[i]}."
    return f"{case.what} returned {len(got)} merges, expected {len(want)}."


def _merges_rule(case: Case[Probe]) -> str:
    got, want = case.got, case.want
    if len(got) != len(want) and got[: len(want)] == want[: len(got)]:
        return "Learn exactly num_merges merges; stop earlier only when no pair is left."
    return (
        "Each step counts every adjacent pair of symbols inside the words (word frequency "
        "included), merges the most frequent pair (ties: the smallest pair) in every word, and "
        "records it."
    )


def _as_pairs(merges: Sequence[Sequence[str]] | None) -> list[tuple[str, str]] | None:
    return None if merges is None else [(a, b) for a, b in merges]


def judge_merges(
    probes: Sequence[Probe], expected: Lookup, mistakes: Callable[[Probe], Mapping[str, Any]]
) -> None:
    """``bpe_train`` on every probe (``args = (fn, text, num_merges)``); one diagnosis."""
    judge_cases(
        probes,
        lambda probe: run_bpe_train(*probe.args),
        lambda probe: _as_pairs(expected(probe)),
        lambda probe: {h: _as_pairs(m) for h, m in mistakes(probe).items()},
        same=_equal,
        what=lambda probe: probe.what,
        describe=_describe_merges,
        rule=_merges_rule,
        size=lambda probe: len(probe.args[1]) + probe.args[2],
    )


def check_bpe_train(fn: Callable[..., Any]) -> None:
    """Worked examples: the lecture's rhyme (10 merges) and a few words (6 merges)."""
    _judge_bpe_train_examples(fn, ("rhyme", "words"))


def check_bpe_train_rules(fn: Callable[..., Any]) -> None:
    """The stated rules on tiny texts: overlapping pairs ("aaa"), ties, word frequencies and
    stopping when no pair is left."""
    _judge_bpe_train_examples(fn, ("overlap", "ties", "frequency", "stop"))


def _judge_bpe_train_examples(fn: Callable[..., Any], keys: Sequence[str]) -> None:
    """The student's ``bpe_train`` on the stored examples ``keys`` against their merges."""
    probes = []
    for key in keys:
        (text, num_merges), _ = example(f"bpe_train {key}: input")
        what = f"bpe_train({_short(text)}, {num_merges})"
        probes.append(Probe((fn, text, num_merges), f"bpe_train {key}", what))
    judge_merges(probes, *stored_lookups())


def run_bpe_encode(
    fn: Callable[..., Any], text: str, merges: Sequence[tuple[str, str]]
) -> list[str]:
    """The student's ``bpe_encode(text, merges)`` under the ban, as a list of strings."""
    what = f"bpe_encode({_short(text)}, merges)"
    got = call_forbidding(fn, (text, [tuple(m) for m in merges]), {}, ban=TOKENIZER_BAN, what=what)
    if not isinstance(got, list | tuple) or not all(isinstance(p, str) for p in got):
        raise AssertionError(
            f"{what} returned {got!r:.120}; it should return the list of pieces (strings), "
            f"e.g. ['low', 'er{END_OF_WORD}']."
        )
    return list(got)


def _describe_pieces(case: Case[Probe]) -> str:
    got, want = case.got, case.want
    shown = f"{case.what} returned {got}, expected {want}."
    if len(shown) > 600:
        i = _first_difference(got, want)
        shown = (
            f"{case.what} differs from the expected pieces at piece {i}: you returned "
            f"{got[max(0, i - 2) : i + 3]}, expected {want[max(0, i - 2) : i + 3]}."
        )
    return shown


def _pieces_rule(case: Case[Probe]) -> str:
    def words(pieces: Sequence[str]) -> list[str]:
        return "".join(pieces).replace(END_OF_WORD, " ").split()

    if words(case.got) != words(case.want):
        return f"The pieces must spell the text: each word's characters followed by {END_OF_WORD}."
    return (
        "In each word, repeatedly merge the adjacent pair that was learned EARLIEST (all its "
        "occurrences, left to right) until no learned pair is left."
    )


def judge_pieces(
    probes: Sequence[Probe], expected: Lookup, mistakes: Callable[[Probe], Mapping[str, Any]]
) -> None:
    """``bpe_encode`` on every probe (``args = (fn, text, merges)``); one diagnosis."""
    judge_cases(
        probes,
        lambda probe: run_bpe_encode(*probe.args),
        expected,
        mistakes,
        same=_equal,
        what=lambda probe: probe.what,
        describe=_describe_pieces,
        rule=_pieces_rule,
        size=lambda probe: len(probe.args[1]) + len(probe.args[2]),
    )


def check_bpe_encode(fn: Callable[..., Any]) -> None:
    """Worked examples: the rhyme's merges applied to the rhyme and to words it never saw; three
    tiny examples where the order of merging changes the pieces."""
    probes = []
    for key in ("rhyme", "unseen", "order", "longest", "ranks"):
        (text, merges), _ = example(f"bpe_encode {key}: input")
        what = f"bpe_encode({_short(text)}, merges)"
        probes.append(Probe((fn, text, merges), f"bpe_encode {key}", what))
    judge_pieces(probes, *stored_lookups())


# ======================================================================================
# apply_temperature, top_k_filter, top_p_filter
# ======================================================================================


def same_logits(got: Tensor, want: Tensor, atol: float = 1e-5, rtol: float = 1e-5) -> bool:
    """True when ``got`` has ``-inf`` exactly where ``want`` has it and agrees elsewhere."""
    if not isinstance(got, Tensor) or tuple(got.shape) != tuple(want.shape):
        return False
    g = got.detach().to("cpu", torch.float64)
    w = want.to("cpu", torch.float64)
    if bool(torch.isnan(g).any()) or not torch.equal(torch.isneginf(g), torch.isneginf(w)):
        return False
    keep = ~torch.isneginf(w)
    return bool(torch.allclose(g[keep], w[keep], atol=atol, rtol=rtol))


def run_logits_fn(
    fn: Callable[..., Any], name: str, logits: Tensor, arg: float, arg_name: str
) -> tuple[Tensor, str]:
    """The student's ``name(logits, arg)`` under the ban; checks that ``logits`` is untouched."""
    what = f"{name}(logits {tuple(logits.shape)}, {arg_name}={arg})"
    in_place = (
        "changed the logits it was given (in place): return a new tensor, e.g. "
        "`logits.masked_fill(remove, float('-inf'))` or `logits / t`, and leave the input "
        "as it was: the caller may still need it."
    )
    got = call_forbidding(fn, (logits, arg), {}, ban=DECODING_BAN, what=what, in_place=in_place)
    got = expect_shape(got, tuple(logits.shape), what)
    expect_true(
        got.is_floating_point(),
        f"{what} has dtype {got.dtype}; return float logits (removed entries at -inf).",
    )
    return got, what


def _kept(t: Tensor) -> list[list[int]]:
    rows = t.detach().reshape(-1, t.shape[-1])
    return [[i for i, v in enumerate(row.tolist()) if v != -math.inf] for row in rows]


def _shaped(rows: list[Any], lead: Sequence[int]) -> Any:
    """Per-row values nested as the leading dimensions ``lead`` (one row: the row itself)."""
    if not lead:
        return rows[0]
    step = len(rows) // lead[0] if lead[0] else 0
    return [_shaped(rows[i * step : (i + 1) * step], lead[1:]) for i in range(lead[0])]


def kept_ids(t: Tensor) -> Any:
    """The ids each row keeps (not ``-inf``), nested in the shape of ``t`` without its last
    dimension: ``[0, 2]`` for a 1-D input, ``[[0, 2], [1]]`` for two rows."""
    return _shaped(_kept(t), tuple(t.shape[:-1]))


def show_values(t: Tensor, digits: int = 3) -> Any:
    """``t`` as nested lists of rounded numbers, in its own shape (``-inf`` as ``-inf``)."""
    return _shaped([[round(x, digits) for x in row] for row in _rows_of(t)], tuple(t.shape[:-1]))


def _rows_of(t: Tensor) -> list[list[float]]:
    return t.detach().to("cpu", torch.float64).reshape(-1, t.shape[-1]).tolist()


_TIES_DROPPED = (
    "You keep exactly k tokens and drop some tied with the k-th largest; keep EVERY token whose "
    "logit equals the k-th largest (compare with the value, e.g. logits < kth -> -inf)."
)


def _drops_ties(got: Tensor, want: Tensor, k: int) -> bool:
    """Each row keeps exactly ``min(k, V)`` of the tokens the rule keeps, fewer than it."""
    got_rows, want_rows = _kept(got), _kept(want)
    width = min(k, got.shape[-1])
    return any(len(w) > width for w in want_rows) and all(
        set(g) <= set(w) and len(g) == min(width, len(w))
        for g, w in zip(got_rows, want_rows, strict=True)
    )


def _describe_logits(case: Case[Probe]) -> str:
    got, want = case.got, case.want
    logits = case.input.args[2]
    shown = case.what
    if logits.numel() <= 16:
        shown += f" with logits = {show_values(logits)}"
    if bool(torch.isnan(got.detach()).any()):
        return f"{shown} contains NaN."
    if _kept(got) != _kept(want):
        return (
            f"{shown} keeps the tokens {kept_ids(got)} (the others at -inf), expected "
            f"{kept_ids(want)}."
        )
    diff = (got.detach().double() - want).nan_to_num(0.0, 0.0, 0.0).abs()
    values = (
        f" (you returned {show_values(got)}, expected {show_values(want)})"
        if logits.numel() <= 16
        else ""
    )
    keep = "" if case.input.args[1] == "apply_temperature" else " Kept entries keep their logits."
    return (
        f"{shown} keeps the right tokens but with other values{values}; the largest difference "
        f"is {float(diff.max()):.3g}.{keep}"
    )


def _logits_named(case: Case[Probe]) -> str | None:
    """A mistake recognised by its shape: ties dropped at the k-th value, 0 instead of -inf."""
    got, want = case.got, case.want
    _, name, _, arg, _ = case.input.args
    if bool(torch.isnan(got.detach()).any()):
        return None
    if name == "top_k_filter" and _drops_ties(got, want, int(arg)):
        return _TIES_DROPPED
    zeros = want.clone()
    zeros[torch.isneginf(zeros)] = 0.0
    if same_logits(got, zeros) and not same_logits(want, zeros):
        return (
            "Removed entries must be -inf (float('-inf')), not 0: a logit of 0 still has "
            "probability exp(0) / Z after the softmax."
        )
    return None


def _as_logits(data: Any) -> Tensor | None:
    if data is None or isinstance(data, Tensor):
        return data
    return _tensor(data)


def judge_logits(
    probes: Sequence[Probe], expected: Lookup, mistakes: Callable[[Probe], Mapping[str, Any]]
) -> None:
    """A filter (or the temperature) on every probe, one diagnosis for them all.

    ``probe.args = (fn, name, logits, arg, arg_name)``; ``probe.rule`` is what a right answer
    does. Besides the catalogued mistakes, rows cut to exactly ``k`` tokens where ties keep
    more (top-k) and ``0`` instead of ``-inf`` are recognised.
    """
    judge_cases(
        probes,
        lambda probe: run_logits_fn(*probe.args)[0],
        lambda probe: _as_logits(expected(probe)),
        lambda probe: {h: _as_logits(m) for h, m in mistakes(probe).items()},
        same=same_logits,
        what=lambda probe: probe.what,
        describe=_describe_logits,
        rule=lambda case: case.input.rule,
        size=lambda probe: probe.args[2].numel(),
        named=_logits_named,
        input_kind=logits_input_kind,
    )


def logits_input_kind(probe: Probe) -> str:
    """What sets a logits probe apart, in the check's words (for a call that raised on it)."""
    _, name, logits, arg, *_ = probe.args
    n_tokens = logits.shape[-1]
    kinds = []
    if name == "top_k_filter" and arg > n_tokens:
        kinds.append(f"k above the vocabulary size (k={arg:g}, {n_tokens} tokens)")
    elif name == "top_k_filter" and arg == n_tokens:
        kinds.append(f"k equal to the vocabulary size ({n_tokens})")
    if bool(torch.isneginf(logits).any()):
        kinds.append("logits that already hold -inf")
    if logits.dim() != 2:
        kinds.append(f"logits with {logits.dim()} dimensions {tuple(logits.shape)}")
    if logits.dtype != torch.float32:
        kinds.append(f"{str(logits.dtype).removeprefix('torch.')} logits")
    return ", ".join(kinds) or f"logits of shape {tuple(logits.shape)}"


def logits_probe(
    fn: Callable[..., Any], name: str, logits: Tensor, arg: float, key: Any, rule: str
) -> Probe:
    """The probe of ``name(logits, arg)`` (``key`` finds its expected output)."""
    arg_name = {"apply_temperature": "t", "top_k_filter": "k", "top_p_filter": "p"}[name]
    what = f"{name}(logits {tuple(logits.shape)}, {arg_name}={arg})"
    return Probe((fn, name, logits, arg, arg_name), key, what, rule)


def _check_logits_examples(fn: Callable[..., Any], name: str, hint: str) -> None:
    keys, _ = example(f"{name}: examples")
    probes = []
    for key in keys:
        logits_data, _ = example(f"{key}: logits")
        (arg,), _ = example(f"{key}: argument")
        logits = torch.tensor(logits_data, dtype=torch.float32)
        probes.append(logits_probe(fn, name, logits, arg, key, hint))
    judge_logits(probes, *stored_lookups())


TEMPERATURE_HINT = "Divide the logits by t: logits / t (t < 1 sharpens, t > 1 flattens)."
TOP_K_HINT = (
    "Keep every logit >= the k-th largest logit of its row (ties at that value are all kept); "
    "set the others to -inf."
)
TOP_P_HINT = (
    "Sort each row by probability (highest first, ties by lower token id), keep each token "
    "whose preceding mass is < p (so the token that crosses p is kept), set the others to -inf."
)


def check_apply_temperature(fn: Callable[..., Any]) -> None:
    """Worked examples: one row at ``t = 0.5`` and ``t = 2``, a batch of rows at ``t = 0.7``."""
    _check_logits_examples(fn, "apply_temperature", TEMPERATURE_HINT)


def check_top_k_filter(fn: Callable[..., Any]) -> None:
    """Worked examples: ``k = 1, 2, 3`` on a row with a tie, a batch of rows, ``k`` = the
    vocabulary size."""
    _check_logits_examples(fn, "top_k_filter", TOP_K_HINT)


def check_top_p_filter(fn: Callable[..., Any]) -> None:
    """Worked examples: an unsorted row at ``p = 0.65`` and ``0.45`` (the crossing token kept),
    a batch of rows, ``p = 1``."""
    _check_logits_examples(fn, "top_p_filter", TOP_P_HINT)


# ======================================================================================
# beam_search
# ======================================================================================


class _StepFnBase:
    """What every stand-in next-token distribution checks about the prefixes it is given."""

    def __init__(self, bos_id: int, eos_id: int, max_len: int) -> None:
        self.bos_id, self.eos_id, self.max_len = bos_id, eos_id, max_len
        self.calls = 0

    def _prefix(self, prefix: Any) -> tuple[int, ...]:
        if isinstance(prefix, Tensor):
            prefix = prefix.flatten().tolist()
        try:
            seq = tuple(int(i) for i in prefix)
        except (TypeError, ValueError):
            raise AssertionError(
                f"your search called step_fn with {prefix!r}; it takes the prefix as a list of "
                "token ids, BOS first."
            ) from None
        self.calls += 1
        if not seq or seq[0] != self.bos_id:
            raise AssertionError(
                f"your search called step_fn with the prefix {list(seq)}: every hypothesis "
                f"starts with BOS (bos_id={self.bos_id}) and step_fn reads the whole prefix."
            )
        if self.eos_id in seq:
            raise AssertionError(
                f"your search extended {list(seq)}, which already ended with EOS "
                f"(eos_id={self.eos_id}): a hypothesis that produces EOS is finished; set it "
                "aside and never extend it."
            )
        if len(seq) >= self.max_len:
            raise AssertionError(
                f"your search extended {list(seq)}, which already has max_len={self.max_len} "
                "tokens: max_len counts every token, BOS (and EOS) included, so it may not grow."
            )
        return seq


class TableStepFn(_StepFnBase):
    """``step_fn(prefix) -> (V,)`` log-probabilities read from a hand-built table.

    Args:
        table: ``{prefix (tuple of ids): probabilities (V,)}``; a prefix not in the table gets
            ``default``.
        default: the distribution of every other prefix.
        bos_id, eos_id, max_len: what a correct search never violates (see the module).
    """

    def __init__(
        self,
        table: Mapping[tuple[int, ...], Sequence[float]],
        default: Sequence[float],
        *,
        bos_id: int,
        eos_id: int,
        max_len: int,
    ) -> None:
        super().__init__(bos_id, eos_id, max_len)
        self.table = {
            tuple(k): torch.tensor(v, dtype=torch.float64).log() for k, v in table.items()
        }
        self.default = torch.tensor(default, dtype=torch.float64).log()

    def row(self, seq: Sequence[int]) -> Tensor:
        """The log-probabilities ``(V,)`` after ``seq`` (float32), without the prefix checks."""
        return self.table.get(tuple(seq), self.default).float()

    def __call__(self, prefix: Any) -> Tensor:
        return self.row(self._prefix(prefix))

    def log_prob(self, seq: Sequence[int]) -> float:
        """Total log-probability of ``seq`` (BOS first) under the table."""
        return sum(float(self.row(seq[:t])[seq[t]]) for t in range(1, len(seq)))


class RandomStepFn(_StepFnBase):
    """A seeded random next-token distribution for every prefix (the same prefix, the same row).

    EOS becomes likelier as the prefix grows, so hypotheses finish at different lengths.
    """

    def __init__(
        self, vocab_size: int, seed: int, *, bos_id: int, eos_id: int, max_len: int
    ) -> None:
        super().__init__(bos_id, eos_id, max_len)
        self.vocab_size, self.seed = vocab_size, seed

    def row(self, seq: Sequence[int]) -> Tensor:
        """The log-probabilities ``(V,)`` after ``seq`` (float32), without the prefix checks."""
        key = self.seed
        for token in seq:
            key = (key * 1_000_003 + int(token) + 7) % (2**61 - 1)
        g = torch.Generator().manual_seed(key % (2**63 - 1))
        logits = 1.5 * torch.randn(self.vocab_size, generator=g, dtype=torch.float64)
        logits[self.eos_id] += 0.6 * len(seq) - 1.5
        return torch.log_softmax(logits, dim=-1).float()  # (V,)

    def __call__(self, prefix: Any) -> Tensor:
        return self.row(self._prefix(prefix))

    def log_prob(self, seq: Sequence[int]) -> float:
        """Total log-probability of ``seq`` (BOS first)."""
        return sum(float(self.row(seq[:t])[seq[t]]) for t in range(1, len(seq)))


def sequence_score(step_fn: TableStepFn | RandomStepFn, seq: Sequence[int]) -> float:
    """The total log-probability (the beam score) of ``seq`` under ``step_fn``."""
    return step_fn.log_prob(seq)


def run_beam(
    fn: Callable[..., Any],
    step_fn: TableStepFn | RandomStepFn,
    beam_width: int,
    max_len: int,
) -> tuple[list[int], str]:
    """The student's ``beam_search`` under the ban, as a list of ints."""
    bos, eos = step_fn.bos_id, step_fn.eos_id
    what = (
        f"beam_search(step_fn, bos_id={bos}, eos_id={eos}, beam_width={beam_width}, "
        f"max_len={max_len})"
    )
    got = call_forbidding(
        fn, (step_fn, bos, eos, beam_width, max_len), {}, ban=DECODING_BAN, what=what
    )
    if isinstance(got, Tensor):
        got = got.flatten().tolist()
    if not isinstance(got, list | tuple) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in got
    ):
        raise AssertionError(
            f"{what} returned {got!r:.100}; it should return the best hypothesis as a list of "
            "token ids, BOS first."
        )
    return list(got), what


def _screen_beam(case: Case[Probe]) -> None:
    """What no typical mistake of the search explains: a hypothesis of the wrong form."""
    got, want = case.got, case.want
    _, step_fn, _, max_len = case.input.args
    bos, eos = step_fn.bos_id, step_fn.eos_id
    if not got or got[0] != bos:
        raise AssertionError(
            f"{case.what} returned {got}, expected {want}: return the whole hypothesis, "
            f"starting with BOS (bos_id={bos})."
        )
    if eos in got[:-1]:
        raise AssertionError(
            f"{case.what} returned {got}, expected {want}: a hypothesis ends at its first EOS."
        )
    if len(got) > max_len:
        raise AssertionError(
            f"{case.what} returned {got} ({len(got)} tokens), expected {want}: "
            f"max_len={max_len} counts every token, BOS and EOS included."
        )


def _describe_beam(case: Case[Probe]) -> str:
    step_fn = case.input.args[1]
    return (
        f"{case.what} returned {case.got} (total log-probability "
        f"{sequence_score(step_fn, case.got):.4f}), expected {case.want} "
        f"({sequence_score(step_fn, case.want):.4f})."
    )


_BEAM_RULE = (
    "Each step: every live hypothesis proposes its beam_width most likely next tokens; rank all "
    "proposals by total log-probability; those ending in EOS among the best beam_width are "
    "finished; the best beam_width others go on. Return the best finished or live hypothesis."
)


def beam_probe(
    fn: Callable[..., Any], step_fn: TableStepFn | RandomStepFn, beam_width: int, key: Any
) -> Probe:
    """The probe of ``beam_search`` on ``step_fn`` at ``beam_width`` (its own ``max_len``)."""
    bos, eos, max_len = step_fn.bos_id, step_fn.eos_id, step_fn.max_len
    what = (
        f"beam_search(step_fn, bos_id={bos}, eos_id={eos}, beam_width={beam_width}, "
        f"max_len={max_len})"
    )
    return Probe((fn, step_fn, beam_width, max_len), key, what, _BEAM_RULE)


def _run_probe_beam(probe: Probe) -> list[int]:
    fn, step_fn, width, max_len = probe.args
    step_fn.calls = 0
    return run_beam(fn, step_fn, width, max_len)[0]


def judge_beam(
    probes: Sequence[Probe],
    expected: Lookup,
    mistakes: Callable[[Probe], Mapping[str, Any]],
    tell_apart: Sequence[Probe] = (),
) -> None:
    """``beam_search`` on every probe (:func:`beam_probe`); one diagnosis for them all
    (``tell_apart``: probes run only to tell mistakes apart, once one probe failed)."""
    judge_cases(
        probes,
        _run_probe_beam,
        lambda probe: list(expected(probe)),
        lambda probe: {h: None if m is None else list(m) for h, m in mistakes(probe).items()},
        same=_equal,
        what=lambda probe: probe.what,
        describe=_describe_beam,
        rule=_BEAM_RULE,
        size=lambda probe: probe.args[3] * probe.args[2],
        screen=_screen_beam,
        tell_apart=tell_apart,
    )


def table_step_fn(key: str) -> tuple[TableStepFn, dict[str, Any]]:
    """The stored hand-built table ``key`` as a :class:`TableStepFn`, and its settings."""
    spec, _ = example(f"{key}: table")
    table = {tuple(json.loads(prefix)): probs for prefix, probs in spec["table"].items()}
    step_fn = TableStepFn(
        table,
        spec["default"],
        bos_id=spec["bos_id"],
        eos_id=spec["eos_id"],
        max_len=spec["max_len"],
    )
    return step_fn, spec


def _check_beam_tables(fn: Callable[..., Any], keys: Sequence[str]) -> None:
    probes = []
    for key in keys:
        step_fn, spec = table_step_fn(key)
        for width in spec["widths"]:
            probes.append(beam_probe(fn, step_fn, width, f"{key}: beam_width={width}"))
    judge_beam(probes, *stored_lookups())


def check_beam_search(fn: Callable[..., Any]) -> None:
    """The notebook's table at ``beam_width`` 1 (greedy), 2 and 3: the expected hypotheses
    and their total log-probabilities."""
    _check_beam_tables(fn, ("beam lecture",))


def check_beam_search_eos(fn: Callable[..., Any]) -> None:
    """Three small tables: an early EOS that is not the answer (a live hypothesis scores better),
    a best hypothesis still live at ``max_len``, and a short hypothesis that wins by total
    log-probability (not per token)."""
    _check_beam_tables(fn, ("beam eos", "beam max_len", "beam length"))

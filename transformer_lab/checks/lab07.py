"""Visible checks of lab 07 (the NLP pipeline and decoding): every part an
:class:`~transformer_lab.checks._generated.Ordinary` under the spec's bans, judged on the stored
worked examples. Prince, *Understanding Deep Learning*, 12.5 and 12.7.3.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from transformer_lab.checks import spec
from transformer_lab.checks._common import (
    Case,
    call_forbidding,
    expect_shape,
    expect_true,
    stored_data,
)
from transformer_lab.checks._generated import Ordinary, as_list

#: The special tokens of the lab's ``CharTokenizer``, ids 0, 1, 2, 3.
SPECIALS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>")
#: The end-of-word symbol of BPE.
END_OF_WORD = "</w>"

#: The lab's spec (``specs/lab07.toml``): its bans and tolerances.
SPEC = spec.load("07_nlp_pipeline")
TOKENIZER_BAN = SPEC.ban("tokenizer")
DECODING_BAN = SPEC.ban("decoding")


def _method(tok: Any, name: str, arg: Any, what: str, on_error: str = "") -> Any:
    """``tok.<name>(arg)`` under the tokenizer ban (a missing method raises AttributeError)."""
    return call_forbidding(
        lambda: getattr(tok, name)(arg), (), {}, ban=TOKENIZER_BAN, what=what, on_error=on_error
    )


def expect_vocab_size(tok: Any, text: str, what: str) -> None:
    """``tok.vocab_size`` after fitting ``text``: the int 4 + the distinct characters (a bool,
    at most 1, is never that)."""
    what += ".vocab_size"
    got = call_forbidding(lambda: tok.vocab_size, (), {}, ban=TOKENIZER_BAN, what=what)
    want = len(SPECIALS) + len(set(text))
    expect_true(
        isinstance(got, int) and got == want,
        f"{what} is {got!r:.60} ({type(got).__name__}); it should be an int, {want}: count the "
        "4 special tokens plus one id per DISTINCT character fitted.",
    )


def fitted_tokenizers(cls: Callable[..., Any], texts: Iterable[str]) -> dict[str, Any]:
    """``{text: CharTokenizer().fit(text)}`` for each distinct text (``fit`` returns the
    tokenizer; ``vocab_size`` checked)."""
    toks = {}
    for text in dict.fromkeys(texts):
        what = f"CharTokenizer().fit({text!r})"
        toks[text] = call_forbidding(cls, (), {}, ban=TOKENIZER_BAN, what="CharTokenizer()")
        returned = _method(toks[text], "fit", text, what)
        expect_true(
            returned is toks[text],
            f"{what} returned {type(returned).__name__}, not the tokenizer: end fit with "
            "`return self`, so that `tok = CharTokenizer().fit(text)` works.",
        )
        expect_vocab_size(toks[text], text, what)
    return toks


def encode_with(tok: Any, text: str) -> list[int]:
    """``tok.encode(text)`` under the ban, as a list of Python ints."""
    what = f"tokenizer.encode({text!r})"
    unknown = "A character that fit never saw becomes <unk> (id 3): self.stoi.get(ch, 3)."
    return as_list(_method(tok, "encode", text, what, unknown), what, int, "a list of ints")


#: ``encode`` of a case ``(text fitted, text)``; the answer: the tokenizers by text fitted.
CHAR_ENCODE = Ordinary(
    "lab07",
    call=lambda toks, fit_text, text: encode_with(toks[fit_text], text),
    what=lambda fit_text, text: f"tokenizer.encode({text!r:.40})",
    rule=f"Ids 0-3 are the specials {', '.join(SPECIALS)}; the characters fitted follow in "
    "sorted order (sorted(set(text))), from id 4; encode gives one id per character, an "
    "unknown one <unk> (id 3).",
    size=lambda fit_text, text: len(text),
)
#: ``decode`` of a case ``(text fitted, ids)``; the answer: the tokenizers by text fitted.
CHAR_DECODE = Ordinary(
    "lab07",
    call=lambda toks, fit_text, ids: _method(
        toks[fit_text], "decode", ids, f"tokenizer.decode({ids})"
    ),
    what=lambda fit_text, ids: f"tokenizer.decode({ids})",
    rule="decode writes each character id as its character, with nothing between them, and "
    "each special id as its name (for example '<unk>').",
    size=lambda fit_text, ids: len(ids),
)


def check_char_tokenizer(cls: Callable[..., Any]) -> None:
    """The worked example: fit on a sentence, ``encode`` and ``decode``."""
    texts = CHAR_ENCODE.examples("check_char_tokenizer encode")
    ids = CHAR_DECODE.examples("check_char_tokenizer decode")
    toks = fitted_tokenizers(cls, [example.args[0] for example in texts])
    CHAR_ENCODE.judge(toks, texts)
    CHAR_DECODE.judge(toks, ids)


def run_bpe_train(fn: Callable[..., Any], text: str, num_merges: int) -> list[tuple[str, str]]:
    """The student's ``bpe_train(text, num_merges)`` under the ban, as a list of tuples."""
    what = f"bpe_train({text!r:.40}, {num_merges})"
    stop = "Stop early when no pair is left to merge (every word is one symbol)."
    got = call_forbidding(fn, (text, num_merges), {}, ban=TOKENIZER_BAN, what=what, on_error=stop)
    pairs = as_list(got, what, (list, tuple), "a list of (left, right) pairs of strings")
    return [tuple(pair) for pair in pairs]


#: ``bpe_train`` of a case ``(text, num_merges)``.
BPE_TRAIN = Ordinary(
    "lab07",
    call=run_bpe_train,
    what=lambda text, num_merges: f"bpe_train({text!r:.40}, {num_merges})",
    rule="Each step counts every adjacent pair of symbols inside the words (word frequency "
    "included), merges the most frequent pair (ties: the smallest pair) in every word, and "
    "records it; stop after num_merges merges, or earlier when no pair is left.",
    size=lambda text, num_merges: len(text) + num_merges,
    output=lambda merges: [tuple(pair) for pair in merges],
)


check_bpe_train = BPE_TRAIN.visible(
    "check_bpe_train",
    """Worked examples: the lecture's rhyme (10 merges) and a few words (6 merges).""",
)
check_bpe_train_rules = BPE_TRAIN.visible(
    "check_bpe_train_rules",
    """The stated rules on tiny texts: overlapping pairs, ties, frequencies, stopping early.""",
)


def run_bpe_encode(fn: Callable[..., Any], text: str, merges: Sequence[Sequence[str]]) -> list[str]:
    """The student's ``bpe_encode(text, merges)`` under the ban, as a list of strings."""
    what = f"bpe_encode({text!r:.40}, merges)"
    got = call_forbidding(fn, (text, [tuple(m) for m in merges]), {}, ban=TOKENIZER_BAN, what=what)
    return as_list(got, what, str, f"the list of pieces, e.g. ['low', 'er{END_OF_WORD}']")


#: ``bpe_encode`` of a case ``(text, merges)``.
BPE_ENCODE = Ordinary(
    "lab07",
    call=run_bpe_encode,
    what=lambda text, merges: f"bpe_encode({text!r:.40}, merges)",
    rule=f"Split the text into words, each its characters and {END_OF_WORD}; in each word, "
    "repeatedly merge the adjacent pair that was learned EARLIEST (all its occurrences, left to "
    "right) until no learned pair is left.",
    size=lambda text, merges: len(text) + len(merges),
)


check_bpe_encode = BPE_ENCODE.visible(
    "check_bpe_encode",
    """Worked examples: the rhyme's merges on the rhyme and new words; the order of merging.""",
)


def same_logits(got: Tensor, want: Tensor) -> bool:
    """``got`` has ``want``'s shape and values (``-inf`` too) at the ``logits`` tolerance."""
    tol = SPEC.tol("logits")
    got = got.detach().to("cpu", torch.float64)
    return got.shape == want.shape and torch.allclose(got, want, atol=tol, rtol=tol)


def _rounded(t: Tensor) -> Any:
    """``t`` as nested lists of numbers rounded to 3 digits (``-inf`` as ``-inf``)."""
    return t.detach().to("cpu", torch.float64).round(decimals=3).tolist()


def _describe_logits(case: Case[Any]) -> str:
    """The call (with its logits when they are few), what it returned and what was expected."""
    logits = case.input.args[0]
    shown = case.what + (f" with logits = {_rounded(logits)}" if logits.numel() <= 16 else "")
    return f"{shown} returned {_rounded(case.got)!s:.300}, expected {_rounded(case.want)!s:.300}."


def _logits_part(name: str, arg_name: str, rule: str) -> Ordinary:
    """The :class:`Ordinary` of ``name(logits, arg)``, a case ``(logits, arg)``."""

    def what(logits: Tensor, arg: float) -> str:
        return f"{name}(logits {tuple(logits.shape)}, {arg_name}={arg})"

    def call(fn: Callable[..., Any], logits: Tensor, arg: float) -> Tensor:
        shown = what(logits, arg)
        in_place = "changed the logits it was given (in place): return a new tensor."
        got = call_forbidding(
            fn, (logits, arg), {}, ban=DECODING_BAN, what=shown, in_place=in_place
        )
        got = expect_shape(got, tuple(logits.shape), shown)
        expect_true(got.is_floating_point(), f"{shown} has dtype {got.dtype}; return float logits.")
        return got

    def input_kind(logits: Tensor, arg: float) -> str:
        if name == "top_k_filter" and arg > logits.shape[-1]:
            return f"k above the vocabulary size (k={arg:g}, {logits.shape[-1]} tokens)"
        return f"logits of shape {tuple(logits.shape)}"

    return Ordinary(
        "lab07",
        call=call,
        what=what,
        describe=_describe_logits,
        rule=rule,
        same=same_logits,
        size=lambda logits, arg: logits.numel(),
        input_kind=input_kind,
        load=lambda logits, arg: (torch.tensor(logits, dtype=torch.float32), arg),
        output=lambda out: torch.as_tensor(out, dtype=torch.float64),
    )


TEMPERATURE = _logits_part(
    "apply_temperature", "t", "Divide the logits by t: logits / t (t < 1 sharpens, t > 1 flattens)."
)
TOP_K = _logits_part(
    "top_k_filter",
    "k",
    "Keep every logit >= the k-th largest logit of its row (ties at that value are all kept; "
    "k >= the vocabulary size keeps every token); set the others to -inf.",
)
TOP_P = _logits_part(
    "top_p_filter",
    "p",
    "Sort each row by probability (highest first, ties by lower token id), keep each token "
    "whose preceding mass is < p (so the token that crosses p is kept; p = 1 keeps every "
    "token), set the others to -inf.",
)


check_apply_temperature = TEMPERATURE.visible(
    "check_apply_temperature",
    """Worked examples: one row at ``t = 0.5`` and ``t = 2``, a batch of rows at ``t = 0.7``.""",
)
check_top_k_filter = TOP_K.visible(
    "check_top_k_filter",
    """Worked examples: ``k = 1, 2, 3`` on a row with a tie, a batch, ``k`` = the vocabulary.""",
)
check_top_p_filter = TOP_P.visible(
    "check_top_p_filter",
    """Worked examples: an unsorted row at ``p = 0.65`` and ``0.45``, a batch, ``p = 1``.""",
)


class _StepFn:
    """``step_fn(prefix) -> (V,)`` log-probabilities, refusing what a correct search never asks."""

    def __init__(self, bos_id: int, eos_id: int, max_len: int) -> None:
        self.bos_id, self.eos_id, self.max_len = bos_id, eos_id, max_len

    def row(self, seq: Sequence[int]) -> Tensor:
        """The log-probabilities ``(V,)`` after ``seq`` (float32), without the prefix checks."""
        raise NotImplementedError

    def __call__(self, prefix: Any) -> Tensor:
        seq = tuple(int(i) for i in (prefix.flatten() if isinstance(prefix, Tensor) else prefix))
        expect_true(
            bool(seq) and seq[0] == self.bos_id,
            f"your search called step_fn({list(seq)}): every prefix starts with BOS "
            f"(bos_id={self.bos_id}).",
        )
        expect_true(
            self.eos_id not in seq,
            f"your search extended {list(seq)}, which already ended with EOS "
            f"(eos_id={self.eos_id}): a finished hypothesis is set aside, never extended.",
        )
        expect_true(
            len(seq) < self.max_len,
            f"your search extended {list(seq)} past max_len={self.max_len}: max_len counts "
            "every token, BOS (and EOS) included.",
        )
        return self.row(seq)


class TableStepFn(_StepFn):
    """Log-probabilities from a stored table: ``{"table": {"[0, 2]": probabilities}, "default",
    "bos_id", "eos_id", "max_len"}``."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__(spec["bos_id"], spec["eos_id"], spec["max_len"])
        self.table = {
            tuple(json.loads(prefix)): torch.tensor(probs, dtype=torch.float64).log()
            for prefix, probs in spec["table"].items()
        }
        self.default = torch.tensor(spec["default"], dtype=torch.float64).log()

    def row(self, seq: Sequence[int]) -> Tensor:
        return self.table.get(tuple(seq), self.default).float()


class RandomStepFn(_StepFn):
    """A seeded random distribution per prefix; EOS likelier as the prefix grows."""

    def __init__(
        self, vocab_size: int, seed: int, *, bos_id: int, eos_id: int, max_len: int
    ) -> None:
        super().__init__(bos_id, eos_id, max_len)
        self.vocab_size, self.seed = vocab_size, seed

    def row(self, seq: Sequence[int]) -> Tensor:
        key = self.seed
        for token in seq:
            key = (key * 1_000_003 + int(token) + 7) % (2**61 - 1)
        g = torch.Generator().manual_seed(key % (2**63 - 1))
        logits = 1.5 * torch.randn(self.vocab_size, generator=g, dtype=torch.float64)
        logits[self.eos_id] += 0.6 * len(seq) - 1.5
        return torch.log_softmax(logits, dim=-1).float()  # (V,)


def sequence_score(step_fn: _StepFn, seq: Sequence[int]) -> float:
    """The total log-probability (the beam score) of ``seq`` (BOS first) under ``step_fn``."""
    return sum(float(step_fn.row(seq[:t])[seq[t]]) for t in range(1, len(seq)))


def table_step_fn(key: str) -> tuple[TableStepFn, dict[str, Any]]:
    """The stored table ``key`` (``"beam lecture"``) as a :class:`TableStepFn`, and its spec."""
    spec, _ = stored_data("lab07", f"{key}: table")
    return TableStepFn(spec), spec


def _beam_what(step_fn: _StepFn, beam_width: int) -> str:
    return (
        f"beam_search(step_fn, bos_id={step_fn.bos_id}, eos_id={step_fn.eos_id}, "
        f"beam_width={beam_width}, max_len={step_fn.max_len})"
    )


def run_beam(fn: Callable[..., Any], step_fn: _StepFn, beam_width: int) -> list[int]:
    """The student's ``beam_search`` under the ban, as a list of ints."""
    what = _beam_what(step_fn, beam_width)
    args = (step_fn, step_fn.bos_id, step_fn.eos_id, beam_width, step_fn.max_len)
    got = call_forbidding(fn, args, {}, ban=DECODING_BAN, what=what)
    return as_list(got, what, int, "the best hypothesis as a list of token ids, BOS first")


def _describe_beam(case: Case[Any]) -> str:
    step_fn = case.input.args[0]
    return (
        f"{case.what} returned {case.got} (total log-probability "
        f"{sequence_score(step_fn, case.got):.4f}), expected {case.want} "
        f"({sequence_score(step_fn, case.want):.4f})."
    )


#: ``beam_search`` of a case ``(step_fn, beam_width)`` (stored: a table's spec and the width).
BEAM = Ordinary(
    "lab07",
    call=run_beam,
    what=_beam_what,
    describe=_describe_beam,
    rule="Each step: every live hypothesis proposes its beam_width most likely next tokens; "
    "rank all proposals by total log-probability; those ending in EOS among the best beam_width "
    "are finished; the best beam_width others go on. Return the best finished or live "
    "hypothesis, BOS first.",
    size=lambda step_fn, beam_width: step_fn.max_len * beam_width,
    load=lambda table, beam_width: (TableStepFn(table), beam_width),
    output=list,
)


check_beam_search = BEAM.visible(
    "check_beam_search",
    """The notebook's table at ``beam_width`` 1 (greedy), 2 and 3.""",
)
check_beam_search_eos = BEAM.visible(
    "check_beam_search_eos",
    """An early EOS that loses, a winner live at ``max_len``, a short winner by total.""",
)


#: The visible checks and the two helpers the notebook calls, by name.
__all__ = [*sorted(n for n in dir() if n.startswith("check_")), "sequence_score", "table_step_fn"]

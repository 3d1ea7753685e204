"""Seeded synthetic tasks: copy, reverse, sort, majority and addition, as batches of token ids.

Toy tasks let a Transformer be trained in seconds on a CPU while still needing what makes the
architecture interesting: reversing a sequence cannot be done token by token, a token must *look
at another position*, and that position is only known through the positional encoding. Sorting
needs every token to compare itself with all others; majority (which symbol occurs most often)
needs one label for a whole sequence, the job of a sequence-level head; addition needs carries
that travel from the last digit to the first.

Every function here draws from an explicit ``torch.Generator`` (never the global RNG), so the
same seed gives the same data on every machine and in every process.

Encoding shared by all tasks (also in :data:`PAD_ID`, :data:`BOS_ID`, :data:`EOS_ID`):

* id 0 is padding, id 1 begins a target sequence (BOS), id 2 ends one (EOS);
* symbol ``s`` (``0 <= s < num_symbols``) has id ``3 + s``; its printable name is
  ``SYMBOL_CHARS[s]`` (``"0".."9"``, then letters), so ``num_symbols=10`` prints as digits;
* addition uses the 12 symbols ``"0123456789+="`` (ids 3..14).

Formats (the batch contract of ``docs/contracts.md``):

* ``"tagging"`` (encoder; copy, reverse, sort): ``tokens (N, T)``, ``padding_mask (N, T)``
  (True at real tokens), ``targets (N, T)`` with the answer symbol at every real position and
  -100 (ignored by the loss) at padding. Example, reverse: tokens ``[3 5 4]`` -> targets
  ``[4 5 3]``. The majority task is the sequence-head variant: ``targets (N,)`` holds the id of
  the symbol that occurs most often among the real tokens (ties go to the smallest symbol).
* ``"seq2seq"`` (encoder-decoder; all tasks): ``src (N, S)``, ``src_padding_mask (N, S)``,
  ``tgt_in (N, T)`` = BOS followed by the answer, ``tgt_out (N, T)`` = the answer followed by EOS,
  both padded with 0, and ``tgt_padding_mask (N, T)``.
* ``"lm"`` (decoder-only; addition): the whole problem as one sequence
  ``BOS a + b = c EOS``; ``tokens`` is that sequence without its last id, ``targets`` the sequence
  shifted left by one, with -100 wherever the next id is part of the question (the model is not
  asked to predict random operands) or padding. Only the answer digits and EOS are scored.

Reference: the toy tasks follow the spirit of minGPT's ``SortDataset``/``AdditionDataset``
(Karpathy) and the copy/reverse tasks used to test sequence models since Graves et al.,
"Neural Turing Machines" (2014).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = [
    "ADDITION_SYMBOLS",
    "BOS_ID",
    "EOS_ID",
    "FORMATS",
    "IGNORE_INDEX",
    "MAX_DIGITS",
    "NUM_SPECIAL",
    "PAD_ID",
    "SYMBOL_CHARS",
    "TASKS",
    "draw_disjoint",
    "input_key",
    "make_addition",
    "make_sequence_task",
    "make_split",
    "make_task",
    "split_generator",
    "task_symbols",
    "to_seq2seq",
]

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
NUM_SPECIAL = 3  # ids below this are pad, bos, eos; symbols start here
IGNORE_INDEX = -100  # what ``nn.CrossEntropyLoss`` ignores by default
SYMBOL_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
ADDITION_SYMBOLS = "0123456789+="
TASKS: tuple[str, ...] = ("copy", "reverse", "sort", "majority", "addition")
FORMATS: tuple[str, ...] = ("tagging", "seq2seq", "lm")
_SEQUENCE_TASKS = ("copy", "reverse", "sort", "majority")
MAX_DIGITS = 18  # 10**18 still fits in int64


def split_generator(seed: int, split: str) -> torch.Generator:
    """A generator for one split, independent of every other split and seed.

    The train and validation sets must not share a random stream, otherwise validation would
    replay training examples. Hashing ``(seed, split)`` gives each pair its own stream.

    Args:
        seed: the user's seed.
        split: a name such as ``"train"``, ``"val"`` or ``"test"``.

    Returns:
        A CPU ``torch.Generator`` seeded from ``sha256(f"{seed}:{split}")``.
    """
    digest = hashlib.sha256(f"{seed}:{split}".encode()).hexdigest()
    return torch.Generator().manual_seed(int(digest[:15], 16))


def task_symbols(task: str, num_symbols: int = 10) -> str:
    """The printable symbol of each symbol id, in id order (id ``3 + i`` prints ``result[i]``)."""
    if task == "addition":
        return ADDITION_SYMBOLS
    _check_task(task)
    _check_num_symbols(num_symbols)
    return SYMBOL_CHARS[:num_symbols]


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"task={task!r} is not one of {TASKS}")


def _check_num_symbols(num_symbols: int) -> None:
    if not 1 <= num_symbols <= len(SYMBOL_CHARS):
        raise ValueError(f"num_symbols={num_symbols} must be between 1 and {len(SYMBOL_CHARS)}")


def _reverse_real(tokens: Tensor, lengths: Tensor) -> Tensor:
    """Reverse the first ``lengths[i]`` entries of each row; padding stays where it is."""
    n, t = tokens.shape
    pos = torch.arange(t).expand(n, t)  # (N, T)
    src = torch.where(pos < lengths[:, None], lengths[:, None] - 1 - pos, pos)  # (N, T)
    return tokens.gather(1, src)


def _sort_real(tokens: Tensor, lengths: Tensor) -> Tensor:
    """Sort the first ``lengths[i]`` entries of each row ascending; padding stays at the end."""
    t = tokens.shape[1]
    real = torch.arange(t)[None, :] < lengths[:, None]  # (N, T)
    big = torch.iinfo(tokens.dtype).max
    # Padding is pushed past every symbol, sorted to the end, then written back as padding.
    ordered = torch.where(real, tokens, big).sort(dim=1).values
    return torch.where(real, ordered, PAD_ID)


def _majority(tokens: Tensor, lengths: Tensor) -> Tensor:
    """Id of the most frequent real symbol of each row ``(N,)``; ties go to the smallest id."""
    n, t = tokens.shape
    real = torch.arange(t)[None, :] < lengths[:, None]  # (N, T)
    counts = torch.zeros(n, int(tokens.max()) + 1, dtype=torch.long)  # (N, V)
    counts.scatter_add_(1, tokens, real.long())
    return counts.argmax(dim=1)  # argmax returns the first (smallest) id among equal counts


_ANSWER: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "copy": lambda tokens, lengths: tokens.clone(),
    "reverse": _reverse_real,
    "sort": _sort_real,
}


def make_sequence_task(
    task: str,
    n: int,
    *,
    seq_len: int = 16,
    num_symbols: int = 10,
    min_len: int | None = None,
    format: str = "tagging",
    generator: torch.Generator,
) -> dict[str, Tensor]:
    """Draw ``n`` examples of the copy, reverse or sort task.

    Symbols are drawn uniformly and independently (sort therefore sees repeated symbols).

    Args:
        task: ``"copy"``, ``"reverse"``, ``"sort"`` or ``"majority"`` (tagging only).
        n: number of examples ``N``.
        seq_len: longest input ``T`` (every input has this length when ``min_len`` is None).
        num_symbols: size of the alphabet; symbol ids are ``3 .. 2 + num_symbols``.
        min_len: shortest input; lengths are uniform in ``[min_len, seq_len]`` and shorter inputs
            are padded with 0. None means fixed length ``seq_len``.
        format: ``"tagging"`` or ``"seq2seq"`` (see the module docstring).
        generator: the source of randomness.

    Returns:
        A dict of tensors, first dimension ``N``. Tagging: ``tokens``, ``padding_mask``,
        ``targets``, each ``(N, T)`` (majority: ``targets (N,)``). Seq2seq: ``src``,
        ``src_padding_mask`` ``(N, T)`` and ``tgt_in``, ``tgt_out``, ``tgt_padding_mask``
        ``(N, T + 1)``.

    Raises:
        ValueError: for an unknown task or format, or inconsistent lengths.
    """
    if task not in _SEQUENCE_TASKS:
        raise ValueError(f"task={task!r} is not one of {_SEQUENCE_TASKS}")
    if format not in ("tagging", "seq2seq"):
        raise ValueError(
            f"format={format!r} is not available for task={task!r}: use 'tagging' or 'seq2seq'"
        )
    _check_num_symbols(num_symbols)
    if n < 0 or seq_len < 1:
        raise ValueError(f"n={n} must be >= 0 and seq_len={seq_len} >= 1")
    min_len = seq_len if min_len is None else min_len
    if not 1 <= min_len <= seq_len:
        raise ValueError(f"min_len={min_len} must be between 1 and seq_len={seq_len}")

    tokens = torch.randint(
        NUM_SPECIAL, NUM_SPECIAL + num_symbols, (n, seq_len), generator=generator
    )
    if min_len < seq_len:
        lengths = torch.randint(min_len, seq_len + 1, (n,), generator=generator)  # (N,)
    else:
        lengths = torch.full((n,), seq_len, dtype=torch.long)
    mask = torch.arange(seq_len)[None, :] < lengths[:, None]  # (N, T), True at real tokens
    tokens = tokens.masked_fill(~mask, PAD_ID)
    if task == "majority":
        if format != "tagging":
            raise ValueError(
                f"format={format!r} is not available for task='majority': use 'tagging'"
            )
        return {"tokens": tokens, "padding_mask": mask, "targets": _majority(tokens, lengths)}
    answer = _ANSWER[task](tokens, lengths)  # (N, T), padded with PAD_ID

    if format == "tagging":
        return {
            "tokens": tokens,
            "padding_mask": mask,
            "targets": answer.masked_fill(~mask, IGNORE_INDEX),
        }
    return to_seq2seq(tokens, mask, answer, lengths)


def to_seq2seq(
    src: Tensor, src_mask: Tensor, answer: Tensor, answer_len: Tensor
) -> dict[str, Tensor]:
    """Package a seq2seq batch: the answers become decoder input (BOS first) and output (EOS last).

    Args:
        src: encoder input ``(N, S)``, padded with 0.
        src_mask: ``(N, S)``, True at real source tokens.
        answer: right-padded answers ``(N, L)``.
        answer_len: real length of each answer ``(N,)``.

    Returns:
        ``src``, ``src_padding_mask`` ``(N, S)``; ``tgt_in``, ``tgt_out``, ``tgt_padding_mask``
        ``(N, L + 1)``.
    """
    n, length = answer.shape
    pad_col = torch.full((n, 1), PAD_ID, dtype=torch.long)
    tgt_in = torch.cat([torch.full((n, 1), BOS_ID, dtype=torch.long), answer], dim=1)  # (N, L+1)
    tgt_out = torch.cat([answer, pad_col], dim=1)  # (N, L+1)
    tgt_out[torch.arange(n), answer_len] = EOS_ID
    # Real target positions: the answer_len symbols plus the EOS step.
    tgt_mask = torch.arange(length + 1)[None, :] <= answer_len[:, None]  # (N, L+1)
    return {
        "src": src,
        "src_padding_mask": src_mask,
        "tgt_in": tgt_in,
        "tgt_out": tgt_out,
        "tgt_padding_mask": tgt_mask,
    }


def _digits(value: int) -> list[int]:
    """Symbol ids of the decimal digits of ``value`` (most significant first)."""
    return [NUM_SPECIAL + int(c) for c in str(value)]


def _pad_rows(rows: list[list[int]], length: int, fill: int) -> Tensor:
    out = torch.full((len(rows), length), fill, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


_PLUS_ID = NUM_SPECIAL + ADDITION_SYMBOLS.index("+")
_EQUALS_ID = NUM_SPECIAL + ADDITION_SYMBOLS.index("=")


def make_addition(
    n: int,
    *,
    num_digits: int = 2,
    format: str = "seq2seq",
    generator: torch.Generator,
) -> dict[str, Tensor]:
    """Draw ``n`` addition problems ``a + b`` with ``0 <= a, b < 10**num_digits``.

    Numbers are written in decimal, most significant digit first, without leading zeros, so
    "12+34" becomes the ids of ``1 2 + 3 4`` and its answer "46" the ids of ``4 6``.

    Args:
        n: number of problems ``N``.
        num_digits: digits per operand ``d``.
        format: ``"seq2seq"`` (``src`` = "a+b", answer "c") or ``"lm"`` (one sequence
            "BOS a+b=c EOS", only the answer and EOS scored).
        generator: the source of randomness.

    Returns:
        Seq2seq: ``src``, ``src_padding_mask`` ``(N, 2d+1)``; ``tgt_in``, ``tgt_out``,
        ``tgt_padding_mask`` ``(N, d+2)``. LM: ``tokens``, ``targets`` ``(N, 3d+4)``.

    Raises:
        ValueError: for a bad ``num_digits`` or format.
    """
    if format not in ("seq2seq", "lm"):
        raise ValueError(
            f"format={format!r} is not available for task='addition': use 'seq2seq' or 'lm'"
        )
    if not 1 <= num_digits <= MAX_DIGITS:
        raise ValueError(f"num_digits={num_digits} must be between 1 and {MAX_DIGITS}")
    if n < 0:
        raise ValueError(f"n={n} must be >= 0")
    operands = torch.randint(0, 10**num_digits, (n, 2), generator=generator)  # (N, 2)
    questions, answers = [], []
    for a, b in operands.tolist():
        questions.append([*_digits(a), _PLUS_ID, *_digits(b)])
        answers.append(_digits(a + b))

    if format == "seq2seq":
        src_len, ans_len = 2 * num_digits + 1, num_digits + 1
        src = _pad_rows(questions, src_len, PAD_ID)
        answer = _pad_rows(answers, ans_len, PAD_ID)
        answer_len = torch.tensor([len(a) for a in answers], dtype=torch.long)
        q_len = torch.tensor([len(q) for q in questions], dtype=torch.long)
        src_mask = torch.arange(src_len)[None, :] < q_len[:, None]  # (N, S)
        return to_seq2seq(src, src_mask, answer, answer_len)

    # LM: BOS q = c EOS, padded; 3d+5 ids in the longest row, so inputs/targets have 3d+4.
    full_len = 3 * num_digits + 5
    seqs, scored = [], []
    for q, c in zip(questions, answers, strict=True):
        seqs.append([BOS_ID, *q, _EQUALS_ID, *c, EOS_ID])
        # targets[i] holds seq[i + 1]; only the answer digits and EOS are scored. The first
        # answer digit sits at index len(q) + 2 of seq, so it is predicted at index len(q) + 1.
        scored.append((len(q) + 1, len(c) + 1))
    seq = _pad_rows(seqs, full_len, PAD_ID)  # (N, 3d+5)
    tokens = seq[:, :-1]  # (N, 3d+4)
    targets = torch.full_like(tokens, IGNORE_INDEX)
    for i, (start, count) in enumerate(scored):
        targets[i, start : start + count] = seq[i, start + 1 : start + 1 + count]
    return {"tokens": tokens, "targets": targets}


def make_task(
    task: str,
    n: int,
    *,
    format: str,
    generator: torch.Generator,
    seq_len: int = 16,
    num_symbols: int = 10,
    min_len: int | None = None,
    num_digits: int = 2,
) -> dict[str, Tensor]:
    """Dispatch to :func:`make_sequence_task` or :func:`make_addition` (see those)."""
    _check_task(task)
    if task == "addition":
        return make_addition(n, num_digits=num_digits, format=format, generator=generator)
    return make_sequence_task(
        task,
        n,
        seq_len=seq_len,
        num_symbols=num_symbols,
        min_len=min_len,
        format=format,
        generator=generator,
    )


def input_key(data: dict[str, Tensor]) -> Tensor:
    """What the model is shown, one row per example: the encoder input, or the LM question.

    Two examples with equal rows count as the same example when splits are made disjoint.
    """
    if "src" in data:
        return data["src"]
    if "padding_mask" in data:  # tagging
        return data["tokens"]
    # LM: the question is everything before the first scored position.
    return data["tokens"].masked_fill(data["targets"] != IGNORE_INDEX, PAD_ID)


def draw_disjoint(
    draw: Callable[[int], dict[str, Tensor]],
    n: int,
    *,
    exclude: dict[str, Tensor] | None = None,
    what: str = "examples",
    key: Callable[[dict[str, Tensor]], Tensor] = input_key,
    max_rounds: int = 50,
) -> dict[str, Tensor]:
    """Call ``draw(k)`` until ``n`` examples whose input is absent from ``exclude`` are collected.

    Args:
        draw: returns ``k`` fresh examples as a dict of tensors (first dimension ``k``); it must
            advance its own generator so that repeated calls give new examples.
        n: number of examples wanted.
        exclude: another split; no returned example has the same ``key`` row as one of its
            examples.
        what: a description for the error message.
        key: maps a batch dict to one row per example identifying it (default
            :func:`input_key`); rows equal to a row of ``exclude`` are dropped.
        max_rounds: how many top-ups to try after removing clashes before giving up.

    Returns:
        A dict of tensors with first dimension ``n``.

    Raises:
        ValueError: if ``n`` unseen examples cannot be found (too few distinct inputs exist).
    """
    if exclude is None:
        return draw(n)
    seen = {tuple(row) for row in key(exclude).tolist()}
    parts: list[dict[str, Tensor]] = []
    have = 0
    for _ in range(max_rounds):
        if have >= n:
            break
        chunk = draw(max(n - have, 16))
        keep = torch.tensor(
            [tuple(row) not in seen for row in key(chunk).tolist()], dtype=torch.bool
        )
        if keep.any():
            parts.append({k: v[keep] for k, v in chunk.items()})
            have += int(keep.sum())
    if have < n:
        raise ValueError(
            f"could not draw {n} {what} absent from the other split's {len(seen)} distinct "
            "inputs: the task has too few distinct inputs; lower num_train/num_val or make the "
            "task larger"
        )
    return {k: torch.cat([p[k] for p in parts])[:n] for k in parts[0]}


def make_split(
    task: str,
    n: int,
    *,
    seed: int,
    split: str,
    format: str,
    exclude: dict[str, Tensor] | None = None,
    **params: int | None,
) -> dict[str, Tensor]:
    """Draw one split of a task from its own seed stream, optionally disjoint from another split.

    Args:
        task, format, params: as in :func:`make_task`.
        n: number of examples wanted.
        seed: the user's seed; the split's stream is :func:`split_generator` ``(seed, split)``.
        split: name of the split (``"train"``, ``"val"``, ...).
        exclude: another split (e.g. the training set); no returned example has the same input
            as any example in it, so validation measures generalisation to unseen sequences.

    Returns:
        The split as a dict of tensors with first dimension ``n``.

    Raises:
        ValueError: if ``n`` examples unseen in ``exclude`` cannot be found (the task has too few
            distinct inputs, e.g. one-digit addition has only 100).
    """
    generator = split_generator(seed, split)

    def draw(k: int) -> dict[str, Tensor]:
        return make_task(task, k, format=format, generator=generator, **params)  # type: ignore[arg-type]

    return draw_disjoint(
        draw, n, exclude=exclude, what=f"{split} examples of task={task!r} ({params})"
    )

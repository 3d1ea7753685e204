"""The kit's catalogue of typical mistakes, one entry per mistake, for every lab.

The wrong answers and the checks each must fail live in ``tests/test_labNN_checks.py`` (each
table: a wrong answer, the checks it fails, words their messages must hold); this module lists
them as :class:`Entry` rows with the lab and the notebook name they answer, so the tests of one
diagnosis (``test_diagnosis.py``) and of what each mistake costs through the judge
(``test_mistake_costs.py``, against the labs' specs) read the same catalogue.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import test_lab01_checks as t01
import test_lab02_checks as t02
import test_lab03_checks as t03
import test_lab04_checks as t04
import test_lab05_checks as t05
import test_lab06_checks as t06
import test_lab07_checks as t07
import test_lab08_checks as t08
import torch

from transformer_lab.checks.spec import all_specs, load
from transformer_lab.lab import Session


def _function_of() -> dict[str, str]:
    """``"labNN kind"`` of an entry's id -> the part its wrong answer stands for, read from the
    specs: each part's mistake ids (``[parts.X.mistakes]``) start with the kind its entries
    share (lab 02's do not: its entries are told apart by the checks they fail)."""
    out: dict[str, str] = {}
    for spec in all_specs():
        if spec.lab.startswith("02"):
            continue
        for part in spec.parts.values():
            for mistake in part.mistakes:
                key = f"lab{spec.lab[:2]} {mistake.split()[0]}"
                assert out.setdefault(key, part.name) == part.name, f"{key}: two parts"
    return out


FUNCTION_OF = _function_of()
#: Lab 02's parts, in the order of ``test_lab02_checks.ALL_CHECKS`` (the notebook's).
LAB02_FUNCTIONS = tuple(load("02_self_attention").parts)


class Entry(NamedTuple):
    """One catalogued mistake: its id, where it belongs, the wrong answer and what it fails."""

    id: str
    lab: str
    function: str
    checks: Mapping[str, Callable[[Any], Any]]
    answer: Any
    failing: list[str]
    words: str | Mapping[str, str]
    generic: tuple[str, ...]


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _flags(flags: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in flags.items())


Words = str | Mapping[str, str]
Row = tuple[str, Mapping[str, Callable[[Any], Any]], Any, list[str], Words, tuple[str, ...]]


#: Where the train_translator checks write, relative to the working directory of the test.
RUNS = Path("runs")


def _train_checks() -> Mapping[str, Callable[[Any], Any]]:
    """Lab 06's train_translator checks, on a session whose runs go to ``runs/`` under the
    working directory when a check runs: the tests that run them work in their ``tmp_path``
    (a wrong answer's own logger writes under the working directory too)."""
    session = Session("06_decoder_training", torch.device("cpu"), "grading", "32-true", 1, RUNS)
    return t06._train_checks(session)


def _rows() -> list[Row]:
    """``(entry id, checks by name, wrong answer, failing check names, words, checks whose
    message is generic)`` of every catalogued mistake of labs 01-08."""
    out: list[Row] = []
    for table, checks, kind in (
        (t01.ENC_MISTAKES, t01.ENC_CHECKS, "encoding"),
        (t01.SHIFT_MISTAKES, t01.SHIFT_CHECKS, "shift"),
    ):
        for fn, failing, words in table:
            generic = (failing[0],) if fn is t01.shift_sin_cos_swapped else ()
            out.append((f"lab01 {kind} {_name(fn)}", checks, fn, failing, words, generic))
    for table, checks, kind in (
        (t03.SPLIT_MISTAKES, t03.SPLIT, "split_heads"),
        (t03.MERGE_MISTAKES, t03.MERGE, "merge_heads"),
        (t03.ATTENTION_MISTAKES, t03.MHA, "attention"),
        (t03.LOAD_MISTAKES, t03.LOAD, "load"),
    ):
        for fn, failing, words in table:
            out.append((f"lab03 {kind} {_name(fn)}", checks, fn, failing, words, ()))
    for table, checks, kind in (
        (t04.LN_MISTAKES, t04.LN_CHECKS, "layer_norm"),
        (t04.FF_MISTAKES, t04.FF_CHECKS, "feed_forward"),
    ):
        for fn, failing, words in table:
            out.append((f"lab04 {kind} {_name(fn)}", checks, fn, failing, words, ()))
    for mistake, failing, words in t04.BLOCK_MISTAKES:  # "dropout": both forms in one diagnosis
        block = t04.block_with(mistake=mistake)
        out.append(
            (f"lab04 block {mistake}", t04.BLOCK_CHECKS, block, failing, words, ("dropout",))
        )
    for table, checks, kind in (
        (t04.TRAINING_STEP_MISTAKES, t04.TRAIN_CHECKS, "training_step"),
        (t04.OPTIMIZERS_MISTAKES, t04.OPTIM_CHECKS, "configure_optimizers"),
    ):
        for mistake, failing, words in table:
            module = t04.module_with(mistake)
            out.append((f"lab04 {kind} {mistake}", checks, module, failing, words, ()))
    for table, checks, kind in (
        (t05.CAUSAL_MISTAKES, t05.CAUSAL_CHECKS, "causal"),
        (t05.PADDING_MISTAKES, t05.PADDING_CHECKS, "padding"),
    ):
        for fn, words in table:
            out.append((f"lab05 {kind} {_name(fn)}", checks, fn, ["visible", "hidden"], words, ()))
    for table, checks, kind in (
        (t05.COMBINE_MISTAKES, t05.COMBINE_CHECKS, "combine"),
        (t05.ATTENTION_MISTAKES, t05.ATTENTION_CHECKS, "attention"),
        (t05.DETECTOR_MISTAKES, t05.DETECTOR_CHECKS, "detector"),
    ):
        for fn, failing, words in table:
            out.append((f"lab05 {kind} {_name(fn)}", checks, fn, failing, words, ()))
    for cls, failing, words, generic in t06.BLOCK_MISTAKES:
        entry = f"lab06 decoder_block {_name(cls)}"
        out.append((entry, t06.BLOCK_CHECKS, cls, failing, words, tuple(generic)))
    for table, checks, kind in (
        (t06.SHIFT_MISTAKES, t06.SHIFT_CHECKS, "shift_right"),
        (t06.LOSS_MISTAKES, t06.LOSS_CHECKS, "sequence_loss"),
        (t06.MODULE_MISTAKES, t06.MODULE_CHECKS, "translation_module"),
        (t06.DECODE_MISTAKES, t06.DECODE_CHECKS, "greedy_decode"),
    ):
        for fn, failing, words in table:
            out.append((f"lab06 {kind} {_name(fn)}", checks, fn, failing, words, ()))
    train_checks = _train_checks()
    for fn, failing, words in t06.TRAIN_MISTAKES:
        out.append((f"lab06 train_translator {_name(fn)}", train_checks, fn, failing, words, ()))
    for cls, failing, words in t07.CHAR_MISTAKES:
        out.append((f"lab07 char {_name(cls)}", t07.CHAR_CHECKS, cls, failing, words, ()))
    for flags, failing, words in t07.TRAIN_MISTAKES:
        fn = functools.partial(t07.student_bpe_train, **flags)
        out.append((f"lab07 bpe_train {_flags(flags)}", t07.TRAIN_CHECKS, fn, failing, words, ()))
    for flags, failing, words in t07.ENCODE_MISTAKES:
        fn = functools.partial(t07.student_bpe_encode, **flags)
        out.append((f"lab07 bpe_encode {_flags(flags)}", t07.ENCODE_CHECKS, fn, failing, words, ()))
    out.append(
        (
            "lab07 bpe_encode longest",
            t07.ENCODE_CHECKS,
            t07.bpe_encode_longest,
            list(t07.ENCODE_CHECKS),
            "longest",
            (),
        )
    )
    for table, checks, kind in (
        (t07.TEMPERATURE_MISTAKES, t07.TEMPERATURE_CHECKS, "temperature"),
        (t07.TOP_K_MISTAKES, t07.TOP_K_CHECKS, "top_k"),
        (t07.TOP_P_MISTAKES, t07.TOP_P_CHECKS, "top_p"),
    ):
        for fn, failing, words in table:
            out.append((f"lab07 {kind} {_name(fn)}", checks, fn, failing, words, ()))
    for flags, failing, words in t07.BEAM_MISTAKES:
        fn = functools.partial(t07.student_beam, **flags)
        out.append((f"lab07 beam {_flags(flags)}", t07.BEAM_CHECKS, fn, failing, words, ()))
    for fn, failing, words in t02.MISTAKES:
        group = next(g for g in t02.ALL_CHECKS if failing[0] in g)
        checks = {f"check {i}": check for i, check in enumerate(group)}
        names = [f"check {group.index(check)}" for check in failing]
        out.append((f"lab02 {t02._id((fn, failing, words))}", checks, fn, names, words, ()))
    for options, failing, words in t08.ATTENTION_MISTAKES:
        cls = t08.attention_variant("Wrong", **options)
        generic = t08.attention_generic(failing)
        out.append((f"lab08 attention {_flags(options)}", t08.ATTENTION_CHECKS, cls, failing,
                    words, generic))  # fmt: skip
    for options, failing, words, generic in t08.GENERATE_MISTAKES:
        fn = t08.make_generate(**options)
        entry = f"lab08 generate {_flags(options)}"
        out.append((entry, t08.GENERATE_CHECKS, fn, failing, words, generic))
    for kind, failing, words in t08.COUNT_MISTAKES:
        fn = t08.count_mistake(kind)
        out.append((f"lab08 count {kind}", t08.COUNT_CHECKS, fn, failing, words, ()))
    for fn, words in t08.FLOPS_MISTAKES:
        out.append((f"lab08 flops {_name(fn)}", t08.FLOPS_CHECKS, fn, t08.BOTH, words, ()))
    for fn, failing, words in t08.KV_MISTAKES:
        out.append((f"lab08 kv {_name(fn)}", t08.KV_CHECKS, fn, failing, words, ()))
    for fn, words in t08.DAYS_MISTAKES:
        out.append((f"lab08 days {_name(fn)}", t08.DAYS_CHECKS, fn, t08.BOTH, words, ()))
    return out


def _entry(row: Row) -> Entry:
    entry_id, checks, answer, failing, words, generic = row
    number, kind = entry_id.split()[:2]
    if number == "lab02":
        group = next(i for i, g in enumerate(t02.ALL_CHECKS) if checks[failing[0]] in g)
        function = LAB02_FUNCTIONS[group]
    else:
        function = FUNCTION_OF[f"{number} {kind}"]
    lab = LABS[number]
    return Entry(entry_id, lab, function, checks, answer, failing, words, generic)


#: ``labNN`` -> the lab's folder name, for every lab with a spec.
LABS = {f"lab{spec.lab[:2]}": spec.lab for spec in all_specs()}


def _unique(entries: list[Any]) -> list[Any]:
    """The entries, an id met again numbered by its place among its namesakes (``... #2``)."""
    seen: dict[str, int] = {}
    out = []
    for entry in entries:
        seen[entry.id] = seen.get(entry.id, 0) + 1
        n = seen[entry.id]
        out.append(entry._replace(id=f"{entry.id} #{n}") if n > 1 else entry)
    return out


ENTRIES = _unique([_entry(row) for row in _rows()])


# ---------------------------------------------------------------- correct variants

#: ``test_correct_*`` of ``tests/test_labNN_checks.py`` -> the kind of the catalogue's entries
#: (the first word of the part's mistake ids in its spec): :data:`FUNCTION_OF` names the part.
CORRECT_TESTS = {
    1: {"encodings": "encoding", "shift_matrices": "shift"},
    3: {"attention_modules": "attention", "loaders": "load", "merges": "merge_heads",
        "splits": "split_heads"},
    4: {"blocks": "block", "feed_forwards": "feed_forward", "layer_norms": "layer_norm",
        "modules": "training_step"},
    5: {"causal_masks": "causal", "combinations": "combine", "detectors": "detector",
        "masked_attention": "attention", "padding_masks": "padding"},
    6: {"decoder_blocks": "decoder_block", "decoders": "greedy_decode", "losses": "sequence_loss",
        "modules": "translation_module", "shifts": "shift_right",
        "train_translators": "train_translator"},
    7: {"beam_searches": "beam", "bpe_encode": "bpe_encode", "bpe_train": "bpe_train",
        "char_tokenizers": "char", "temperatures": "temperature", "top_k": "top_k",
        "top_p": "top_p"},
    8: {"attentions": "attention", "cache_sizes": "kv", "counts": "count", "flops": "flops",
        "generation_loops": "generate", "gpu_days": "days"},
}  # fmt: skip


class Correct(NamedTuple):
    """One correct variant of a part: it must keep every point of the part's cells."""

    id: str
    lab: str
    function: str
    answer: Any


def _correct() -> list[Correct]:
    """Every correct variant the labs' check tests parametrise (``test_correct_*``)."""
    modules = {1: t01, 2: t02, 3: t03, 4: t04, 5: t05, 6: t06, 7: t07, 8: t08}
    out = []
    for number, module in modules.items():
        lab = LABS[f"lab{number:02d}"]
        for name in sorted(vars(module)):
            found = re.match(r"test_correct_(\w+?)_(?:pass|passes)(?:_every_check)?$", name)
            if not found:
                continue
            for mark in getattr(getattr(module, name), "pytestmark", []):
                if mark.name != "parametrize":
                    continue
                for value in mark.args[1]:
                    answer, checks = value if isinstance(value, tuple) else (value, None)
                    if number == 2:
                        group = t02.ALL_CHECKS.index(checks)
                        function = LAB02_FUNCTIONS[group]
                    else:
                        kind = CORRECT_TESTS[number][found.group(1)]
                        function = FUNCTION_OF[f"lab{number:02d} {kind}"]
                    label = getattr(answer, "__name__", type(answer).__name__)
                    out.append(
                        Correct(f"lab{number:02d} {function} {label}", lab, function, answer)
                    )
    return out


CORRECT = _unique(_correct())

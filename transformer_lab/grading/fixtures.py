"""The visible checks' stored examples, written from the hidden checks' oracles.

A visible check (``transformer_lab/checks/labNN.py``, in the student package) knows the expected
values of its worked examples without an oracle: they are stored in
``transformer_lab/checks/fixtures/labNN.json``. The hidden module of the lab computes them
(``transformer_lab.grading.hidden.labNN.fixtures()``); ``labs build`` writes the file when it
changed and ``labs check`` fails when it is out of date.

"Changed" is decided by value, never by text: another CPU, BLAS, thread count or torch build
computes the oracles' floats with different last bits (``...624419`` here, ``...624415`` on an
AMD EPYC), which says nothing about the examples. So

* floats are written in a canonical rounding (:data:`SIGNIFICANT_DIGITS` significant digits, far
  finer than any check's tolerance and far coarser than float64 rounding noise), and
* a stored file is rewritten, or reported stale, only when its structure, its exact values
  (integers, booleans, strings: token ids, masks, counts, shapes) or a float beyond
  :data:`RTOL`/:data:`ATOL` differ from what the oracles compute now.

A rebuild on any machine therefore leaves the committed files byte-identical.

Every stored key belongs to a graded part of the lab's spec (:func:`unowned_keys`): it begins
with the part's name, its visible check's name, a method of a class part, or the stem that
several parts share (``self_attention`` of ``self_attention_loop`` and ``self_attention_matrix``),
so that renaming or removing a part leaves no example behind unnoticed.
"""

from __future__ import annotations

import importlib
import json
import math
import re
from pathlib import Path
from typing import Any

__all__ = [
    "ATOL",
    "RTOL",
    "SIGNIFICANT_DIGITS",
    "canonical",
    "check_fixtures",
    "first_difference",
    "fixture_text",
    "unowned_keys",
    "write_fixtures",
]

#: Digits kept of every stored float (float32 has about 7; the visible checks compare at ~1e-4).
SIGNIFICANT_DIGITS = 9
#: A stored float still agrees with a freshly computed one within ``ATOL + RTOL * |value|``.
RTOL = 1e-6
ATOL = 1e-9


def canonical(value: Any) -> Any:
    """``value`` (JSON data) with every finite float rounded to :data:`SIGNIFICANT_DIGITS`."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return value
        rounded = float(f"{value:.{SIGNIFICANT_DIGITS}g}")
        return 0.0 if rounded == 0.0 else rounded  # one zero: -0.0 is noise's sign
    if isinstance(value, dict):
        return {key: canonical(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(item) for item in value]
    return value


def _floats_agree(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= ATOL + RTOL * max(abs(a), abs(b))


def first_difference(stored: Any, computed: Any, where: str = "") -> str | None:
    """Where two JSON values differ beyond float rounding, or None when they agree.

    Integers, booleans and strings must be equal, dict keys and their order too (the visible
    checks name the first stored mistake a wrong answer matches); floats agree within
    :data:`RTOL`/:data:`ATOL`. An integer stored where a float is computed (or the reverse)
    counts as a difference: the kind of a value is part of the contract.
    """
    if isinstance(stored, float) and isinstance(computed, float):
        return None if _floats_agree(stored, computed) else f"{where}: {stored!r} != {computed!r}"
    if isinstance(stored, dict) and isinstance(computed, dict):
        if list(stored) != list(computed):
            return f"{where}: keys {list(stored)[:4]}... != {list(computed)[:4]}..."
        for key in stored:
            found = first_difference(stored[key], computed[key], f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(stored, list) and isinstance(computed, list):
        if len(stored) != len(computed):
            return f"{where}: {len(stored)} items != {len(computed)}"
        for i, (a, b) in enumerate(zip(stored, computed, strict=True)):
            found = first_difference(a, b, f"{where}[{i}]")
            if found:
                return found
        return None
    if type(stored) is not type(computed) or stored != computed:
        return f"{where}: {stored!r} != {computed!r}"
    return None


def fixture_text(lab: str) -> str | None:
    """The canonical JSON text the hidden module of ``lab`` (``NN_name``) produces, or None."""
    try:
        hidden = importlib.import_module(f"transformer_lab.grading.hidden.lab{lab[:2]}")
    except ModuleNotFoundError:
        return None
    make = getattr(hidden, "fixtures", None)
    if make is None:
        return None
    # Insertion order kept: a visible check names the first stored mistake a wrong answer matches.
    return json.dumps(canonical(make()), indent=1) + "\n"


def _path(repo: Path, lab: str) -> Path:
    return repo / "transformer_lab" / "checks" / "fixtures" / f"lab{lab[:2]}.json"


def _stale(path: Path, text: str) -> str | None:
    """Why the file at ``path`` disagrees with ``text`` by value, or None when it agrees."""
    if not path.is_file():
        return "it is missing"
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        return f"it is not valid JSON ({exc})"
    return first_difference(stored, json.loads(text))


def write_fixtures(repo: Path, labs: list[str]) -> list[str]:
    """Write the stored examples of ``labs`` that changed by value; return the files written.

    Nothing is written for a repository without its own ``transformer_lab/`` (a course folder
    that only holds notebooks).
    """
    written = []
    if not (repo / "transformer_lab").is_dir():
        return written
    for lab in labs:
        text = fixture_text(lab)
        path = _path(repo, lab)
        if text is not None and _stale(path, text):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(str(path.relative_to(repo)))
    return written


def unowned_keys(lab: str, keys: list[str]) -> list[str]:
    """The stored keys of ``lab`` (``NN_name``) that belong to no graded part of its spec: a
    key's first word (up to a space, ``(`` or ``:``) must be a part's name, its visible check or
    one of its further checks (``check_bpe_train_rules`` of ``check_bpe_train``), a method of a
    class part, or the stem before ``_`` of part names (``beam`` of ``beam_search``)."""
    from transformer_lab.checks import spec

    owners: set[str] = set()
    checks = []
    for part in spec.load(lab).parts.values():
        owners |= {part.name, part.check, *(m.partition("(")[0] for m in part.methods)}
        stem = part.name.split("_")
        owners |= {"_".join(stem[:i]) for i in range(1, len(stem))}
        checks.append(part.check + "_")

    def owned(word: str) -> bool:
        return word in owners or any(word.startswith(check) for check in checks)

    return [key for key in keys if not owned(re.split(r"[ (:]", key, maxsplit=1)[0])]


def check_fixtures(repo: Path, labs: list[str]) -> list[str]:
    """Problems: stored examples that differ by value from what the hidden checks compute, and
    keys that belong to no part of the lab's spec."""
    problems = []
    if not (repo / "transformer_lab").is_dir():
        return problems
    for lab in labs:
        text = fixture_text(lab)
        path = _path(repo, lab)
        why = _stale(path, text) if text is not None else None
        if why:
            problems.append(
                f"{path.name} is out of date with the hidden checks of {lab} ({why}): run "
                "`transformer-lab labs build`"
            )
        stray = unowned_keys(lab, list(json.loads(text))) if text is not None else []
        if stray:
            problems.append(
                f"{path.name}: {len(stray)} stored key(s) belong to no part of "
                f"specs/lab{lab[:2]}.toml, e.g. {stray[0]!r}: begin each with its part's name"
            )
    return problems

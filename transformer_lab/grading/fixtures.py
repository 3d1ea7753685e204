"""The visible checks' stored examples, written from the hidden checks' oracles.

A visible check (``transformer_lab/checks/labNN.py``, in the student package) knows the expected
values of its worked examples without an oracle: they are stored in
``transformer_lab/checks/fixtures/labNN.json``. The hidden module of the lab computes them
(``transformer_lab.grading.hidden.labNN.fixtures()``); ``labs build`` writes the file when it
changed and ``labs check`` fails when it is out of date.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

__all__ = ["check_fixtures", "fixture_text", "write_fixtures"]


def fixture_text(lab: str) -> str | None:
    """The JSON text the hidden module of ``lab`` (``NN_name``) produces, or None if none."""
    try:
        hidden = importlib.import_module(f"transformer_lab.grading.hidden.lab{lab[:2]}")
    except ModuleNotFoundError:
        return None
    make = getattr(hidden, "fixtures", None)
    if make is None:
        return None
    # Insertion order kept: a visible check names the first stored mistake a wrong answer matches.
    return json.dumps(make(), indent=1) + "\n"


def _path(repo: Path, lab: str) -> Path:
    return repo / "transformer_lab" / "checks" / "fixtures" / f"lab{lab[:2]}.json"


def write_fixtures(repo: Path, labs: list[str]) -> list[str]:
    """Write the stored examples of ``labs`` that changed; return the files written.

    Nothing is written for a repository without its own ``transformer_lab/`` (a course folder
    that only holds notebooks).
    """
    written = []
    if not (repo / "transformer_lab").is_dir():
        return written
    for lab in labs:
        text = fixture_text(lab)
        path = _path(repo, lab)
        if text is not None and (not path.is_file() or path.read_text() != text):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(str(path.relative_to(repo)))
    return written


def check_fixtures(repo: Path, labs: list[str]) -> list[str]:
    """Problems: stored examples that differ from what the hidden checks compute."""
    problems = []
    if not (repo / "transformer_lab").is_dir():
        return problems
    for lab in labs:
        text = fixture_text(lab)
        path = _path(repo, lab)
        if text is not None and (not path.is_file() or path.read_text() != text):
            problems.append(
                f"{path.name} is out of date with the hidden checks of {lab}: run "
                "`transformer-lab labs build`"
            )
    return problems

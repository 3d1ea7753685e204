"""Every file the docs name exists: docs/, README.md, benchmarks/*.md and module docstrings.

A path is what a reader would open: a backticked (or double-backticked) span, a Markdown link
target or a ``*.md`` name in plain text that looks like a path in this repository, e.g.
``docs/contracts.md``, ``transformer_lab/training/schedule.py`` or, in ``benchmarks/RESULTS.md``,
``[...](README.md)`` (relative to the file that names it). Spans with placeholders
(``labNN.py``, ``runs/<name>/``, ``*.json``) and paths that only exist once something runs
(``runs/``, ``dist/``, a course directory) are not paths of the repository and are skipped: only
spans under one of the repository's own top-level entries are checked, plus bare ``*.md`` names
(a document) and bare ``*.py`` names in a module's docstring (a sibling module, or a file at the
repository's root). ``EXAMPLES`` lists the few paths named as examples of what a command creates.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from transformer_lab.pysource import parse_python

REPO = Path(__file__).resolve().parents[1]
#: Top-level entries of the repository a path may start with.
ROOTS = (
    ".ci",
    "benchmarks",
    "configs",
    "docs",
    "labs",
    "solutions",
    "tests",
    "transformer_lab",
    "README.md",
    "environment.yml",
    "nbgrader_config.py",
    "pyproject.toml",
    "setup.sh",
)
#: Paths named as examples of what a user or a run creates, not files of the repository.
EXAMPLES = {
    "benchmarks/results",  # written by the benchmark scripts (git-ignored)
    # what `transformer-lab labs new 09_...` creates (docs/labs.md's example of a new lab)
    "transformer_lab/checks/lab09.py",
    "transformer_lab/grading/hidden/lab09.py",
}
#: Bare names of files that a run writes (a benchmark's summary), not documents to open.
WRITTEN = {"summary.md"}
_SPAN = re.compile(r"``([^`\n]+)``|`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_PLACEHOLDER = re.compile(r"[*?<>{}$]|NN|\.\.\.|\bN\b|version_n")
_PATHLIKE = re.compile(r"^\.?[\w./-]+$")
#: A document named in plain text ("see STYLE.md"), backticks or not.
_PLAIN_MD = re.compile(r"(?<![\w/.`-])([A-Za-z][\w/-]*\.md)\b")


def _documents() -> Iterator[tuple[Path, str, bool]]:
    """``(file, text, is_docstring)`` for every document and module docstring checked."""
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        yield path, path.read_text(), False
    for path in sorted((REPO / "benchmarks").glob("*.md")):
        yield path, path.read_text(), False
    for folder in ("transformer_lab", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            docstring = ast.get_docstring(parse_python(path.read_text()))
            if docstring:
                yield path, docstring, True


def _candidates(text: str) -> Iterator[tuple[str, bool]]:
    """``(span, is_link)`` for every backticked span and Markdown link target of ``text``."""
    for match in _SPAN.finditer(text):
        yield (match.group(1) or match.group(2)).strip(), False
    for match in _LINK.finditer(text):
        target = match.group(1).split("#")[0]
        if target and "://" not in target and not target.startswith("mailto:"):
            yield target, True
    for match in _PLAIN_MD.finditer(text):
        yield match.group(1), False


def _resolve(span: str, source: Path, docstring: bool, link: bool = False) -> Path | None:
    """The repository file ``span`` names, or None when it does not name one."""
    span = re.sub(r":\d+(-\d+)?$", "", span.rstrip(".,;)"))  # file.py:120: a line of file.py
    if not span or not _PATHLIKE.match(span) or _PLACEHOLDER.search(span):
        return None
    if link:
        return source.parent / span  # a Markdown link is relative to its document
    if span.startswith("../"):
        return None  # outside the repository: nothing a clone could check
    if "/" not in span:
        if span in WRITTEN or not span.endswith((".md", ".py")):
            return None
        if span.endswith(".py") and (not docstring or span == source.name):
            return None
        here = source.parent / span  # a sibling, else a file at the repository's root
        return here if here.exists() else REPO / span
    if span.split("/")[0] not in ROOTS:
        return None  # runs/, dist/, a course folder...: made by a run, not in the repository
    if any(span == e or span.startswith(e + "/") for e in EXAMPLES):
        return None
    return REPO / span


def _named_paths() -> list[tuple[str, str, Path]]:
    found = []
    for source, text, docstring in _documents():
        for span, link in _candidates(text):
            target = _resolve(span, source, docstring, link)
            if target is not None:
                found.append((str(source.relative_to(REPO)), span, target))
    return found


def test_the_docs_name_some_paths() -> None:
    named = {span for _, span, _ in _named_paths()}
    # The parser finds the paths it is meant to (a test that checks nothing passes too easily).
    assert {"docs/contracts.md", "benchmarks/README.md"} <= named
    assert any(span.startswith("transformer_lab/") and span.endswith(".py") for span in named)


def test_every_path_the_docs_name_exists() -> None:
    missing = sorted(
        f"{source}: {span}" for source, span, target in _named_paths() if not target.exists()
    )
    assert missing == []


@pytest.mark.parametrize(
    ("span", "named"),
    [
        ("docs/lab_standard.md", True),
        ("STYLE.md", True),
        ("transformer_lab/training/modules.py:120", True),
        ("transformer_lab/checks/labNN.py", False),
        ("runs/<name>/version_<n>/", False),
        ("../shared/measurements/", False),
        ("metrics.csv", False),
        ("--trainer.max_steps", False),
    ],
)
def test_what_counts_as_a_path(span: str, named: bool) -> None:
    assert (_resolve(span, REPO / "README.md", docstring=False) is not None) == named

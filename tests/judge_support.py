"""The judge's kernel server in this process: the judge's tests without a notebook's kernel.

:class:`InProcessKernel` is a :class:`~transformer_lab.grading.judge.Link` whose "kernel" is
:mod:`transformer_lab.judge.kernel` serving a plain namespace (the calls back to the grader
answered directly), so a lab's every judged cell can be run on a solution or a release in
seconds. The real kernel, sandbox and ``labs grade`` are tested by the round trips.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import nbformat
import pytest
import torch

from transformer_lab.judge import kernel

REPO = Path(__file__).resolve().parents[1]


class InProcessKernel:
    """The kernel's server on a namespace: what a notebook's kernel does, minus the kernel."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, namespace: dict[str, Any]) -> None:
        self.namespace = namespace
        self.texts: list[str] = []
        self.answer: Any = None
        self.rng = torch.Generator().manual_seed(20261201).get_state()
        for name, empty in (("_objects", {}), ("_handles", {}), ("_calls", {}), ("_synced", {})):
            monkeypatch.setattr(kernel, name, empty)
        monkeypatch.setattr(kernel, "_grader_modules", {})
        monkeypatch.setattr(kernel, "_grader_ids", {})
        monkeypatch.setattr(kernel, "_param_refs", {})
        monkeypatch.setattr(kernel, "_bound", {})
        monkeypatch.setattr(kernel, "_exempted", set())
        monkeypatch.setattr(kernel, "_namespace", lambda: self.namespace)
        monkeypatch.setattr(kernel, "_ask", lambda text: self.answer(text))

    def exchange(self, text: str, timeout: float, answer: Any) -> str:
        self.texts.append(text)
        previous, self.answer = self.answer, answer
        try:
            # A kernel is another process: its own random stream, and never inside the judge's
            # backward pass.
            with torch.random.fork_rng(devices=[]), torch.enable_grad():
                torch.random.set_rng_state(self.rng)
                kernel.serve(text)
                self.rng = torch.random.get_rng_state()
            return kernel.reply()
        finally:
            self.answer = previous


#: Cells that judge the model a demo cell of the notebook trained (lab 04's encoder, lab 06's
#: translator): an answers-only namespace holds no trained model, so they are decided in the
#: round trips through ``labs grade``, which run the whole notebook.
TRAINED_MODEL = frozenset(
    {
        "test_trained_encoder",
        "test_train_translator_trained_visible",
        "test_train_translator_trained_greedy",
    }
)


def grade_one(course: Path, student: str, lab: str, nb: Any, *options: str) -> dict[str, Any]:
    """Grade one submission ``nb`` of ``lab`` with the real ``labs grade`` (in the sandbox
    where the tests require it, else ``--unsandboxed``); its result in the grading report."""
    from conftest import GRADING_SANDBOX

    from transformer_lab.grading.cli import main

    folder = course / "submitted" / student / lab
    folder.mkdir(parents=True)
    nbformat.write(nb, str(folder / f"{lab}.ipynb"))
    sandbox = [] if GRADING_SANDBOX == "required" else ["--unsandboxed"]
    grade = ["grade", "--course", str(course), "--jobs", "1", *options, *sandbox]
    unsandboxed = pytest.warns(RuntimeWarning, match="UNSANDBOXED")
    with unsandboxed if sandbox else contextlib.nullcontext():
        main(["--repo", str(REPO), *grade])
    report = json.loads((course / "grading_report.json").read_text())
    (result,) = report["runs"][-1]["results"]
    return result


def answers_namespace(lab: str, folder: str = "solutions") -> dict[str, Any]:
    """A namespace holding a notebook's setup and answer cells, run (no demo, no training)."""
    nb = nbformat.read(str(REPO / folder / lab / f"{lab}.ipynb"), as_version=4)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and (meta.get("solution") or meta.get("grade_id") == "setup"):
            exec(compile(cell.source, f"<{lab} {meta.get('grade_id')}>", "exec"), namespace)
    return namespace


def zeroing_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None):
    """A cheat: zero the check's inputs, then return what attention on zeros gives."""
    for t in (q, k, v):
        t.zero_()
    allowed = torch.ones(*q.shape[:-1], k.shape[-2], dtype=q.dtype)
    if mask is not None:
        allowed = allowed * mask.to(q.dtype)
    weights = allowed / allowed.sum(-1, keepdim=True).clamp_min(1)
    return weights @ v, weights


def function_parts() -> list[tuple[str, str]]:
    """(lab, part) for every graded part of every spec whose answer is a function (the
    solution defines ``def part(``; classes answer per instance)."""
    from transformer_lab.checks.spec import all_specs

    found = []
    for spec in all_specs():
        nb = nbformat.read(str(REPO / "solutions" / spec.lab / f"{spec.lab}.ipynb"), 4)
        source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        found += [(spec.lab, part) for part in spec.parts if f"def {part}(" in source]
    return found


def with_code_first_in_answer(
    lab: str, part: str, code: str, *, before: str = ""
) -> nbformat.NotebookNode:
    """The solution of ``lab`` with ``code`` (indented for the function's body) run first in
    ``part``'s answer, and ``before`` (module level) ahead of the answer cell's code."""
    nb = nbformat.read(str(REPO / "solutions" / lab / f"{lab}.ipynb"), as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == part)
    head, marker, body = cell.source.partition("    ### BEGIN SOLUTION\n")
    assert marker, f"{lab}'s {part} answer cell lost its solution marker"
    cell.source = before + head + marker + code + body
    return nb


def grade_class(
    course: Path, lab: str, notebooks: dict[str, Any], *, budget: int = 200
) -> dict[str, dict[str, Any]]:
    """Hand in ``notebooks`` (student -> notebook) of ``lab`` and grade them all in one real,
    sandboxed ``labs grade`` run (two jobs, 60 s cells); each student's result in its report."""
    from transformer_lab.grading.cli import main

    for student, nb in notebooks.items():
        folder = course / "submitted" / student / lab
        folder.mkdir(parents=True)
        nbformat.write(nb, str(folder / f"{lab}.ipynb"))
    grade = ["grade", "--course", str(course), "--jobs", "2", "--sandbox", "required"]
    main(["--repo", str(REPO), *grade, "--timeout", "60", "--budget", str(budget)])
    report = json.loads((course / "grading_report.json").read_text())
    return {r["student"]: r for r in report["runs"][-1]["results"]}


#: The replay modules' shared classes: lab -> student -> notebook, handed in at import.
_HANDED_IN: dict[str, dict[str, nbformat.NotebookNode]] = {}
#: lab -> the modules (file names) that handed in to its shared class.
HANDED_IN_BY: dict[str, set[str]] = {}
_GRADED: dict[str, tuple[Path, dict[str, dict[str, Any]]]] = {}


def hand_in(module: str, lab: str, notebooks: dict[str, nbformat.NotebookNode]) -> None:
    """Add ``notebooks`` (student -> notebook) of test module ``module`` (its ``__file__``) to
    ``lab``'s shared class, graded by :func:`shared_class`.

    Each ``labs grade`` run pays a fixed cost (nbgrader's assignment, the lab's gradebooks, the
    student-package view) and the replay modules all need an honest and an untouched control:
    one run for all of them pays both once. A student handed in twice must be the same notebook
    (the controls); modules hand in when imported, before any test runs.
    """
    if lab in _GRADED:
        raise RuntimeError(f"{Path(module).name} hands in to {lab}'s class after it was graded")
    handed = _HANDED_IN.setdefault(lab, {})
    for student, nb in notebooks.items():
        if student in handed and handed[student] != nb:
            raise ValueError(f"{Path(module).name} hands in another notebook as {student!r}")
        handed[student] = nb
    HANDED_IN_BY.setdefault(lab, set()).add(Path(module).name)


def shared_class(
    lab: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, dict[str, Any]]]:
    """``lab``'s shared class (everything :func:`hand_in` received), graded once per process by
    :func:`grade_class` (sandboxed, two jobs, 60 s cells, 200 s a submission): its course
    folder and each student's result. ``tests/conftest.py`` runs the modules that hand in on
    one xdist worker, so the class is graded once per test run."""
    if lab not in _GRADED:
        course = tmp_path_factory.mktemp(f"shared_{lab[:2]}") / "course"
        _GRADED[lab] = course, grade_class(course, lab, _HANDED_IN[lab], budget=200)
    return _GRADED[lab]

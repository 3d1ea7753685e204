"""End to end through real nbgrader: one course folder, several kinds of lab-01 submission.

One module-scoped course is graded once (each notebook starts a kernel, so the scenarios
share it): the solution, the untouched release, a Colab-mangled copy of the solution, a
submission that only calls the package, one with an infinite loop, one that edits and deletes
test cells, one whose test cells were all deleted, a newer Colab copy beside an older one,
another lab's notebook and a broken file.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import json
import os
import shutil
from pathlib import Path

import nbformat
import pytest
from conftest import GRADING_SANDBOX
from filelock import FileLock
from nbgrader.api import Gradebook

from transformer_lab.grading.grade import (
    GradeReport,
    GradingOptions,
    SubmissionResult,
    grade_course,
)

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"
STUB = "# YOUR CODE HERE\n    raise NotImplementedError()"
#: Seconds per cell, as tests/test_grading_bounds_attacks.py's: lab 01's cells take a few seconds
#: even on a loaded machine (its training demo trains 20 steps when graded); ``loop`` waits
#: this long once.
TIMEOUT = 15

pytestmark = [pytest.mark.slow]


def _release() -> nbformat.NotebookNode:
    return nbformat.read(str(REPO / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)


def _cell(nb, grade_id: str):
    for cell in nb.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            return cell
    raise KeyError(grade_id)


def _answer(nb, grade_id: str, body: str) -> None:
    cell = _cell(nb, grade_id)
    assert STUB in cell.source
    cell.source = cell.source.replace(STUB, body)


ENC_OK = """two_i = torch.arange(0, d_model, 2, dtype=torch.float32)
    angles = torch.arange(seq_len, dtype=torch.float32)[:, None] / base ** (two_i / d_model)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)"""
ENC_SWAPPED = ENC_OK.replace("[angles.sin(), angles.cos()]", "[angles.cos(), angles.sin()]")
SHIFT_TRANSPOSED = """m = torch.zeros(d_model, d_model)
    for k in range(0, d_model, 2):
        b = offset / base ** (k / d_model)
        m[k, k], m[k, k + 1] = math.cos(b), math.sin(b)
        m[k + 1, k], m[k + 1, k + 1] = -math.sin(b), math.cos(b)
    return m"""


def _write(course: Path, student: str, nb, name: str = f"{LAB}.ipynb") -> None:
    folder = course / "submitted" / student / LAB
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(folder / name))


def _mangled_solution() -> nbformat.NotebookNode:
    nb = nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    answer = _cell(nb, "relative_shift_matrix")
    nb.nbformat_minor = 4
    for i, cell in enumerate(nb.cells):
        cell.pop("id", None)
        if cell is answer:
            pass
        elif i % 2:
            cell.metadata.pop("nbgrader", None)  # half the metadata lost...
        elif "nbgrader" in cell.metadata:
            cell.metadata.nbgrader["colab_note"] = "x"  # ...the rest extended
        cell.metadata["id"] = f"c{i}"
        cell.metadata["colab"] = {"base_uri": "https://localhost:8080/"}
    nb.metadata["colab"] = {"provenance": []}
    # The answer cell duplicated in place (a copy keeps its metadata, grade_id included).
    nb.cells.insert(nb.cells.index(answer) + 1, copy.deepcopy(answer))
    return nb


def _options() -> GradingOptions:
    return GradingOptions(sandbox=GRADING_SANDBOX)


def _hashes(course: Path) -> dict[str, str]:
    return {
        str(p.relative_to(course)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((course / "submitted").rglob("*.ipynb"))
    }


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> tuple[GradeReport, dict[str, str]]:
    """The graded course, built once even when pytest-xdist spreads the tests over workers."""
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker has base = <run dir>/popen-gwN: share the run dir, not more.
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    course = shared / "lab01_course"
    done = shared / "lab01_course.json"
    with FileLock(str(shared / "lab01_course.lock")):
        if not done.exists():
            hashes = _build_and_grade(course)
            done.write_text(json.dumps(hashes))
    hashes = json.loads(done.read_text())
    runs = json.loads((course / "grading_report.json").read_text())["runs"]
    results = [SubmissionResult(**r) for r in runs[-1]["results"]]
    report = GradeReport(course, results, course / "grades.csv", course / "feedback")
    return report, hashes


def _build_and_grade(course: Path) -> dict[str, str]:
    """Write the submissions, grade them; return the submitted files' hashes before grading."""
    _write(course, "solution", nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), 4))
    _write(course, "release", _release())
    _write(course, "mangled", _mangled_solution(), name=f"{LAB} (1).ipynb")

    nb = _release()
    kit = "from transformer_lab import positional\n    "
    _answer(
        nb, "sinusoidal_encoding", kit + "return positional.sinusoidal_encoding(seq_len, d_model)"
    )
    _answer(
        nb,
        "relative_shift_matrix",
        kit + "return positional.relative_shift_matrix(offset, d_model)",
    )
    _write(course, "shortcut", nb)

    nb = _release()
    _answer(nb, "sinusoidal_encoding", ENC_OK)
    _cell(nb, "sinusoidal_encoding").source += "\n\nwhile True:  # left-over debugging\n    pass"
    _answer(nb, "relative_shift_matrix", SHIFT_TRANSPOSED)
    _write(course, "loop", nb)

    nb = _release()
    _answer(nb, "sinusoidal_encoding", ENC_SWAPPED)
    _cell(nb, "test_sinusoidal_encoding_shape").source = "print('all good')"
    nb.cells.remove(_cell(nb, "test_sinusoidal_encoding_values"))
    _write(course, "cheater", nb)

    nb = nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), 4)
    tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    nb.cells = [c for c in nb.cells if c not in tests or c.cell_type == "markdown"]
    _write(course, "notests", nb)

    _write(course, "twocopies", _release())
    old = course / "submitted" / "twocopies" / LAB / f"{LAB}.ipynb"
    os.utime(old, (old.stat().st_atime - 3600, old.stat().st_mtime - 3600))
    newer = nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), 4)
    _write(course, "twocopies", newer, name=f"{LAB} (1).ipynb")

    other = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('lab 2?')")])
    _write(course, "wronglab", other)
    broken = course / "submitted" / "broken" / LAB
    broken.mkdir(parents=True)
    (broken / f"{LAB}.ipynb").write_text('{"cells": [')

    hashes = _hashes(course)
    grade_course(course, REPO, [LAB], timeout=TIMEOUT, options=_options())
    return hashes


def _grade(report: GradeReport, student: str, grade_id: str) -> float:
    with Gradebook(f"sqlite:///{report.course / 'gradebook.db'}") as gb:
        return float(gb.find_grade(grade_id, LAB, LAB, student).score)


def test_solution_full_marks_and_release_zero(graded) -> None:
    report, _ = graded
    sol, rel = report.find("solution", LAB), report.find("release", LAB)
    assert (sol.status, sol.auto_score, sol.auto_max) == ("graded", 12.0, 12.0)
    assert sol.needs_manual == 3  # the written answers wait for a human
    assert (rel.status, rel.auto_score, rel.max_score) == ("graded", 0.0, 18.0)
    assert sol.flags == [] and rel.flags == []


def test_mangled_colab_copy_grades_like_the_intact_one(graded) -> None:
    report, _ = graded
    mangled, sol = report.find("mangled", LAB), report.find("solution", LAB)
    assert mangled.status == "graded"
    assert (mangled.auto_score, mangled.max_score) == (sol.auto_score, sol.max_score)
    with Gradebook(f"sqlite:///{report.course / 'gradebook.db'}") as gb:
        per_cell = {
            student: {
                g.name: (g.score, g.max_score, g.needs_manual_grade)
                for g in gb.find_submission_notebook(LAB, LAB, student).grades
            }
            for student in ("solution", "mangled")
        }
    assert per_cell["mangled"] == per_cell["solution"] and len(per_cell["solution"]) == 11
    text = "\n".join(mangled.repairs)
    assert f"graded {LAB} (1).ipynb as {LAB}.ipynb" in text
    assert "restored the lost metadata" in text and "appeared in 2 cells" in text


def test_calling_the_package_earns_nothing(graded) -> None:
    report, _ = graded
    assert report.find("shortcut", LAB).auto_score == 0.0
    html = (report.feedback_dir / "shortcut" / LAB / f"{LAB}.html").read_text()
    assert "does not allow" in html


def test_infinite_loop_is_cut_and_the_rest_graded(graded) -> None:
    report, _ = graded
    loop = report.find("loop", LAB)
    # sinusoidal_encoding was defined before the loop: 6 points; the transposed matrix keeps
    # only the shape point (M(0) is the identity either way).
    assert (loop.status, loop.auto_score) == ("incomplete", 7.0)
    assert any("sinusoidal_encoding" in p and "CellTimeoutError" in p for p in loop.problems)
    assert _grade(report, "loop", "test_relative_shift_matrix_shape") == 1.0
    assert _grade(report, "loop", "test_relative_shift_matrix_values") == 0.0
    nb = nbformat.read(str(report.course / "autograded" / "loop" / LAB / f"{LAB}.ipynb"), 4)
    errors = [o for o in _cell(nb, "sinusoidal_encoding").outputs if o.output_type == "error"]
    assert errors, "the looping cell should carry the timeout error"
    html = (report.feedback_dir / "loop" / LAB / f"{LAB}.html").read_text()
    assert "the wrong way" in html  # the transposed matrix is named in the feedback


def test_edited_and_deleted_tests_are_restored(graded) -> None:
    report, _ = graded
    cheater = report.find("cheater", LAB)
    assert (cheater.status, cheater.auto_score) == ("graded", 0.0)
    assert _grade(report, "cheater", "test_sinusoidal_encoding_values") == 0.0
    text = "\n".join(cheater.repairs)
    assert "'test_sinusoidal_encoding_values' is missing; nbgrader puts it back" in text
    html = (report.feedback_dir / "cheater" / LAB / f"{LAB}.html").read_text()
    assert "sin and cos are swapped" in html


def test_unmatched_submissions_are_reported_not_zeroed(graded) -> None:
    report, _ = graded
    for student, words in (("wronglab", "right lab"), ("broken", "not a readable notebook")):
        result = report.find(student, LAB)
        assert result.status == "unmatched" and words in result.error
    assert not report.ok
    with Gradebook(f"sqlite:///{report.course / 'gradebook.db'}") as gb:
        assert {s.id for s in gb.students} == {
            "solution",
            "release",
            "mangled",
            "shortcut",
            "loop",
            "cheater",
            "notests",
            "twocopies",
        }


def test_csv_and_feedback_hold_the_gradebook_scores(graded) -> None:
    report, _ = graded
    rows = {r["student_id"]: r for r in csv.DictReader(report.csv_path.open())}
    for result in report.results:
        if result.status in ("unmatched", "failed"):
            assert result.student not in rows
            continue
        assert float(rows[result.student]["score"]) == result.score
        assert float(rows[result.student]["max_score"]) == 18.0
        assert rows[result.student]["status"] == result.status
        html = report.feedback_dir / result.student / LAB / f"{LAB}.html"
        assert f"Autograded points: {result.auto_score:g} / 12" in html.read_text()


def test_a_submission_without_test_cells_is_recognised_and_graded(graded) -> None:
    report, _ = graded
    result = report.find("notests", LAB)
    assert (result.status, result.auto_score) == ("graded", 12.0)
    assert "is missing; nbgrader puts it back" in "\n".join(result.repairs)


def test_the_newest_colab_copy_is_graded_and_the_other_reported(graded) -> None:
    report, _ = graded
    result = report.find("twocopies", LAB)
    assert (result.status, result.auto_score) == ("graded", 12.0)
    assert result.ignored == [f"{LAB}.ipynb"]


def test_originals_untouched_and_regrading_is_safe(graded, tmp_path) -> None:
    report, hashes = graded
    assert _hashes(report.course) == hashes
    # Grade a late submission into a copy of the course (other tests read the original).
    course = tmp_path / "course"
    shutil.copytree(report.course, course)
    db = course / "gradebook.db"
    inode = db.stat().st_ino
    shutil.copytree(course / "submitted" / "release", course / "submitted" / "late")
    again = grade_course(
        course, REPO, ["01"], students=["late"], timeout=TIMEOUT, options=_options()
    )
    assert again.find("late", LAB).auto_score == 0.0
    assert db.stat().st_ino == inode
    with Gradebook(f"sqlite:///{db}") as gb:
        assert gb.find_submission(LAB, "solution").score == 12.0
        assert gb.find_submission(LAB, "loop").score == 7.0

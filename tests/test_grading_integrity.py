"""Hostile submissions, graded by the real ``transformer-lab labs grade`` (grading integrity).

A hostile student of lab 01 tried each of these on the old grader and got full marks (or wrote
another student's grades): replacing the checks, swapping the checks module in ``sys.modules``,
calling the oracle, reading the solution notebook, rewriting the gradebook with sqlite3, writing
into another student's folder, killing the kernel, replacing builtins. Here each one, plus
hiding exceptions from the grader and patching ``torch.allclose``, is graded in the sandbox: every
cheat earns 0 points and a flag, the victim (an untouched release graded earlier) keeps 0 and
its files, the honest solution keeps full marks, and every run's records stay in the report.
The same cheats graded without the sandbox still earn 0 and a flag, and the run says so.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import shutil
from pathlib import Path

import nbformat
import pytest
from conftest import GRADING_SANDBOX, needs_bwrap

from transformer_lab.grading.cli import main

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"
pytestmark = [pytest.mark.slow]


def _cheats(course: Path) -> dict[str, tuple[str, str]]:
    """name -> (where the cheat goes: "top" or "answer", its code)."""
    solution = REPO / "solutions" / LAB / f"{LAB}.ipynb"
    victim_dir = course / "submitted" / "victim" / LAB
    return {
        "patch_checks": (
            "top",
            "import transformer_lab.checks.lab01 as module\n"
            "for name in dir(module):\n"
            "    if not name.startswith('_') and callable(getattr(module, name)):\n"
            "        setattr(module, name, lambda *a, **k: None)",
        ),
        "fake_module": (
            "top",
            "import sys, types\n"
            "fake = types.SimpleNamespace(**{n: (lambda *a, **k: None) for n in dir(lab01)})\n"
            "sys.modules['transformer_lab.checks.lab01'] = fake\n"
            "lab01 = fake",
        ),
        "oracle": (
            "answer",
            "def sinusoidal_encoding(seq_len, d_model, base=10000.0):\n"
            "    return lab01.oracle_sinusoidal_encoding(seq_len, d_model, base)",
        ),
        "read_solution": (
            "answer",
            "import json\n"
            f"cells = json.load(open({str(solution)!r}))['cells']\n"
            "for cell in cells:\n"
            "    if cell.get('metadata', {}).get('nbgrader', {}).get('solution'):\n"
            "        exec(''.join(cell['source']))",
        ),
        "write_gradebook": (
            "top",
            "import sqlite3\n"
            f"db = sqlite3.connect({str(course / 'gradebook.db')!r})\n"
            "db.execute('update grade set auto_score = 99')\n"
            "db.commit()",
        ),
        "write_files": (
            "top",
            f"open({str(victim_dir / 'planted.txt')!r}, 'w').write('x')\n"
            f"open({str(course / 'planted.txt')!r}, 'w').write('x')",
        ),
        "kill_kernel": ("top", "import os\nos._exit(0)"),
        "builtins": ("top", "import builtins\nbuiltins.isinstance = lambda *a, **k: True"),
        "hide_errors": (
            "top",
            "get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)",
        ),
        "patch_torch": ("top", "torch.allclose = lambda *a, **k: True"),
    }


def _submit(course: Path, student: str, nb: nbformat.NotebookNode) -> None:
    folder = course / "submitted" / student / LAB
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(folder / f"{LAB}.ipynb"))


def _cheater(where: str, code: str) -> nbformat.NotebookNode:
    """The untouched release with the cheat in a cell of its own."""
    nb = nbformat.read(str(REPO / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
    answer = next(
        i
        for i, c in enumerate(nb.cells)
        if c.metadata.get("nbgrader", {}).get("grade_id") == "sinusoidal_encoding"
    )
    nb.cells.insert(answer + 1 if where == "answer" else 2, nbformat.v4.new_code_cell(code))
    return nb


def _tree_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _csv(course: Path) -> dict[str, dict[str, str]]:
    with open(course / "grades.csv", newline="") as handle:
        return {row["student_id"]: row for row in csv.DictReader(handle)}


#: Seconds per cell: lab 01's slowest cell (its training demo) takes a few seconds even on a
#: loaded machine; ``builtins`` (its kernel stops answering) waits this long once.
TIMEOUT = 20


def _grade(course: Path, *extra: str) -> int:
    args = ["--repo", str(REPO), "grade", "--course", str(course), "--jobs", "2"]
    return main([*args, "--timeout", str(TIMEOUT), "--budget", "150", *extra])


@pytest.fixture(scope="module")
def course(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A course where an honest student and a victim were graded first."""
    root = tmp_path_factory.mktemp("hostile")
    _submit(root, "honest", nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), 4))
    _submit(root, "victim", nbformat.read(str(REPO / "labs" / LAB / f"{LAB}.ipynb"), 4))
    # What the cheats are measured against: graded in the sandbox where it works.
    sandbox = ["--sandbox", GRADING_SANDBOX]
    with pytest.warns(RuntimeWarning) if GRADING_SANDBOX == "off" else contextlib.nullcontext():
        assert _grade(root, "--student", "honest", "--student", "victim", *sandbox) == 0
    rows = _csv(root)
    assert rows["honest"]["score"] == "12.0" and rows["victim"]["score"] == "0.0"
    return root


def _grade_cheats(course: Path, names: list[str], *extra: str) -> dict[str, dict]:
    for name in names:
        where, code = _cheats(course)[name]
        _submit(course, name, _cheater(where, code))
    victim_before = _tree_digest(course / "submitted" / "victim")
    args = [a for n in names for a in ("--student", n)]
    assert _grade(course, *args, *extra) == 1  # flagged submissions are not "cleanly graded"
    assert _tree_digest(course / "submitted" / "victim") == victim_before
    assert not (course / "planted.txt").exists()
    report = json.loads((course / "grading_report.json").read_text())
    return {r["student"]: r for r in report["runs"][-1]["results"]}


@needs_bwrap
def test_every_cheat_earns_zero_and_a_flag_in_the_sandbox(course: Path) -> None:
    names = list(_cheats(course))
    results = _grade_cheats(course, names, "--sandbox", "required")
    rows = _csv(course)
    for name in names:
        result = results[name]
        assert result["sandbox"] == "bubblewrap"
        assert result["status"] == "flagged", (name, result)
        assert result["flags"], name
        assert result["auto_score"] == 0, (name, result)
        assert rows[name]["status"] == "flagged" and float(rows[name]["score"]) == 0, name
    # The victim and the honest student keep what they had; earlier runs stay in the report.
    assert rows["victim"]["score"] == "0.0" and rows["victim"]["status"] == "graded"
    assert rows["honest"]["score"] == "12.0" and rows["honest"]["status"] == "graded"
    report = json.loads((course / "grading_report.json").read_text())
    assert len(report["runs"]) >= 2
    assert {r["student"] for r in report["runs"][0]["results"]} == {"honest", "victim"}
    # Feedback shows no hidden test code.
    feedback = (course / "feedback" / "honest" / LAB / f"{LAB}.html").read_text()
    assert "hidden_check_" not in feedback and "BEGIN HIDDEN TESTS" not in feedback
    assert "a hidden check: its code is not shown" in feedback


def test_without_the_sandbox_cheats_still_earn_nothing_and_the_run_says_so(
    course: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = ["read_solution", "write_gradebook", "write_files", "patch_checks", "kill_kernel"]
    renamed = {}
    for name in names:
        where, code = _cheats(course)[name]
        _submit(course, f"{name}_nosandbox", _cheater(where, code))
        renamed[name] = f"{name}_nosandbox"
    victim_before = _tree_digest(course / "submitted" / "victim")
    args = [a for n in renamed.values() for a in ("--student", n)]
    with pytest.warns(RuntimeWarning, match="UNSANDBOXED"):
        assert _grade(course, *args, "--sandbox", "off") == 1
    assert "UNSANDBOXED" in capsys.readouterr().out
    assert _tree_digest(course / "submitted" / "victim") == victim_before
    assert not (course / "planted.txt").exists()
    rows = _csv(course)
    report = json.loads((course / "grading_report.json").read_text())
    results = {r["student"]: r for r in report["runs"][-1]["results"]}
    for student in renamed.values():
        assert results[student]["sandbox"] == "none"
        assert results[student]["status"] == "flagged", results[student]
        assert float(rows[student]["score"]) == 0
    assert rows["victim"]["score"] == "0.0"


@needs_bwrap
def test_a_dead_kernel_is_reported_not_a_plain_zero(tmp_path: Path) -> None:
    course = tmp_path / "course"
    nb = nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), 4)
    # An honest-looking submission whose code crashes the interpreter (no cheat construct).
    nb.cells.insert(2, nbformat.v4.new_code_cell("import faulthandler\nfaulthandler._sigsegv()"))
    _submit(course, "crasher", nb)
    assert _grade(course) == 1
    row = _csv(course)["crasher"]
    assert row["status"] == "crashed" and float(row["score"]) == 0
    shutil.rmtree(course)


@needs_bwrap
def test_the_grader_started_by_a_roundabout_path_still_grades(tmp_path: Path) -> None:
    """``../.venv/bin/python`` run from another folder: the sandbox must find the interpreter.

    ``sys.executable`` keeps the ``..``; the folder it passes through is not in the sandbox, so
    every kernel failed to start and every submission was reported ``failed`` (found by the
    grading benchmark, run from ``benchmarks/``).
    """
    import subprocess
    import sys

    course = tmp_path / "course"
    _submit(course, "honest", nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), 4))
    detour = tmp_path / "detour"  # on the host, not in the sandbox's private /tmp
    detour.mkdir()
    # A relative path: Python keeps it, joined to the working folder, as sys.executable.
    up = "/".join([".."] * (len(detour.parts) - 1))
    python = f"{up}{Path(sys.executable).absolute()}"
    assert (detour / python).exists()
    args = ["labs", "--repo", str(REPO), "grade", "--course", str(course), "--jobs", "1"]
    done = subprocess.run(
        [python, "-m", "transformer_lab.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=detour,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    row = _csv(course)["honest"]
    assert row["status"] == "graded" and float(row["raw_score"]) == 12.0

"""``transformer-lab labs build|check``: deterministic builds, sync and leak detection, verdicts.

Builds run nbgrader's GenerateAssignment without a kernel (a few seconds); the round-trip
verdicts of ``check`` are tested here on hand-made grade reports, and for real in
tests/test_grading_pipeline.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from transformer_lab.cli import main as cli_main
from transformer_lab.grading import check as check_module
from transformer_lab.grading.cli import main
from transformer_lab.grading.course import GradingError, select_labs
from transformer_lab.grading.grade import GradeReport, SubmissionResult

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of the repository's lab 01 (config, source, release) to edit freely."""
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    shutil.copytree(REPO / "solutions" / LAB, root / "solutions" / LAB)
    shutil.copytree(REPO / "labs" / LAB, root / "labs" / LAB)
    return root


def test_committed_release_is_what_the_build_generates(repo: Path, capsys) -> None:
    before = (repo / "labs" / LAB / f"{LAB}.ipynb").read_bytes()
    assert main(["--repo", str(repo), "build", "01"]) == 0
    assert "labs/ is up to date" in capsys.readouterr().out
    assert (repo / "labs" / LAB / f"{LAB}.ipynb").read_bytes() == before
    assert cli_main(["labs", "--repo", str(repo), "check", "01", "--no-grade"]) == 0


def test_hand_edited_or_stray_release_files_fail_check(repo: Path, capsys) -> None:
    path = repo / "labs" / LAB / f"{LAB}.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nb.cells[3].source += "\n# a quick fix made in labs/ by hand"
    nbformat.write(nb, str(path))
    (repo / "labs" / LAB / "notes.txt").write_text("stray")
    assert main(["--repo", str(repo), "check", LAB, "--no-grade"]) == 1
    out = capsys.readouterr().out
    assert "differs from what solutions/ generates (first differing cell: 4)" in out
    assert "notes.txt is not generated" in out
    # Rebuilding repairs both, and a second build is a no-op.
    assert main(["--repo", str(repo), "build"]) == 0
    assert "2 file(s) updated" in capsys.readouterr().out
    assert main(["--repo", str(repo), "build"]) == 0
    assert "up to date" in capsys.readouterr().out
    assert main(["--repo", str(repo), "check", "--no-grade"]) == 0


def test_leaked_solution_and_hidden_tests_are_found(repo: Path) -> None:
    path = repo / "labs" / LAB / f"{LAB}.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    src = nbformat.read(str(repo / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    answer = next(
        c
        for c in src.cells
        if c.metadata.get("nbgrader", {}).get("grade_id") == "sinusoidal_encoding"
    )
    solution_line = next(line for line in answer.source.splitlines() if "angles =" in line)
    nb.cells[5].source += "\n" + solution_line
    nb.cells[6].source += "\nlab01.hidden_check_sinusoidal_encoding(sinusoidal_encoding, seed=1)"
    nbformat.write(nb, str(path))
    problems = check_module.check_leaks(repo, [LAB])
    assert any("leaks solution code" in p and "angles =" in p for p in problems)
    assert any("'hidden_check_'" in p for p in problems)


def test_lab_selection_by_prefix(repo: Path) -> None:
    assert select_labs(repo, ["01"]) == [LAB]
    assert select_labs(repo, None) == [LAB]
    with pytest.raises(GradingError, match="matches nothing"):
        select_labs(repo, ["07"])
    assert main(["--repo", str(repo), "build", "07"]) == 2


def _report(course: Path, solution: tuple, release: tuple) -> GradeReport:
    results = [
        SubmissionResult("solution", LAB, solution[0], auto_score=solution[1], auto_max=12.0),
        SubmissionResult("release", LAB, release[0], auto_score=release[1], auto_max=12.0),
    ]
    return GradeReport(course, results, course / "grades.csv", course / "feedback")


@pytest.mark.parametrize(
    ("solution", "release", "words"),
    [
        (("graded", 12.0), ("graded", 0.0), None),
        (("graded", 10.0), ("graded", 0.0), "the solution earns 10 of 12"),
        (("graded", 12.0), ("graded", 1.0), "the untouched release earns 1 points"),
        (("failed", None), ("graded", 0.0), "the solution was failed, not graded"),
        (("graded", 12.0), ("failed", None), "the untouched release was failed"),
    ],
)
def test_check_verdicts(repo: Path, monkeypatch, solution, release, words) -> None:
    def fake_grade_course(course, repo_, labs, timeout=None, options=None):
        return _report(Path(course), solution, release)

    monkeypatch.setattr(check_module, "grade_course", fake_grade_course)
    problems = check_module.check_labs(repo, ["01"])
    if words is None:
        assert problems == []
    else:
        assert len(problems) == 1 and words in problems[0]


def test_opening_a_release_in_an_editor_does_not_break_check(repo: Path) -> None:
    """JupyterLab rewrites kernel and language metadata, a run adds outputs, Validate saves,
    and autosaves land in .ipynb_checkpoints/: none of it is a change to the lab."""
    path = repo / "labs" / LAB / f"{LAB}.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)"}
    nb.metadata["language_info"] = {"name": "python", "version": "3.12.1", "mimetype": "x"}
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hello\n")]
    code.execution_count = 3
    code.metadata["execution"] = {"iopub.status.idle": "2026-12-01T10:00:00Z"}
    nbformat.write(nb, str(path))
    autosave = repo / "labs" / LAB / ".ipynb_checkpoints"
    autosave.mkdir()
    (autosave / f"{LAB}-checkpoint.ipynb").write_text(path.read_text())
    assert main(["--repo", str(repo), "check", LAB, "--no-grade"]) == 0
    # A real change still fails, and a build leaves the editor's autosaves alone.
    nb.cells[0].source += "\nedited by hand"
    nbformat.write(nb, str(path))
    assert main(["--repo", str(repo), "check", LAB, "--no-grade"]) == 1
    assert main(["--repo", str(repo), "build", LAB, "--no-student"]) == 0
    assert (autosave / f"{LAB}-checkpoint.ipynb").is_file()


def test_a_failed_autograde_says_its_cause_first() -> None:
    """nbgrader's last lines only say "see the above traceback": the cause must come first."""
    from transformer_lab.grading.grade import _failure_summary

    log = "\n".join(
        [
            "[ERROR] Error occurred while starting new kernel client for kernel 8df9: "
            "Kernel died before replying to kernel_info",
            "[ERROR] There was an error processing assignment: /x/submitted/s0/01",
            "[ERROR] Traceback (most recent call last):",
            *[f'      File "f{i}.py", line {i}, in g' for i in range(30)],
            "    RuntimeError: Kernel died before replying to kernel_info",
            "[WARNING] Removing failed assignment: /x/autograded/s0/01",
            "[ERROR] Please see the the above traceback for details on the specific errors",
            "Traceback (most recent call last):",
            '  File "nbgrader/utils.py", line 542, in capture_log',
            "nbgrader.converters.base.NbGraderException: Please see the above traceback",
        ]
    )
    summary = _failure_summary({"log": log})
    first = summary.splitlines()[0]
    assert "Kernel died before replying to kernel_info" in first
    assert "RuntimeError: Kernel died" in summary
    assert len(summary.splitlines()) <= 9


def test_grading_without_bubblewrap_refuses_unless_asked(repo: Path, monkeypatch, capsys) -> None:
    """No working bwrap: ``grade`` and ``check`` refuse in one line that says how to install it;
    ``--unsandboxed`` opts out, loudly (the run itself: tests/test_grading_integrity.py)."""
    from transformer_lab.grading import grade as grade_module

    monkeypatch.setattr(grade_module, "find_bwrap", lambda: None)
    course = repo / "course"
    (course / "submitted" / "alice" / LAB).mkdir(parents=True)
    assert main(["--repo", str(repo), "grade", "--course", str(course)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert "apt-get install bubblewrap" in error and "--unsandboxed" in error
    assert main(["--repo", str(repo), "check", LAB]) == 2
    assert "apt-get install bubblewrap" in capsys.readouterr().err
    seen = []

    def fake_grade_course(course, repo_, labs, timeout=None, options=None):
        seen.append(options.sandbox)
        return _report(Path(course), ("graded", 12.0), ("graded", 0.0))

    monkeypatch.setattr(check_module, "grade_course", fake_grade_course)
    assert main(["--repo", str(repo), "check", LAB, "--unsandboxed"]) == 0
    assert seen == ["off"]
    assert "WITHOUT the OS sandbox" in capsys.readouterr().err
    with pytest.raises(GradingError, match="--unsandboxed"):
        grade_module.GradingOptions(sandbox="auto")

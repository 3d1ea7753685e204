"""``transformer-lab labs grade --course DIR``: autograde a course folder into its gradebook.

Layout of ``DIR`` (nbgrader's own)::

    DIR/submitted/<student>/<lab>/<lab>.ipynb   what the students handed in (never modified)
    DIR/gradebook.db                            nbgrader's SQLite gradebook (created once, kept)
    DIR/release/<lab>/                          the release, regenerated from solutions/
    DIR/repaired/<student>/<lab>/               working copies, metadata repaired (see below)
    DIR/autograded/<student>/<lab>/             executed notebooks
    DIR/feedback/<student>/<lab>/<lab>.html     per-student feedback
    DIR/grades.csv                              nbgrader's CSV export of the gradebook
    DIR/grading_report.json                     per submission: status, scores, repairs

Steps, all through nbgrader's converters:

1. ``GenerateAssignment`` from the repository's ``solutions/`` records every lab's cells
   (with hidden tests) in the gradebook; re-running it updates the gradebook in place.
2. Every submission is copied to ``repaired/`` and its cell metadata is rebuilt from the
   release (:mod:`transformer_lab.grading.repair`): the student's file stays as submitted
   (documented choice: repair in a working copy, which nbgrader then reads as the submitted
   folder). A renamed notebook (Colab's ``lab (1).ipynb``) is used if it is the only one.
   A submission that cannot be matched is reported and not graded.
3. ``Autograde`` runs each submission (``TRANSFORMER_LAB_PROFILE=grading``, the cell
   timeout of ``nbgrader_config.py``); deleted or edited test cells are restored by
   nbgrader. A failure is recorded for that submission and the batch goes on.
4. Scores are read back from the gradebook (not from exit codes), then
   ``GenerateFeedback`` writes the HTML feedback and ``CsvExportPlugin`` the CSV.

Reference: nbgrader's autograde/feedback/export (nbgrader/converters, nbgrader/plugins).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.converters import Autograde, GenerateAssignment, GenerateFeedback
from nbgrader.coursedir import CourseDirectory
from nbgrader.plugins.export import CsvExportPlugin
from sqlalchemy.exc import SAWarning
from traitlets.config import Config

from transformer_lab.grading.course import (
    SOLUTIONS,
    GradingError,
    grading_env,
    load_config,
    make_coursedir,
    read_notebook,
    run_converter,
    select_labs,
    write_notebook,
)
from transformer_lab.grading.repair import repair_notebook

__all__ = ["GradeReport", "SubmissionResult", "grade_course"]

WORK_DIR = "repaired"
RELEASE_DIR = "release"


@dataclass
class SubmissionResult:
    """The outcome for one student and one lab.

    Attributes:
        student: student id (folder name).
        lab: lab name.
        status: ``graded``, ``unmatched`` (not graded: notebook not recognised) or ``failed``.
        score: total score in the gradebook (autograded plus any manual grades so far).
        max_score: the lab's maximum.
        auto_score: points from the autograded test cells.
        auto_max: points available in autograded test cells.
        needs_manual: cells waiting for a human grader (written answers).
        repairs: what :func:`repair_notebook` changed, per notebook.
        error: why grading failed (``failed``/``unmatched``).
        seconds: wall time spent on this submission (repair, autograde, feedback).
    """

    student: str
    lab: str
    status: str
    score: float | None = None
    max_score: float | None = None
    auto_score: float | None = None
    auto_max: float | None = None
    needs_manual: int = 0
    repairs: list[str] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0


@dataclass
class GradeReport:
    """All results of one ``grade`` run and where its outputs are."""

    course: Path
    results: list[SubmissionResult]
    csv_path: Path
    feedback_dir: Path

    @property
    def ok(self) -> bool:
        """True when every submission was graded."""
        return all(r.status == "graded" for r in self.results)

    def find(self, student: str, lab: str) -> SubmissionResult:
        """The result of ``student`` for ``lab``."""
        for r in self.results:
            if r.student == student and r.lab == lab:
                return r
        raise KeyError(f"no result for student={student!r} lab={lab!r}")

    def table(self) -> str:
        """A plain-text summary, one line per submission."""
        head = f"{'student':<20} {'lab':<28} {'status':<9} {'auto':>9} {'manual':>6} {'s':>5}"
        lines = [head]
        for r in self.results:
            auto = f"{r.auto_score:g}/{r.auto_max:g}" if r.auto_score is not None else "-"
            lines.append(
                f"{r.student:<20} {r.lab:<28} {r.status:<9} {auto:>9} {r.needs_manual:>6} "
                f"{r.seconds:>5.1f}"
            )
            lines += [f"    repaired: {a}" for a in r.repairs]
            if r.error:
                lines.append(f"    error: {r.error}")
        return "\n".join(lines)


def _tail(text: str, n: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def _prepare(
    course: Path, student: str, lab: str, release_dir: Path, result: SubmissionResult
) -> bool:
    """Copy the submission to the working folder and repair it; False if it can't be graded."""
    src = course / "submitted" / student / lab
    dst = course / WORK_DIR / student / lab
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    for release_nb in sorted(release_dir.glob("*.ipynb")):
        target = dst / release_nb.name
        if not target.exists():
            others = sorted(p for p in dst.glob("*.ipynb") if not (release_dir / p.name).exists())
            if len(others) != 1:
                result.status, result.error = (
                    "unmatched",
                    f"{release_nb.name} not found in the submission "
                    f"(notebooks there: {[p.name for p in dst.glob('*.ipynb')] or 'none'})",
                )
                return False
            others[0].rename(target)
            result.repairs.append(f"used {others[0].name} as {release_nb.name}")
        try:
            submitted = read_notebook(target)
        except Exception as exc:
            result.status = "unmatched"
            result.error = f"{release_nb.name} is not a readable notebook: {exc}"
            return False
        repaired = repair_notebook(submitted, read_notebook(release_nb))
        if not repaired.ok:
            result.status = "unmatched"
            result.error = f"{release_nb.name}: {repaired.reason}"
            return False
        result.repairs += repaired.actions
        write_notebook(repaired.notebook, target)
    return True


def _autograde(
    course: Path, coursedir: CourseDirectory, config: Config, result: SubmissionResult
) -> None:
    """Repair, autograde and write feedback for one submission; failures go into ``result``."""
    student, lab = result.student, result.lab
    if not _prepare(course, student, lab, course / RELEASE_DIR / lab, result):
        return
    coursedir.assignment_id, coursedir.student_id = lab, student
    out = run_converter(Autograde, coursedir, config, force=True, create_student=True)
    if not out["success"]:
        result.status = "failed"
        result.error = "nbgrader could not autograde it:\n" + _tail(
            out.get("log", "") + "\n" + out.get("error", "")
        )
        return
    fb = run_converter(GenerateFeedback, coursedir, config, force=True)
    if not fb["success"]:
        result.error = "feedback not generated:\n" + _tail(fb.get("log", ""))


def _grading_views(repo: Path, labs: list[str], course: Path) -> dict[str, Path]:
    """Per lab, the package the kernel imports: the student package of that lab's deadline.

    The graded lab and every later one are locked (their answers left out), the hidden checks
    are in; earlier labs are whole. Without the kit's sources (an installed kit) no view is
    built and the installed package is used.
    """
    from transformer_lab.grading.student import build_package_tree

    if not (repo / "transformer_lab").is_dir():
        return {}
    all_labs = select_labs(repo, None)
    views = {}
    for lab in labs:
        view = course / ".grading" / "views" / lab
        build_package_tree(repo, view, all_labs[all_labs.index(lab) :], grader=True)
        views[lab] = view
    return views


@contextlib.contextmanager
def _kernel_path(view: Path | None) -> Iterator[None]:
    """Put ``view`` first on the ``PYTHONPATH`` the grading kernels inherit."""
    if view is None:
        yield
        return
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(view), saved) if p)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def _scores(gb: Gradebook, result: SubmissionResult) -> None:
    submission = gb.find_submission(result.lab, result.student)
    result.score = float(submission.score)
    result.max_score = float(submission.max_score)
    auto, auto_max, manual = 0.0, 0.0, 0
    for notebook in submission.notebooks:
        for grade in notebook.grades:
            if grade.cell_type != "code" or grade.needs_manual_grade:
                manual += int(bool(grade.needs_manual_grade))
                continue
            auto += float(grade.auto_score or 0.0)
            auto_max += float(grade.max_score)
    result.auto_score, result.auto_max, result.needs_manual = auto, auto_max, manual


def grade_course(
    course: Path,
    repo: Path,
    labs: list[str] | None = None,
    students: list[str] | None = None,
    timeout: int | None = None,
    profile: str = "grading",
) -> GradeReport:
    """Autograde ``course/submitted`` into ``course/gradebook.db``; write feedback and CSV.

    Args:
        course: the course folder (layout in the module docstring).
        repo: the repository whose ``solutions/`` and ``nbgrader_config.py`` define the labs.
        labs: lab names or prefixes to grade (default: every lab found in submissions).
        students: student ids to grade (default: all).
        timeout: seconds per cell (default: ``nbgrader_config.py``'s ``Execute.timeout``).
        profile: value of ``TRANSFORMER_LAB_PROFILE`` while notebooks run.

    Returns:
        A :class:`GradeReport`; failures of single submissions are recorded, not raised.

    Raises:
        GradingError: the course folder has no ``submitted/``, or a lab's source is broken.
    """
    course = Path(course).resolve()
    submitted = course / "submitted"
    if not submitted.is_dir():
        raise GradingError(f"{submitted} does not exist: expected submitted/<student>/<lab>/")
    known = select_labs(repo, None)
    wanted = select_labs(repo, labs) if labs else None
    pairs: list[tuple[str, str]] = []
    results: list[SubmissionResult] = []
    for student_dir in sorted(p for p in submitted.iterdir() if p.is_dir()):
        if students and student_dir.name not in students:
            continue
        for lab_dir in sorted(p for p in student_dir.iterdir() if p.is_dir()):
            if wanted is not None and lab_dir.name not in wanted:
                continue
            if lab_dir.name not in known:
                results.append(
                    SubmissionResult(
                        student_dir.name,
                        lab_dir.name,
                        "unmatched",
                        error=f"no lab called {lab_dir.name!r} (known: {', '.join(known)})",
                    )
                )
                continue
            pairs.append((student_dir.name, lab_dir.name))
    overrides = {"Execute__timeout": int(timeout)} if timeout else {}
    config = load_config(repo, **overrides)
    coursedir = make_coursedir(
        config,
        course,
        source_directory=str((repo / SOLUTIONS).resolve()),
        release_directory=RELEASE_DIR,
        submitted_directory=WORK_DIR,
    )
    csv_path = course / "grades.csv"
    with grading_env(profile), warnings.catch_warnings():
        # nbgrader's gradebook triggers SQLAlchemy autoflush warnings that mean nothing here.
        warnings.filterwarnings("ignore", category=SAWarning)
        for lab in sorted({lab for _, lab in pairs}):
            coursedir.assignment_id = lab
            coursedir.student_id = "."
            out = run_converter(GenerateAssignment, coursedir, config, force=True)
            if not out["success"]:
                raise GradingError(f"could not record {lab} in the gradebook:\n{out.get('log')}")
        views = _grading_views(repo, sorted({lab for _, lab in pairs}), course)
        for student, lab in pairs:
            result = SubmissionResult(student, lab, "graded")
            results.append(result)
            start = time.perf_counter()
            try:
                with _kernel_path(views.get(lab)):
                    _autograde(course, coursedir, config, result)
            except Exception as exc:  # one broken submission never stops the batch
                result.status = "failed"
                result.error = f"{type(exc).__name__}: {exc}"
            result.seconds = round(time.perf_counter() - start, 2)
        coursedir.student_id = "*"
        with Gradebook(coursedir.db_url) as gb:
            for result in results:
                if result.status == "graded":
                    try:
                        _scores(gb, result)
                    except MissingEntry:
                        result.status = "failed"
                        result.error = "no submission in the gradebook after autograding"
            exporter = CsvExportPlugin()
            exporter.to = str(csv_path)
            exporter.export(gb)
    report = GradeReport(course, results, csv_path, course / "feedback")
    (course / "grading_report.json").write_text(
        json.dumps([asdict(r) for r in results], indent=2) + "\n"
    )
    return report

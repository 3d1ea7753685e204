"""What a course's grading says, per student and lab: the input of ``labs export`` and ``report``.

Two sources, each read through its own owner's format:

* ``COURSE/gradebook.db`` through nbgrader's :class:`~nbgrader.api.Gradebook` API: the scores
  that count (autograded and manual grades from formgrader, late penalties), per-cell grades,
  manual comments, and who is enrolled but handed nothing in;
* ``COURSE/grading_report.json`` (``labs grade``'s records, the latest per submission): the
  status (graded, incomplete, crashed, flagged, unmatched, failed), flags, problems, and the
  checks' verdicts per test cell (``SubmissionResult.verdicts``: the named mistake each check
  recognised). Records without verdicts fall back to per-cell scores.

Submission times come from ``submitted/<student>/<lab>/timestamp.txt`` (what ``collect``
writes) and deadlines from ``c.TransformerLab.deadlines``.
"""

from __future__ import annotations

import datetime as dt
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbgrader.api import Gradebook
from sqlalchemy.exc import SAWarning

from transformer_lab.grading.course import GradingError, grading_env
from transformer_lab.grading.lms import read_timestamp

__all__ = ["Outcome", "course_deadlines", "course_outcomes", "read_latest"]

REPORT = "grading_report.json"


@dataclass
class Outcome:
    """One student's result for one lab, from the gradebook and the grading report.

    Attributes:
        student, lab: ids.
        status: ``graded``, ``incomplete``, ``crashed``, ``flagged``, ``unmatched``,
            ``failed`` (from ``labs grade``) or ``missing`` (nothing handed in).
        score, max_score: what counts (gradebook: autograded + manual - late penalty).
        manual_score, manual_max: points of the written answers graded by hand so far.
        needs_manual: written answers still waiting for formgrader.
        cells: test cell grade id -> ``{"score", "max_score", "mistake", "message"}``.
        reasons: flags, problems and errors, one sentence each.
        comments: manual comments entered in formgrader, per cell.
        submitted: submission time (UTC) or ``None``; late_by: time past the deadline.
        feedback: the feedback HTML (``COURSE/feedback/<student>/<lab>/<lab>.html``) or ``None``.
    """

    student: str
    lab: str
    status: str
    score: float = 0.0
    max_score: float = 0.0
    manual_score: float = 0.0
    manual_max: float = 0.0
    needs_manual: int = 0
    cells: dict[str, dict[str, Any]] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    comments: dict[str, str] = field(default_factory=dict)
    late_penalty: float = 0.0
    submitted: dt.datetime | None = None
    late_by: dt.timedelta | None = None
    feedback: Path | None = None

    @property
    def label(self) -> str:
        """Status in words for an LMS column: ``graded``, ``flagged: ...``, ``late 2h``..."""
        parts = [self.status]
        if self.needs_manual:
            parts.append(f"{self.needs_manual} written answer(s) not graded yet")
        if self.late_by is not None and self.late_by > dt.timedelta(0):
            hours = self.late_by.total_seconds() / 3600
            parts.append(f"late by {hours:.1f} h")
        return "; ".join(parts)


def read_latest(course: Path) -> dict[str, dict[str, Any]]:
    """``"student/lab"`` -> the latest ``labs grade`` record (empty when never graded)."""
    path = Path(course) / REPORT
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise GradingError(f"{path} is not valid JSON ({exc}); re-run labs grade") from exc
    if isinstance(data, list):  # the format before runs were kept
        return {f"{r.get('student')}/{r.get('lab')}": r for r in data}
    return dict(data.get("latest", {}))


def _cells(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per test cell verdicts; from ``cell_scores`` alone where the record has no verdicts."""
    cells = {
        gid: {"score": float(s), "max_score": float(m), "mistake": None, "message": ""}
        for gid, (s, m) in (record.get("cell_scores") or {}).items()
    }
    for gid, verdict in (record.get("verdicts") or {}).items():
        cells[gid] = {**cells.get(gid, {}), **verdict}
    return cells


def course_deadlines(repo: Path) -> dict[str, dt.datetime]:
    """Lab -> deadline (UTC) from ``c.TransformerLab.deadlines`` in ``nbgrader_config.py``."""
    from transformer_lab.grading.course import course_settings
    from transformer_lab.grading.student import _parse_deadline

    return {lab: _parse_deadline(lab, v) for lab, v in course_settings(repo).deadlines.items()}


def course_outcomes(
    course: Path,
    labs: list[str] | None = None,
    deadlines: dict[str, dt.datetime] | None = None,
    enrolled: list[str] | None = None,
) -> list[Outcome]:
    """Every (student, lab) of the gradebook, with the grading report's status and verdicts.

    Args:
        course: the course folder holding ``gradebook.db``.
        labs: only these labs (default: every lab in the gradebook).
        deadlines: lab -> deadline (:func:`course_deadlines`): marks late submissions.
        enrolled: more student ids (a roster's): those the gradebook lacks are ``missing``.

    Raises:
        GradingError: no gradebook, or a lab the gradebook does not know.
    """
    course = Path(course).resolve()
    db = course / "gradebook.db"
    if not db.is_file():
        raise GradingError(f"{db} does not exist: grade the course first (labs grade)")
    latest = read_latest(course)
    deadlines = dict(deadlines or {})
    outcomes: list[Outcome] = []
    with grading_env(), warnings.catch_warnings(), Gradebook(f"sqlite:///{db}") as gb:
        warnings.filterwarnings("ignore", category=SAWarning)
        known = [a.name for a in gb.assignments]
        for lab in labs or []:
            if lab not in known:
                raise GradingError(f"the gradebook has no lab {lab!r} (it has: {known})")
        students = sorted({s.id for s in gb.students} | set(enrolled or []))
        for lab in sorted(labs or known):
            assignment = gb.find_assignment(lab)
            by_student = {s.student.id: s for s in assignment.submissions}
            for student in students:
                outcomes.append(_outcome(course, lab, student, by_student, latest, deadlines))
    return outcomes


def _outcome(
    course: Path,
    lab: str,
    student: str,
    by_student: dict[str, Any],
    latest: dict[str, dict[str, Any]],
    deadlines: dict[str, dt.datetime],
) -> Outcome:
    record = latest.get(f"{student}/{lab}")
    sub = by_student.get(student)
    if sub is None and record is None:
        return Outcome(student, lab, "missing", reasons=["nothing handed in"])
    status = record.get("status", "graded") if record else "graded"
    outcome = Outcome(student, lab, status)
    if record:
        outcome.cells = _cells(record)
        outcome.reasons = [
            *(f"flag: {f}" for f in record.get("flags", [])),
            *(f"problem: {p}" for p in record.get("problems", [])),
            *([f"error: {record['error']}"] if record.get("error") else []),
        ]
    if sub is not None:
        outcome.score, outcome.max_score = float(sub.score), float(sub.max_score)
        outcome.late_penalty = float(sub.late_submission_penalty or 0.0)
        for notebook in sub.notebooks:
            for grade in notebook.grades:
                if grade.cell_type == "markdown":
                    outcome.manual_max += float(grade.max_score)
                    outcome.manual_score += float(grade.manual_score or 0.0)
                    outcome.needs_manual += int(bool(grade.needs_manual_grade))
                elif grade.name in outcome.cells and grade.manual_score is not None:
                    outcome.cells[grade.name]["score"] = float(grade.manual_score)
            for comment in notebook.comments:
                if comment.manual_comment:
                    outcome.comments[comment.name] = comment.manual_comment
    elif record:
        outcome.max_score = float(record.get("max_score") or 0.0)
    folder = course / "submitted" / student / lab
    outcome.submitted = read_timestamp(folder)
    if outcome.submitted and lab in deadlines:
        outcome.late_by = outcome.submitted - deadlines[lab]
    page = course / "feedback" / student / lab / f"{lab}.html"
    outcome.feedback = page if page.is_file() else None
    return outcome

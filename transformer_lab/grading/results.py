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

Nothing is hidden: every student of the roster (``--roster``, or the one ``collect`` kept in
``COURSE/lms/roster.csv``) has an outcome for every lab, with their name; a student whose
files ``collect`` could not place gets that as their status (``not a notebook``, ``wrong
lab``, ...) rather than "nothing handed in"; files that no student could be found for are
listed by :func:`unplaced_files`.
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
from transformer_lab.grading.lms import Roster, collected_files, course_roster, read_timestamp

__all__ = [
    "GRADED",
    "Outcome",
    "class_rows",
    "course_deadlines",
    "course_outcomes",
    "neutralise",
    "read_latest",
    "unplaced_files",
]

REPORT = "grading_report.json"
#: Statuses whose points count (incomplete and crashed ones earned what they earned).
GRADED = ("graded", "incomplete", "crashed")
#: Which of a student's files ``collect`` left out says most about why nothing was graded.
KIND_ORDER = (
    "wrong lab",
    "not a notebook",
    "archive",
    "ambiguous",
    "link",
    "misnamed",
    "unsafe",
    "older attempt",
    "kept existing",
)


@dataclass
class Outcome:
    """One student's result for one lab, from the gradebook and the grading report.

    Attributes:
        student, lab: ids; name: the student's name (roster or LMS; empty if unknown).
        status: ``graded``, ``incomplete``, ``crashed``, ``flagged``, ``unmatched``,
            ``failed`` (from ``labs grade``), what ``collect`` did with the student's files
            when none was placed (``not a notebook``, ``wrong lab``, ``ambiguous``, ...), or
            ``missing`` (nothing handed in).
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
    name: str = ""

    @property
    def label(self) -> str:
        """Status in words for an LMS column: ``graded``, ``flagged: ...``, ``late 2h``..."""
        parts = ["nothing handed in" if self.status == "missing" else self.status]
        if self.needs_manual:
            parts.append(f"{self.needs_manual} written answer(s) not graded yet")
        if self.late_by is not None and self.late_by > dt.timedelta(0):
            hours = self.late_by.total_seconds() / 3600
            parts.append(f"late by {hours:.1f} h")
        return "; ".join(parts)


#: A spreadsheet reads a cell starting with one of these as a formula (OWASP, "CSV Injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def neutralise(value: object) -> str:
    """A CSV cell no spreadsheet runs: text starting like a formula gets a leading ``'``.

    A name or comment is text the LMS or a student chose (``=HYPERLINK(...)``); numbers
    (``-1.5``) and Moodle's ``-`` for "no date" stay as they are.
    """
    text = "" if value is None else str(value)
    if not text.startswith(FORMULA_START) or text == "-":
        return text
    try:
        float(text)
    except ValueError:
        return "'" + text
    return text


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
    roster: Roster | None = None,
) -> list[Outcome]:
    """Every (student, lab) of the gradebook and the roster, with status, verdicts and names.

    Args:
        course: the course folder holding ``gradebook.db``.
        labs: only these labs (default: every lab in the gradebook).
        deadlines: lab -> deadline (:func:`course_deadlines`): marks late submissions.
        enrolled: more student ids: those the gradebook lacks are ``missing``.
        roster: the roster (default: the one ``collect`` kept in the course, if any): its
            students are enrolled, and give the names.

    Raises:
        GradingError: no gradebook, or a lab the gradebook does not know.
    """
    course = Path(course).resolve()
    db = course / "gradebook.db"
    if not db.is_file():
        raise GradingError(f"{db} does not exist: grade the course first (labs grade)")
    latest = read_latest(course)
    deadlines = dict(deadlines or {})
    roster = course_roster(course, roster)
    names = {s.id: s.full_name for s in roster.students} if roster else {}
    left_out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for item in collected_files(course):
        if item.get("student") and item.get("action") == "skipped":
            left_out.setdefault((item["student"], item["lab"]), []).append(item)
            names.setdefault(item["student"], item.get("full_name", ""))
    outcomes: list[Outcome] = []
    with grading_env(), warnings.catch_warnings(), Gradebook(f"sqlite:///{db}") as gb:
        warnings.filterwarnings("ignore", category=SAWarning)
        known = [a.name for a in gb.assignments]
        for lab in labs or []:
            if lab not in known:
                raise GradingError(f"the gradebook has no lab {lab!r} (it has: {known})")
        students = sorted(
            {s.id for s in gb.students}
            | set(enrolled or [])
            | set(names)
            | {s for s, _ in left_out}
        )
        for lab in sorted(labs or known):
            assignment = gb.find_assignment(lab)
            by_student = {s.student.id: s for s in assignment.submissions}
            for student in students:
                outcome = _outcome(course, lab, student, by_student, latest, deadlines)
                outcome.name = names.get(student, "")
                if outcome.status == "missing" and (student, lab) in left_out:
                    _not_placed(outcome, left_out[(student, lab)])
                outcomes.append(outcome)
    return outcomes


def _not_placed(outcome: Outcome, files: list[dict[str, Any]]) -> None:
    """A student with files but none placed: the status says why, each file its reason."""
    kinds = [str(f.get("kind") or "not placed") for f in files]
    rank = {kind: i for i, kind in enumerate(KIND_ORDER)}
    outcome.status = min(kinds, key=lambda kind: rank.get(kind, len(rank)))
    outcome.reasons = [f"{f.get('file')}: {f.get('reason')}" for f in files]


def unplaced_files(course: Path, labs: list[str] | None = None) -> list[dict[str, Any]]:
    """Files ``collect`` found no student for (unknown, ambiguous, misnamed, unsafe...).

    Each is a dict of ``collect``'s record (``file``, ``lms``, ``lab``, ``kind``, ``reason``,
    ``lms_id``...); the LMS's receipts are left out (they are not submissions).
    """
    return [
        f
        for f in collected_files(course)
        if not f.get("student")
        and f.get("action") == "skipped"
        and (labs is None or f.get("lab") in labs)
    ]


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


def class_rows(course: Path, rows: list[dict[str, str]]) -> tuple[list[str], list[dict[str, str]]]:
    """``grades.csv``'s rows (nbgrader's export with ``status``) completed for the whole class.

    Names from the roster where the gradebook has none; a row per lab for each roster student
    the gradebook lacks (``missing``, or what ``collect`` did with their files); a row per
    file ``collect`` found no student for. Returns the columns added and all rows.
    """
    roster = course_roster(course)
    people = {s.id: s for s in roster.students} if roster else {}
    left_out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for item in collected_files(course):
        if item.get("student") and item.get("action") == "skipped":
            left_out.setdefault((item["student"], item["lab"]), []).append(item)
    latest = read_latest(course)
    labs = sorted({r["assignment"] for r in rows} | {lab for _, lab in left_out})
    have = {(r["student_id"], r["assignment"]) for r in rows}
    out = [dict(r) for r in rows]
    for student in sorted(set(people) | {s for s, _ in left_out}):
        for lab in labs:
            if (student, lab) not in have:
                # Not in the gradebook: handed in nothing, or not gradable (labs grade's why).
                record = latest.get(f"{student}/{lab}", {})
                row = {"assignment": lab, "student_id": student}
                row["status"] = record.get("status", "missing")
                row["note"] = record.get("error") or ""
                out.append(row)
    for row in out:
        found = people.get(row["student_id"])
        if found is not None:
            row["first_name"] = row.get("first_name") or found.first_name
            row["last_name"] = row.get("last_name") or found.last_name
            row["email"] = row.get("email") or found.email
        files = left_out.get((row["student_id"], row["assignment"]))
        if row.get("status") == "missing" and files:
            outcome = Outcome(row["student_id"], row["assignment"], "missing")
            _not_placed(outcome, files)
            row["status"], row["note"] = outcome.status, " | ".join(outcome.reasons)
        elif row.get("status") == "missing":
            row["note"] = "nothing handed in"
    for item in unplaced_files(course, labs or None):
        out.append(
            {
                "assignment": item["lab"],
                "student_id": "",
                "status": str(item.get("kind") or "not placed"),
                "file": f"{item['lms']}: {item['file']}",
                "note": str(item.get("reason", "")),
            }
        )
    return ["file", "note"], out

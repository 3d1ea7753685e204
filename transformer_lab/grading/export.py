"""``transformer-lab labs export --lms moodle|canvas``: grades and feedback back into the LMS.

Three outputs, from the gradebook (manual grades from formgrader included) and the grading
report (:mod:`~transformer_lab.grading.results`):

1. the LMS's grade-import CSV:

   * Moodle's offline grading worksheet (Assignment > "Download grading worksheet", re-imported
     with "Upload grading worksheet"), one file per lab, with the worksheet's own columns
     ``Identifier,Full name,Email address,Status,Grade,Maximum Grade,Grade can be changed,
     Last modified (submission),Last modified (grade),Feedback comments``. Moodle matches rows
     by ``Identifier`` (``Participant <n>``, the number in its download's file names) and
     imports ``Grade`` and ``Feedback comments``; ``Status`` is shown, not imported, so the
     kit's status goes in both ``Status`` and the comments.
   * Canvas's Gradebook import CSV (Grades > Import), one file per lab:
     ``Student,ID,SIS User ID,SIS Login ID,Section,<assignment> (<assignment id>)`` with the
     ``Points Possible`` row Canvas's own export has, and a row only for students whose grade
     is exported: Canvas's importer (``gradebook_importer.rb``) takes a blank cell as "no
     score", a change that clears the grade it has. Canvas matches rows by ``ID`` (its user
     id) and turns any column it does not know into a new assignment, so the status goes into
     ``canvas-status.csv``, not into the import.

   Flagged, failed, unmatched, not placed and missing submissions get no grade (an empty
   ``Grade`` in Moodle's worksheet, which its importer skips; no row in Canvas's import) and
   their reasons, never a silent zero; incomplete and crashed ones get the points they earned
   and say so.
2. the feedback pages bundled for the LMS's bulk feedback upload: Moodle's "Upload multiple
   feedback files in a zip" (files named ``Full Name_<n>_assignsubmission_file_<name>``, the
   download's naming) and Canvas's "Re-upload submissions", one zip per lab (files named as
   Canvas downloads them, ``<name>_<user id>_<attachment id>_<name>``, for the submissions
   collected from Canvas: Canvas reads the first two all-digit parts as user and attachment id
   and ignores a file whose attachment is not that submission's; the file becomes a submission
   comment, which Canvas names after the submitted file, ``<lab>.ipynb``, whatever the zip
   calls it; ``--lms canvas-api``, :mod:`~transformer_lab.grading.canvas_api`, sends each page
   through Canvas's REST API instead, under its ``.html`` name).
3. nbgrader's own feedback layout for JupyterHub courses: ``labs grade`` already writes
   ``feedback/<student>/<lab>/<lab>.html`` (``GenerateFeedback``'s layout); nbgrader's
   ``release_feedback`` also needs ``timestamp.txt`` and ``submission_secret.txt`` beside it,
   which are copied from the submission folder where they exist.

The LMS's ids come from ``collect``'s records (``COURSE/lms/<lms>-<lab>.json``), else from the
roster's ``lms_id``; a student with neither is left out of that LMS's files and named.
"""

from __future__ import annotations

import csv
import datetime as dt
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from transformer_lab.grading.course import GradingError
from transformer_lab.grading.lms import Roster, course_roster, lms_record
from transformer_lab.grading.results import (
    GRADED,
    Outcome,
    course_outcomes,
    neutralise,
    unplaced_files,
)

__all__ = ["CANVAS_COLUMNS", "MOODLE_COLUMNS", "ExportReport", "export_grades", "neutralise"]

MOODLE_COLUMNS = [
    "Identifier",
    "Full name",
    "Email address",
    "Status",
    "Grade",
    "Maximum Grade",
    "Grade can be changed",
    "Last modified (submission)",
    "Last modified (grade)",
    "Feedback comments",
]
CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
#: nbgrader's release_feedback reads these beside each feedback page.
NBGRADER_FEEDBACK_FILES = ("timestamp.txt", "submission_secret.txt")


@dataclass
class ExportReport:
    """Files written by :func:`export_grades` and students left out (with why)."""

    written: list[Path] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)

    def no_id(self, lms: str, outcome: Outcome, what: str) -> None:
        self.left_out.append(
            f"{lms} {outcome.lab}: {outcome.student} has no {what} (collect their submission "
            f"from {lms}, or add lms_id to the roster)"
        )


def _moodle_time(moment: dt.datetime | None) -> str:
    """Moodle's worksheet date format (``Tuesday, 1 December 2026, 7:42 PM``); ``-`` if none."""
    if moment is None:
        return "-"
    return moment.strftime("%A, %-d %B %Y, %-I:%M %p")


def _points(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def grade_value(outcome: Outcome) -> str:
    """The grade an LMS gets: points, or empty where they are withheld (flagged, ...)."""
    return "" if outcome.status not in GRADED else _points(outcome.score)


def summary(outcome: Outcome) -> str:
    """A short feedback comment: status, points, what is withheld and why."""
    parts = [f"Status: {outcome.label}."]
    if outcome.status == "missing":
        parts.append("No grade exported.")
    elif outcome.status not in GRADED:
        parts.append("No grade exported: an instructor reviews it.")
    else:
        auto = outcome.score - outcome.manual_score
        parts.append(
            f"Points: {_points(outcome.score)}/{_points(outcome.max_score)} (checks "
            f"{_points(auto)}, written answers {_points(outcome.manual_score)}/"
            f"{_points(outcome.manual_max)})."
        )
    if outcome.late_penalty:
        parts.append(f"Late penalty: {_points(outcome.late_penalty)}.")
    parts += [r.replace("\n", " ")[:300] for r in outcome.reasons[:5]]
    if outcome.feedback is not None:
        parts.append("Details in the attached feedback page.")
    return " ".join(parts)


def _ids(course: Path, lms: str, lab: str, roster: Roster | None) -> dict[str, dict[str, str]]:
    """Student -> ``lms_id``, ``full_name``, ``email``, ``prefix``: collect's, else the roster's."""
    found: dict[str, dict[str, str]] = {}
    if roster is not None:
        for s in roster.students:
            found[s.id] = {
                "lms_id": s.lms_id,
                "full_name": s.full_name,
                "email": s.email,
                "last_first": f"{s.last_name}, {s.first_name}".strip(", "),
                "prefix": "",
            }
    for student, item in lms_record(course, lms, lab).items():
        row = found.setdefault(student, {"last_first": item.get("full_name", "")})
        for key in ("lms_id", "full_name", "email", "prefix"):
            if item.get(key):
                row[key] = item[key]
    return found


def _feedback_zip(path: Path, members: list[tuple[str, Path]]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, source in members:
            zf.write(source, name)
    return path


def _export_moodle(
    course: Path, outcomes: list[Outcome], out: Path, roster: Roster | None, report: ExportReport
) -> None:
    now = dt.datetime.now(dt.timezone.utc)
    for lab in sorted({o.lab for o in outcomes}):
        ids = _ids(course, "moodle", lab, roster)
        rows, members = [], []
        for o in (o for o in outcomes if o.lab == lab):
            who = ids.get(o.student, {})
            if not who.get("lms_id"):
                report.no_id("moodle", o, "Moodle participant number")
                continue
            name = who.get("full_name") or o.student
            rows.append(
                {
                    "Identifier": f"Participant {who['lms_id']}",
                    "Full name": name,
                    "Email address": who.get("email", ""),
                    "Status": o.label,
                    "Grade": grade_value(o),
                    "Maximum Grade": _points(o.max_score),
                    "Grade can be changed": "Yes",
                    "Last modified (submission)": _moodle_time(o.submitted),
                    "Last modified (grade)": _moodle_time(now),
                    "Feedback comments": summary(o),
                }
            )
            if o.feedback is not None:
                # Moodle writes a name's "_" as " " (its importer splits the prefix at "_").
                prefix = f"{name.replace('_', ' ')}_{who['lms_id']}_assignsubmission_file_"
                members.append((f"{prefix}{lab}_feedback.html", o.feedback))
        sheet = out / f"moodle-{lab}-grades.csv"
        _write_csv(sheet, MOODLE_COLUMNS, rows)
        report.written.append(sheet)
        if members:
            report.written.append(_feedback_zip(out / f"moodle-{lab}-feedback.zip", members))


def _export_canvas(
    course: Path,
    outcomes: list[Outcome],
    out: Path,
    roster: Roster | None,
    report: ExportReport,
    assignment_ids: dict[str, str],
) -> None:
    labs = sorted({o.lab for o in outcomes})
    columns = {
        lab: f"{lab} ({assignment_ids[lab]})" if lab in assignment_ids else lab for lab in labs
    }
    people: dict[str, dict[str, str]] = {}
    members: dict[str, list[tuple[str, Path]]] = {}
    for lab in labs:
        for student, who in _ids(course, "canvas", lab, roster).items():
            people.setdefault(student, {}).update({k: v for k, v in who.items() if v})
    # One import per lab, with a row only where a grade is exported: Canvas's importer takes a
    # blank cell for "no score" and so as a change that clears the grade it has.
    grids: dict[str, list[dict[str, str]]] = {lab: [] for lab in labs}
    status_rows = []
    maxima: dict[str, str] = {}
    for o in outcomes:
        who = people.get(o.student, {})
        if not who.get("lms_id"):
            report.no_id("canvas", o, "Canvas user id")
            continue
        row = {
            "Student": who.get("last_first") or who.get("full_name") or o.student,
            "ID": who["lms_id"],
            "SIS User ID": "",
            "SIS Login ID": "",
            "Section": "",
        }
        if grade_value(o):
            grids[o.lab].append({**row, columns[o.lab]: grade_value(o)})
        maxima[o.lab] = _points(o.max_score) if o.max_score else maxima.get(o.lab, "")
        status_rows.append(
            {
                "Student": row["Student"],
                "ID": who["lms_id"],
                "assignment": columns[o.lab],
                "status": o.status,
                "points": grade_value(o),
                "max_points": _points(o.max_score),
                "comment": summary(o),
            }
        )
        if o.feedback is not None:
            prefix = _ids(course, "canvas", o.lab, None).get(o.student, {}).get("prefix")
            if prefix:
                members.setdefault(o.lab, []).append((f"{prefix}{o.lab}_feedback.html", o.feedback))
            else:
                report.left_out.append(
                    f"canvas {o.lab}: {o.student}'s feedback page is in no zip: Canvas's re-upload "
                    "needs the attachment id of their submission (collect the lab from Canvas)"
                )
    for lab, rows in grids.items():
        points_row = {"Student": "Points Possible", columns[lab]: maxima.get(lab, "")}
        sheet = out / f"canvas-{lab}-grades.csv"
        _write_csv(sheet, [*CANVAS_COLUMNS, columns[lab]], [points_row, *rows])
        report.written.append(sheet)
    status = out / "canvas-status.csv"
    _write_csv(status, list(status_rows[0]) if status_rows else ["Student"], status_rows)
    report.written.append(status)
    for lab, files in sorted(members.items()):  # one zip per lab: one re-upload per assignment
        report.written.append(_feedback_zip(out / f"canvas-{lab}-feedback.zip", files))


def _write_csv(path: Path, fields: list[str], rows: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows({k: neutralise(v) for k, v in row.items()} for row in rows)


def complete_nbgrader_feedback(course: Path) -> list[Path]:
    """Copy ``timestamp.txt``/``submission_secret.txt`` beside each feedback page (nbgrader's
    ``release_feedback`` reads them there); return the files written."""
    written = []
    feedback = Path(course) / "feedback"
    for page in sorted(feedback.glob("*/*/*.html")):
        folder = page.parent
        student, lab = folder.parent.name, folder.name
        for name in NBGRADER_FEEDBACK_FILES:
            source = Path(course) / "submitted" / student / lab / name
            if source.is_file() and not (folder / name).is_file():
                shutil.copyfile(source, folder / name)
                written.append(folder / name)
    return written


def export_grades(
    course: Path,
    lms: str,
    out: Path,
    *,
    labs: list[str] | None = None,
    roster: Roster | None = None,
    deadlines: dict[str, dt.datetime] | None = None,
    assignment_ids: dict[str, str] | None = None,
) -> ExportReport:
    """Write ``lms``'s grade CSV and feedback zip into ``out``; complete nbgrader's feedback.

    Args:
        course: the graded course folder.
        lms: ``moodle`` or ``canvas``.
        out: the folder for the files (created; existing files of the same name are replaced:
            they are exports, made again from the gradebook).
        labs: only these labs (default: all in the gradebook).
        roster: the roster (names, emails and ``lms_id`` for students not collected).
        deadlines: lab -> deadline (marks late submissions).
        assignment_ids: Canvas only: lab -> Canvas assignment id, for the column headers.

    Raises:
        GradingError: an unknown LMS, no gradebook, an unknown lab, ``out`` inside
            ``submitted/``.
    """
    if lms not in ("moodle", "canvas"):
        raise GradingError(f"--lms {lms!r}: export writes moodle or canvas files")
    course, out = Path(course).resolve(), Path(out).resolve()
    if out.is_relative_to(course / "submitted"):
        raise GradingError(f"--out {out} is inside submitted/: choose another folder")
    roster = course_roster(course, roster)
    outcomes = course_outcomes(course, labs, deadlines, roster=roster)
    out.mkdir(parents=True, exist_ok=True)
    report = ExportReport()
    if lms == "moodle":
        _export_moodle(course, outcomes, out, roster, report)
    else:
        _export_canvas(course, outcomes, out, roster, report, dict(assignment_ids or {}))
    report.written += complete_nbgrader_feedback(course)
    for item in unplaced_files(course, sorted({o.lab for o in outcomes})):
        lms_id = f" (LMS id {item['lms_id']})" if item.get("lms_id") else ""
        report.left_out.append(
            f"{item['lms']} {item['lab']}: file {item['file']!r}{lms_id} is no student's: "
            f"{item.get('reason', '')}"
        )
    return report

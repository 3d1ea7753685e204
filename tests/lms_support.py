"""A synthetic class for the LMS tests: a roster, LMS archives and a graded term without a kernel.

The archives follow each LMS's download naming (:mod:`transformer_lab.grading.lms`); the
graded term is written through nbgrader's Gradebook API and ``labs grade``'s own report
writer, with the checks' verdicts (named mistakes from the kit's catalogue) filled in the way
the grader records them (``SubmissionResult.verdicts``).
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import json
import warnings
import zipfile
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook
from sqlalchemy.exc import SAWarning

from transformer_lab.grading.course import grading_env
from transformer_lab.grading.grade import REPORT, SubmissionResult, _append_report

REPO = Path(__file__).resolve().parents[1]
LAB1, LAB2, LAB5 = "01_positional_encoding", "02_self_attention", "05_masking"
LABS = (LAB1, LAB2, LAB5)
FIRST = "Ada Alan Barbara Claude Donald Edsger Frances Grace Hedy John Katherine Leslie"
LAST = "Lovelace Turing Liskov Shannon Knuth Dijkstra Allen Hopper Lamarr Backus Johnson Lamport"
#: id, first name, last name, email, Canvas user id (the roster's lms_id), Moodle participant.
STUDENTS = [
    (
        f"s{i:02d}",
        FIRST.split()[i % 12],
        LAST.split()[(i * 5) % 12] + ("" if i < 12 else "-Jr"),
        f"s{i:02d}@uni.example",
        str(40000 + i),
        str(900 + i),
    )
    for i in range(1, 21)
]
# A name with an accent: LMS downloads carry them.
STUDENTS[2] = ("s03", "José", "Núñez", "s03@uni.example", "40003", "903")
MOODLE_IDS = {s[0]: s[5] for s in STUDENTS}


def write_roster(path: Path) -> Path:
    """nbgrader's ``db student import`` CSV plus the kit's ``lms_id`` (Canvas user ids here)."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "first_name", "last_name", "email", "lms_id"])
        for sid, first, last, email, canvas, _ in STUDENTS:
            writer.writerow([sid, first, last, email, canvas])
    return path


def release_text(lab: str) -> str:
    return (REPO / "labs" / lab / f"{lab}.ipynb").read_text()


def colab_copy(lab: str) -> str:
    """The release after a Colab round trip: cell metadata partly lost (still recognised)."""
    nb = nbformat.read(str(REPO / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    for i, cell in enumerate(nb.cells):
        if i % 3 == 0:
            cell.metadata.pop("nbgrader", None)
        cell.metadata["colab"] = {"base_uri": "https://localhost:8080/"}
    return nbformat.writes(nb)


def student(sid: str) -> tuple[str, str, str, str, str, str]:
    return next(s for s in STUDENTS if s[0] == sid)


def full_name(sid: str) -> str:
    s = student(sid)
    return f"{s[1]} {s[2]}"


def canvas_name(sid: str) -> str:
    """Canvas squashes the sortable name ("Núñez, José") into lower-case letters."""
    import unicodedata

    s = student(sid)
    plain = unicodedata.normalize("NFKD", s[2] + s[1]).encode("ascii", "ignore").decode()
    return "".join(c for c in plain.lower() if c.isalnum())


def write_zip(path: Path, members: list[tuple[str, str | bytes, tuple[int, ...]]]) -> Path:
    """A zip whose entries carry the given modification times (as an LMS writes them)."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, data, when in members:
            zf.writestr(zipfile.ZipInfo(name, date_time=when), data)
    return path


def tree_hashes(path: Path) -> dict[str, str]:
    """sha256 of a file, or of every file under a folder (to show nothing was modified)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


# --------------------------------------------------------------------------------------
# A graded term without kernels
# --------------------------------------------------------------------------------------


def lab_cells(lab: str) -> list[tuple[str, str, float]]:
    """(grade id, cell type, points) of every graded cell of a lab's release."""
    nb = json.loads(release_text(lab))
    return [
        (
            c["metadata"]["nbgrader"]["grade_id"],
            c["cell_type"],
            float(c["metadata"]["nbgrader"]["points"]),
        )
        for c in nb["cells"]
        if c["metadata"].get("nbgrader", {}).get("grade")
    ]


def declare_lab(gb: Gradebook, lab: str) -> None:
    """The lab's graded cells in the gradebook, as ``GenerateAssignment`` records them."""
    gb.update_or_create_assignment(lab)
    gb.update_or_create_notebook(lab, lab)
    for gid, kind, points in lab_cells(lab):
        gb.update_or_create_grade_cell(gid, lab, lab, max_score=points, cell_type=kind)
        if kind == "markdown":
            gb.update_or_create_solution_cell(gid, lab, lab)


#: (lab, test cells, named mistake, checks' message) from the kit's catalogue of mistakes.
MISTAKES = {
    "swapped": (
        LAB1,
        ("test_sinusoidal_encoding_values", "test_sinusoidal_encoding_hidden"),
        "sin and cos swapped",
        "Your sin and cos are swapped: even columns 2i hold sin and odd columns 2i+1 hold cos.",
    ),
    "from1": (
        LAB1,
        ("test_sinusoidal_encoding_values",),
        "positions start at 1",
        "Your positions start at 1; count them from 0.",
    ),
    "dim": (
        LAB2,
        ("test_softmax_visible", "test_softmax_hidden"),
        "softmax over the wrong dim",
        "It matches a softmax over dim=0 instead of dim=-1.",
    ),
    "diagonal": (
        LAB5,
        ("test_causal_mask", "test_causal_mask_hidden"),
        "the mask leaves out the diagonal",
        "Your mask hides each position from itself: a token may attend to itself.",
    ),
}
#: who made which mistake.
WHO = {
    "swapped": ["s02", "s04", "s06", "s10", "s11"],
    "from1": ["s12", "s13", "s14"],
    "dim": ["s03", "s05", "s15", "s16"],
    "diagonal": ["s01", "s02", "s03", "s04", "s17", "s18"],
}
#: (student, lab) -> status other than graded, with its reason.
SPECIAL = {
    ("s07", LAB2): ("flagged", "student code: assignment to transformer_lab.checks"),
    ("s08", LAB5): ("incomplete", "cell 12 (test_masked_attention): CellTimeoutError"),
    ("s09", LAB5): ("crashed", "cell 9: DeadKernelError: the kernel died"),
    ("s19", LAB1): ("unmatched", "not a readable notebook: Notebook does not appear to be JSON"),
}
MISSING = {("s20", LAB5)}
DEADLINE = dt.datetime(2026, 10, 2, 23, 59, 59, tzinfo=dt.timezone.utc)


def graded_term(course: Path, students: list[str] | None = None) -> list[SubmissionResult]:
    """Write a whole class's gradebook, grading report and feedback pages for labs 01, 02, 05.

    Written answers get a manual grade of 1 point each for even-numbered students (as if
    entered in formgrader) and stay ungraded for the others.
    """
    ids = students or [s[0] for s in STUDENTS]
    results: list[SubmissionResult] = []
    with (
        grading_env(),
        warnings.catch_warnings(),
        Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb,
    ):
        warnings.filterwarnings("ignore", category=SAWarning)  # nbgrader's autoflush noise
        for lab in LABS:
            declare_lab(gb, lab)
        for sid in ids:
            gb.update_or_create_student(sid)
            for lab in LABS:
                if (sid, lab) in MISSING:
                    continue
                results.append(_one(gb, course, sid, lab))
        gb.db.commit()
    run = {"run": "synthetic", "results": [r.to_json() for r in results]}
    _append_report(course / REPORT, run)
    return results


def _one(gb: Gradebook, course: Path, sid: str, lab: str) -> SubmissionResult:
    status, reason = SPECIAL.get((sid, lab), ("graded", ""))
    wrong: dict[str, tuple[str, str]] = {}
    for key, people in WHO.items():
        mlab, cells, name, message = MISTAKES[key]
        if mlab == lab and sid in people:
            wrong |= {gid: (name, message) for gid in cells}
    cell_scores, verdicts = {}, {}
    for gid, kind, points in lab_cells(lab):
        if kind != "code":
            continue
        score = 0.0 if gid in wrong or status in ("flagged", "unmatched") else points
        if status in ("incomplete", "crashed") and "masked_attention" in gid:
            score = 0.0
        cell_scores[gid] = [score, points]
        mistake, message = wrong.get(gid, (None, ""))
        verdicts[gid] = {
            "score": score,
            "max_score": points,
            "mistake": mistake,
            "message": message,
        }
    result = SubmissionResult(sid, lab, status, cell_scores=cell_scores, verdicts=verdicts)
    if status == "flagged":
        result.flags = [reason]
    elif status in ("incomplete", "crashed"):
        result.problems = [reason]
    elif status == "unmatched":
        result.error = reason
        return result
    late = sid == "s05" and lab == LAB1
    when = DEADLINE + dt.timedelta(hours=5 if late else -30)
    sub = gb.add_submission(lab, sid, timestamp=when.replace(tzinfo=None))
    manual = int(sid[1:]) % 2 == 0
    for notebook in sub.notebooks:
        notebook.flagged = status == "flagged"
        for grade in notebook.grades:
            if grade.cell_type == "code":
                grade.auto_score = cell_scores[grade.name][0]
                grade.needs_manual_grade = False
            else:
                grade.manual_score = 1.0 if manual else None
                grade.needs_manual_grade = not manual
        for comment in notebook.comments:
            if manual:
                comment.manual_comment = "Good intuition; say what the softmax does at -inf."
    folder = course / "submitted" / sid / lab
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "timestamp.txt").is_file():  # collect's, where it placed this one
        (folder / "timestamp.txt").write_text(when.replace(tzinfo=None).isoformat(" ") + "\n")
    page = course / "feedback" / sid / lab / f"{lab}.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(f"<html><body><h1>{lab}, {sid}</h1></body></html>\n")
    return result

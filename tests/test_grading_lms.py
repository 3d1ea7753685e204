"""LMS archives in, grades and feedback out, and the class report: a synthetic term, no kernels.

Archives in each LMS's download naming (Moodle, Canvas, Blackboard, Google Classroom) with
late, duplicate, misnamed and broken submissions go through ``collect``; the class's grading
is then written through nbgrader's Gradebook API with the checks' verdicts (the real grader
runs in ``test_grading_lms_pipeline.py``); ``report`` and ``export`` read it back.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import re
import zipfile
from pathlib import Path

import pytest
from lms_support import (
    LAB1,
    LAB2,
    LAB5,
    MOODLE_IDS,
    REPO,
    STUDENTS,
    canvas_name,
    colab_copy,
    full_name,
    graded_term,
    release_text,
    tree_hashes,
    write_roster,
    write_zip,
)
from nbgrader.api import Gradebook
from nbgrader.coursedir import CourseDirectory

from transformer_lab.grading.cli import main
from transformer_lab.grading.course import GradingError
from transformer_lab.grading.export import CANVAS_COLUMNS, MOODLE_COLUMNS, export_grades
from transformer_lab.grading.lms import FORMATS, Roster, collect
from transformer_lab.grading.report import write_report
from transformer_lab.grading.rubrics import add_rubrics

T1 = (2026, 10, 1, 12, 0, 0)
T2 = (2026, 10, 2, 9, 30, 0)


def _moodle(sid: str, file: str, folders: bool = True) -> str:
    base = f"{full_name(sid)}_{MOODLE_IDS[sid]}_assignsubmission_file_"
    return f"{base}/{file}" if folders else f"{base}{file}"


def moodle_archive(path: Path) -> Path:
    """Lab 01 from Moodle: good, misnamed, flat, not a notebook, nested zip, other lab, ..."""
    lab = release_text(LAB1)
    members = [(_moodle(sid, f"{LAB1}.ipynb"), lab, T1) for sid in ("s01", "s03", "s04", "s05")]
    members += [
        (_moodle("s02", "my lab (final).ipynb"), colab_copy(LAB1), T1),  # misnamed, via Colab
        (_moodle("s06", f"{LAB1}.ipynb", folders=False), lab, T2),  # Moodle without folders
        (_moodle("s08", "notes.txt"), "my notes", T1),
        (_moodle("s09", "work.zip"), b"PK\x05\x06" + b"\0" * 18, T1),
        (_moodle("s10", f"{LAB2}.ipynb"), release_text(LAB2), T1),
        (f"Mallory Unknown_999_assignsubmission_file_/{LAB1}.ipynb", lab, T1),
        (_moodle("s11", "a.ipynb"), lab, T1),
        (_moodle("s11", "b.ipynb"), colab_copy(LAB1), T1),
        (_moodle("s12", f"{LAB1}.ipynb"), "{ this is not json", T1),  # broken
        (f"{full_name('s13')}_913_assignsubmission_onlinetext_onlinetext.html", "<p>hi</p>", T1),
        ("README.txt", "downloaded from Moodle", T1),
    ]
    return write_zip(path, members)


@pytest.fixture
def roster(tmp_path: Path) -> Roster:
    return Roster.read(write_roster(tmp_path / "roster.csv"))


def test_moodle_archive_placed_with_reasons_and_times(tmp_path: Path, roster: Roster) -> None:
    archive = moodle_archive(tmp_path / "moodle.zip")
    before = tree_hashes(archive)
    course = tmp_path / "course"
    report = collect(archive, lms="moodle", lab="01", course=course, repo=REPO, roster=roster)
    assert tree_hashes(archive) == before, "the LMS archive was modified"
    placed = {f.student: f for f in report.placed}
    assert sorted(placed) == ["s01", "s02", "s03", "s04", "s05", "s06", "s12"]
    for sid in placed:
        assert (course / "submitted" / sid / LAB1 / f"{LAB1}.ipynb").is_file()
    assert placed["s12"].reason.startswith("placed, but not a readable notebook")
    assert placed["s03"].full_name == "José Núñez" and placed["s03"].lms_id == "903"
    reasons = {f.file: f.reason for f in report.skipped}
    assert len(reasons) == 8, reasons
    want = {
        "notes.txt": "not a notebook",
        "work.zip": "an archive inside the archive",
        f"{LAB2}.ipynb": f"a notebook of lab {LAB2}",
        "Mallory Unknown": "unknown student",
        "a.ipynb": "two notebooks",
        "b.ipynb": "two notebooks",
        "onlinetext.html": "not a notebook",
        "README.txt": "does not follow moodle",
    }
    for fragment, reason in want.items():
        (found,) = [r for f, r in reasons.items() if fragment in f]
        assert reason in found, (fragment, found)
    # The submission time is kept as nbgrader's timestamp.txt (what Autograde reads).
    coursedir = CourseDirectory(root=str(course))
    stamp = coursedir.get_existing_timestamp(str(course / "submitted" / "s06" / LAB1))
    assert stamp == dt.datetime(*T2)
    assert placed["s06"].time_source == "archive entry"
    record = json.loads(report.record.read_text())
    assert record["students"]["s01"]["lms_id"] == "901"


def test_canvas_late_accents_and_unknown(tmp_path: Path, roster: Roster) -> None:
    lab = release_text(LAB2)
    members = [
        (f"{canvas_name('s03')}_40003_7001_{LAB2}.ipynb", lab, T1),  # Núñez, José -> nunezjose
        (f"{canvas_name('s05')}_late_40005_7002_{LAB2}-1.ipynb", lab, T2),  # late, re-uploaded
        (f"zed_49999_7003_{LAB2}.ipynb", lab, T1),
        (f"{canvas_name('s06')}_40006_7004_{LAB1}.ipynb", release_text(LAB1), T1),
    ]
    archive = write_zip(tmp_path / "submissions.zip", members)
    course = tmp_path / "course"
    report = collect(archive, lms="canvas", lab=LAB2, course=course, repo=REPO, roster=roster)
    placed = {f.student: f for f in report.placed}
    assert sorted(placed) == ["s03", "s05"]
    assert placed["s05"].late and placed["s05"].lms_id == "40005"
    assert placed["s05"].prefix == f"{canvas_name('s05')}_late_40005_7002_"
    skipped = {f.file: f.reason for f in report.skipped}
    assert "unknown student" in skipped[f"zed_49999_7003_{LAB2}.ipynb"]
    assert f"a notebook of lab {LAB1}" in skipped[f"{canvas_name('s06')}_40006_7004_{LAB1}.ipynb"]


def test_blackboard_attempts_keep_the_newest(tmp_path: Path, roster: Roster) -> None:
    lab = release_text(LAB5)
    early, late = "2026-10-01-09-00-00", "2026-10-02-21-15-00"
    members = []
    for when in (early, late):
        members += [
            (f"Lab 5_s01_attempt_{when}_{LAB5}.ipynb", lab, T1),
            (f"Lab 5_s01_attempt_{when}.txt", "Name: Ada Turing (s01)\n", T1),
        ]
    members.append((f"Lab 5_s02_attempt_{early}_masking.ipynb", colab_copy(LAB5), T1))
    archive = write_zip(tmp_path / "gradebook_lab5.zip", members)
    course = tmp_path / "course"
    report = collect(
        archive, lms="blackboard", lab=LAB5, course=course, repo=REPO, roster=roster,
        timezone="Europe/Berlin",
    )  # fmt: skip
    placed = {f.student: f for f in report.placed}
    assert sorted(placed) == ["s01", "s02"]
    assert late in placed["s01"].file and placed["s01"].time_source == "file name"
    # 21:15 in Berlin (CEST, UTC+2) is 19:15 UTC, in nbgrader's timestamp.txt.
    text = (course / "submitted" / "s01" / LAB5 / "timestamp.txt").read_text().strip()
    assert text == "2026-10-02 19:15:00"
    reasons = [f.reason for f in report.skipped]
    assert any("older attempt" in r for r in reasons) and len(reasons) == 1
    # Blackboard's receipts are read for nothing, not counted as files not placed.
    assert [f.kind for f in report.files].count("receipt") == 2
    assert "2 placed, 1 not placed, 2 Blackboard receipt(s) read for nothing" in report.table()


def test_recollecting_never_overwrites_silently(tmp_path: Path, roster: Roster) -> None:
    course = tmp_path / "course"
    first = write_zip(
        tmp_path / "moodle.zip",
        [(_moodle(sid, f"{LAB1}.ipynb"), release_text(LAB1), T2) for sid in ("s01", "s03", "s04")],
    )
    collect(first, lms="moodle", lab=LAB1, course=course, repo=REPO, roster=roster)
    old_s01 = (course / "submitted" / "s01" / LAB1 / f"{LAB1}.ipynb").read_bytes()
    # Google Classroom: a Drive folder, already unpacked; times are the files' mtimes.
    drive = tmp_path / "Lab 1 (Drive)"
    drive.mkdir()
    files = {
        f"{full_name('s01')} - {LAB1}.ipynb": (colab_copy(LAB1), "2026-10-03 08:00"),  # newer
        f"{full_name('s03')} - {LAB1}.ipynb": (colab_copy(LAB1), "2026-09-30 08:00"),  # older
        f"{full_name('s04')} - {LAB1}.ipynb": (release_text(LAB1), "2026-10-03 08:00"),  # same
        f"{LAB1} - {full_name('s05')}.ipynb": (release_text(LAB1), "2026-10-01 08:00"),  # reversed
    }
    for name, (text, when) in files.items():
        (drive / name).write_text(text)
        stamp = dt.datetime.fromisoformat(when).replace(tzinfo=dt.timezone.utc).timestamp()
        os.utime(drive / name, (stamp, stamp))
    before = tree_hashes(drive)
    report = collect(drive, lms="classroom", lab=LAB1, course=course, repo=REPO, roster=roster)
    assert tree_hashes(drive) == before
    actions = {f.student: f.action for f in report.files}
    assert actions == {"s01": "replaced", "s03": "skipped", "s04": "unchanged", "s05": "placed"}
    moved = list((course / "lms" / "superseded" / "s01" / LAB1).glob(f"*/{LAB1}.ipynb"))
    assert len(moved) == 1 and moved[0].read_bytes() == old_s01, "the older one must be kept"
    (s03,) = [f for f in report.files if f.student == "s03"]
    assert "already holds a submission" in s03.reason
    assert (course / "submitted" / "s03" / LAB1 / f"{LAB1}.ipynb").read_text() == release_text(LAB1)


def test_bad_input_is_named(tmp_path: Path) -> None:
    with pytest.raises(GradingError, match="ilias"):
        collect(tmp_path, lms="ilias", lab=LAB1, course=tmp_path / "c", repo=REPO)
    (tmp_path / "x.zip").write_text("not a zip")
    with pytest.raises(GradingError, match="not a zip"):
        collect(tmp_path / "x.zip", lms="moodle", lab=LAB1, course=tmp_path / "c", repo=REPO)
    evil = write_zip(tmp_path / "evil.zip", [("../escape.ipynb", release_text(LAB1), T1)])
    with pytest.raises(GradingError, match=r"could not extract .*escape\.ipynb"):
        collect(evil, lms="moodle", lab=LAB1, course=tmp_path / "c", repo=REPO)
    assert not (tmp_path / "escape.ipynb").exists()
    (tmp_path / "r.csv").write_text("name,email\nA,a@x\n")
    with pytest.raises(GradingError, match="no 'id' column"):
        Roster.read(tmp_path / "r.csv")


# --------------------------------------------------------------------------------------
# A whole term: collect -> (synthetic) grade -> report -> export
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def term(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """20 students, labs 01 (Moodle), 02 (Canvas), 05 (Blackboard), graded synthetically."""
    base = tmp_path_factory.mktemp("term")
    course = base / "course"
    roster_csv = write_roster(base / "roster.csv")
    ids = [s[0] for s in STUDENTS]
    moodle = write_zip(
        base / "moodle-lab01.zip",
        [(_moodle(sid, f"{LAB1}.ipynb"), release_text(LAB1), T1) for sid in ids],
    )
    canvas = write_zip(
        base / "canvas-lab02.zip",
        [
            (f"{canvas_name(s)}_{s_lms}_{7000 + i}_{LAB2}.ipynb", release_text(LAB2), T1)
            for i, (s, *_, s_lms, _m) in enumerate(STUDENTS)
        ],
    )
    blackboard = write_zip(
        base / "bb-lab05.zip",
        [
            (f"Lab 5_{sid}_attempt_2026-10-02-10-00-00_{LAB5}.ipynb", release_text(LAB5), T1)
            for sid in ids
            if sid != "s20"
        ],
    )
    archives = {"moodle": moodle, "canvas": canvas, "blackboard": blackboard}
    hashes = {k: tree_hashes(v) for k, v in archives.items()}
    for lms, lab in (("moodle", LAB1), ("canvas", LAB2), ("blackboard", LAB5)):
        code = main(
            ["collect", str(archives[lms]), "--lms", lms, "--lab", lab, "--course", str(course),
             "--roster", str(roster_csv)]
        )  # fmt: skip
        assert code == 0
    for lms, path in archives.items():
        assert tree_hashes(path) == hashes[lms], f"the {lms} archive was modified"
    graded_term(course)
    return {"course": course, "roster": roster_csv, "base": base}


def test_term_report(term: dict[str, Path]) -> None:
    course = term["course"]
    files = write_report(course)
    page = files[0].read_text()
    assert "<link" not in page and not re.search(r"""src=["'](?!data:)""", page)
    assert page.count("data:image/png;base64,") == 3
    assert "<b>the mask leaves out the diagonal</b>: 6 of 19 students" in page
    assert "<b>sin and cos swapped</b>: 5 of 20 students" in page
    # Each named mistake links to those students' feedback pages, which exist.
    hrefs = re.findall(r'href="([^"]+)"', page)
    assert hrefs and all((files[0].parent / h).resolve().is_file() for h in hrefs)
    assert f"../feedback/s17/{LAB5}/{LAB5}.html" in hrefs
    out = files[0].parent
    mistakes = list(_read_csv(out / "mistakes.csv"))
    diagonal = [m for m in mistakes if m["mistake"] == "the mask leaves out the diagonal"]
    assert len(diagonal) == 1 and diagonal[0]["students"] == "6" and diagonal[0]["of"] == "19"
    assert diagonal[0]["student_ids"] == "s01 s02 s03 s04 s17 s18"
    assert diagonal[0]["test_cells"] == "test_causal_mask test_causal_mask_hidden"
    attention = {(r["student"], r["lab"]): r for r in _read_csv(out / "attention.csv")}
    assert set(attention) == {("s07", LAB2), ("s08", LAB5), ("s09", LAB5), ("s19", LAB1)}
    assert "assignment to transformer_lab.checks" in attention[("s07", LAB2)]["reasons"]
    scores = {r["lab"]: r for r in _read_csv(out / "scores.csv")}
    assert scores[LAB5]["missing"] == "1" and scores[LAB5]["submitted"] == "19"
    assert scores[LAB1]["unmatched"] == "1"
    progress = {r["student"]: r for r in _read_csv(out / "progress.csv")}
    assert progress["s20"][LAB5] == "" and progress["s20"][f"{LAB5} status"] == "missing"
    cells = {(r["lab"], r["test_cell"]): r for r in _read_csv(out / "cells.csv")}
    assert cells[(LAB5, "test_causal_mask")]["zero"] == "6"


def test_report_without_verdicts_falls_back_to_cell_scores(term: dict[str, Path], tmp_path) -> None:
    data = json.loads((term["course"] / "grading_report.json").read_text())
    for record in data["latest"].values():
        record.pop("verdicts", None)
    course = tmp_path / "course"
    course.mkdir()
    (course / "grading_report.json").write_text(json.dumps(data))
    (course / "gradebook.db").write_bytes((term["course"] / "gradebook.db").read_bytes())
    page = write_report(course)[0].read_text()
    assert "No named mistakes recorded (these grading records carry per-cell scores only)" in page
    cells = list(_read_csv(course / "report" / "cells.csv"))
    assert any(r["test_cell"] == "test_causal_mask" and r["zero"] == "6" for r in cells)


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_term_moodle_export(term: dict[str, Path]) -> None:
    course, out = term["course"], term["base"] / "moodle-out"
    roster = Roster.read(term["roster"])
    deadline = dt.datetime(2026, 10, 1, 10, tzinfo=dt.timezone.utc)  # collected at T1: 2 h late
    done = export_grades(
        course, "moodle", out, labs=[LAB1], roster=roster, deadlines={LAB1: deadline}
    )
    sheet = out / f"moodle-{LAB1}-grades.csv"
    assert sheet in done.written
    assert next(csv.reader(io.StringIO(sheet.read_text()))) == MOODLE_COLUMNS
    rows = {r["Identifier"]: r for r in _read_csv(sheet)}
    assert len(rows) == 20
    s02 = rows[f"Participant {MOODLE_IDS['s02']}"]
    # s02: sin/cos swapped (-4 of 12 autograded points), written answers graded by hand 3 x 1.
    assert s02["Grade"] == "11" and s02["Maximum Grade"] == "18"
    assert "written answers 3/6" in s02["Feedback comments"]
    assert s02["Status"] == "graded; late by 2.0 h"
    assert s02["Last modified (submission)"] == "Thursday, 1 October 2026, 12:00 PM"
    s19 = rows[f"Participant {MOODLE_IDS['s19']}"]
    assert s19["Grade"] == "" and s19["Status"].startswith("unmatched")
    assert "not a readable notebook" in s19["Feedback comments"]
    s05 = rows[f"Participant {MOODLE_IDS['s05']}"]
    assert s05["Full name"] == full_name("s05") and s05["Email address"] == "s05@uni.example"
    # Feedback zip: Moodle's own naming, which its importer (and our collector) parses back.
    with zipfile.ZipFile(out / f"moodle-{LAB1}-feedback.zip") as zf:
        names = zf.namelist()
    assert len(names) == 19
    for name in names:
        found = re.match(FORMATS["moodle"].named_regexp, name)
        assert found and found.group("plugin") == "file", name
    assert f"{full_name('s03')}_903_assignsubmission_file_{LAB1}_feedback.html" in names
    # nbgrader's own layout for JupyterHub: timestamp.txt beside each feedback page.
    assert (course / "feedback" / "s01" / LAB1 / "timestamp.txt").is_file()


def test_term_canvas_export(term: dict[str, Path]) -> None:
    course, out = term["course"], term["base"] / "canvas-out"
    roster = Roster.read(term["roster"])
    done = export_grades(
        course, "canvas", out, roster=roster, assignment_ids={LAB1: "101", LAB2: "102", LAB5: "105"}
    )
    # One import per lab; a row only where a grade is exported (Canvas's importer clears a
    # grade for a blank cell): the flagged, unmatched and missing have none.
    sheets = {lab: out / f"canvas-{lab}-grades.csv" for lab in (LAB1, LAB2, LAB5)}
    for lab, number in ((LAB1, "101"), (LAB2, "102"), (LAB5, "105")):
        with open(sheets[lab], newline="") as handle:
            assert next(csv.reader(handle)) == [*CANVAS_COLUMNS, f"{lab} ({number})"]
    rows = {lab: _read_csv(path) for lab, path in sheets.items()}
    assert rows[LAB5][0]["Student"] == "Points Possible" and rows[LAB5][0][f"{LAB5} (105)"] == "29"
    people = {lab: {r["ID"]: r for r in found[1:]} for lab, found in rows.items()}
    assert len(people[LAB1]) == 19 and "40019" not in people[LAB1]  # s19 unmatched
    assert len(people[LAB2]) == 19 and "40007" not in people[LAB2]  # s07 flagged: withheld
    assert len(people[LAB5]) == 19 and "40020" not in people[LAB5]  # s20 handed in nothing
    assert all(r[f"{LAB5} (105)"] != "" for r in people[LAB5].values())
    assert people[LAB2]["40003"]["Student"] == "Núñez, José"
    status = {(r["ID"], r["assignment"]): r for r in _read_csv(out / "canvas-status.csv")}
    assert status[("40007", f"{LAB2} (102)")]["status"] == "flagged"
    assert "No grade exported" in status[("40007", f"{LAB2} (102)")]["comment"]
    assert status[("40008", f"{LAB5} (105)")]["status"] == "incomplete"
    # One zip per lab, for the lab collected from Canvas (02): the download's prefixes, which
    # carry the attachment id Canvas's re-upload needs; the other labs' pages are named.
    assert sorted(p.name for p in out.glob("*.zip")) == [f"canvas-{LAB2}-feedback.zip"]
    with zipfile.ZipFile(out / f"canvas-{LAB2}-feedback.zip") as zf:
        names = zf.namelist()
    assert len(names) == 20
    assert f"{canvas_name('s01')}_40001_7000_{LAB2}_feedback.html" in names
    for name in names:
        assert re.match(FORMATS["canvas"].named_regexp, name), name
    assert any(
        line.startswith(f"canvas {LAB1}: s01's feedback page is in no zip")
        for line in done.left_out
    )


def test_manual_grades_in_both_exports(term: dict[str, Path], tmp_path: Path) -> None:
    """A grade entered by hand (as formgrader stores it) shows in both exports."""
    course = term["course"]
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        grade = gb.find_grade("written_fp16", LAB5, LAB5, "s11")
        grade.manual_score = 2.0
        grade.needs_manual_grade = False
        gb.db.commit()
        total = float(gb.find_submission(LAB5, "s11").score)
    roster = Roster.read(term["roster"])
    export_grades(course, "canvas", tmp_path / "c", roster=roster)
    export_grades(course, "moodle", tmp_path / "m", roster=roster, labs=[LAB1])
    canvas = {r["ID"]: r for r in _read_csv(tmp_path / "c" / f"canvas-{LAB5}-grades.csv")}
    assert float(canvas["40011"][LAB5]) == total
    assert "written answers 2/" in next(
        r["comment"] for r in _read_csv(tmp_path / "c" / "canvas-status.csv")
        if r["ID"] == "40011" and r["assignment"] == LAB5
    )  # fmt: skip


def test_cli_report_and_export(term: dict[str, Path], capsys) -> None:
    out = term["base"] / "cli-out"
    assert main(["report", "--course", str(term["course"]), "01", "05", "--out", str(out)]) == 0
    assert (out / "index.html").is_file()
    assert f"{LAB2}" not in (out / "scores.csv").read_text()
    code = main(
        ["export", "--lms", "canvas", "--course", str(term["course"]), "--out", str(out),
         "--canvas-assignment", "02=102", "--roster", str(term["roster"])]
    )  # fmt: skip
    assert code == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["export", "--lms", "canvas", "--course", str(term["course"]), "--out",
                 str(out), "--canvas-assignment", "02=abc"]) == 2  # fmt: skip


def test_export_refuses_out_inside_submitted(term: dict[str, Path]) -> None:
    with pytest.raises(GradingError, match="inside submitted"):
        export_grades(term["course"], "moodle", term["course"] / "submitted" / "x")


def test_collect_cli_reports_and_exits_1(tmp_path: Path, capsys) -> None:
    archive = moodle_archive(tmp_path / "moodle.zip")
    roster = write_roster(tmp_path / "roster.csv")
    code = main(["collect", str(archive), "--lms", "moodle", "--lab", "01", "--course",
                 str(tmp_path / "c"), "--roster", str(roster)])  # fmt: skip
    text = capsys.readouterr().out
    assert code == 1
    assert "7 placed, 8 not placed" in text and "an archive inside the archive" in text
    assert io.StringIO(text).read().count("skipped") == 8


def test_rubrics_beside_written_answers_for_formgrader(tmp_path: Path) -> None:
    course = tmp_path / "course"
    target = course / "autograded" / "s01" / LAB1 / f"{LAB1}.ipynb"
    target.parent.mkdir(parents=True)
    target.write_text(release_text(LAB1))
    assert add_rubrics(course, REPO) == [target]
    assert add_rubrics(course, REPO) == [], "a second run adds nothing"
    cells = json.loads(target.read_text())["cells"]
    ids = [c["metadata"].get("nbgrader", {}).get("grade_id") for c in cells]
    for gid in ("written_small_base", "written_relative_offset", "written_extrapolation"):
        rubric = cells[ids.index(gid) + 1]
        assert rubric["metadata"] == {"transformer_lab": {"rubric_for": gid}}
        assert "Model answer and rubric" in "".join(rubric["source"])


def test_a_colab_notebooks_repairs_are_one_line_of_the_grade_table(tmp_path: Path) -> None:
    from transformer_lab.grading.grade import GradeReport, SubmissionResult

    result = SubmissionResult("s01", LAB1, "graded", auto_score=12.0, auto_max=12.0)
    result.repairs = [f"restored the lost metadata of cell {i}" for i in range(24)]
    text = GradeReport(tmp_path, [result], tmp_path / "g.csv", tmp_path, "bwrap", "r").table()
    (line,) = [line for line in text.splitlines() if "repaired" in line]
    assert line.strip().startswith("repaired: 24 cell(s) matched to the release")


def test_report_is_readable_at_a_laptops_width(term: dict[str, Path], tmp_path: Path) -> None:
    """Headless Chromium at 1280 px: every table fits, names beside ids, points apart."""
    import importlib.util

    chromium = Path("/usr/bin/chromium")
    if not chromium.is_file() or importlib.util.find_spec("playwright") is None:
        pytest.skip(f"needs {chromium} and the playwright package")
    from playwright.sync_api import sync_playwright

    page_path = write_report(term["course"], out=tmp_path / "report")[0]
    with sync_playwright() as play:
        browser = play.chromium.launch(executable_path=str(chromium), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(page_path.as_uri())
        widths = page.evaluate(
            "() => [document.documentElement.scrollWidth,"
            " ...[...document.querySelectorAll('table')].map(t => t.getBoundingClientRect().right)]"
        )
        text = page.inner_text("body")
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        browser.close()
    assert max(widths) <= 1280, widths
    assert "20 students (1 handed in nothing for some lab), 0 file(s) placed for no student" in text
    # Names beside ids; autograded and written points apart (s02: 3 written answers by hand).
    assert "s03\tJosé Núñez" in text
    assert "8/12 + 3/6 written" in text and "12/12 + 0/6 written (3 to grade)" in text
    assert (tmp_path / "report.png").stat().st_size > 0

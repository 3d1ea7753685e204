"""``labs collect --lms classroom --drive-listing``: Classroom files placed by their Drive owner.

A Classroom download names no uploader; the Drive API's ``files.list`` of the assignment
folder does (``owners[].emailAddress``). The download here is built as Drive builds it: a zip
of the folder (entries under the folder's name) whose files of one name become ``<name>
(1).<ext>``, ``(2)``; the listing is the JSON ``files.list`` answers with ``fields=files(id,
name,owners(emailAddress,displayName),modifiedTime,md5Checksum)``.
"""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pytest
from lms_support import LAB1, REPO, release_text, write_zip

from transformer_lab.grading.cli import main
from transformer_lab.grading.course import GradingError
from transformer_lab.grading.lms import Roster, collect

T1 = (2026, 10, 1, 12, 0, 0)
CLASS = [
    ("a01", "Ada", "Lovelace"),
    ("a02", "José", "Núñez"),
    ("a03", "伟", "张"),
    ("a04", "Seán", "O'Brien"),
    ("a05", "Mallory", "Evil"),
    ("a06", "Grace", "Hopper"),
]
NOTEBOOK = f"{LAB1}.ipynb"


def roster(path: Path) -> Path:
    """Emails ``aNN@uni.example``; a06's Google account is given as ``lms_id`` instead."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "first_name", "last_name", "email", "lms_id"])
        for sid, first, last in CLASS:
            email, lms_id = f"{sid}@uni.example", ""
            if sid == "a06":
                email, lms_id = "grace@home.example", "ghopper@uni.example"
            writer.writerow([sid, first, last, email, lms_id])
    return path


def notebook(variant: int) -> str:
    """Lab 01's release, its bytes made distinct (each student's own copy)."""
    return release_text(LAB1) + "\n" * variant


#: Drive name, owner, content, time; files of one name as Drive lists them (any order).
DRIVE = [
    (NOTEBOOK, "a02@uni.example", notebook(2), "2026-10-01T09:00:00.000Z"),
    (NOTEBOOK, "A03@Uni.Example", notebook(3), "2026-10-01T10:00:00.000Z"),
    (NOTEBOOK, "a01@uni.example", notebook(1), "2026-10-01T08:00:00.000Z"),
    # Mallory's upload, named after Ada: its owner is Mallory, whatever its name says.
    ("Ada Lovelace - my lab.ipynb", "a05@uni.example", notebook(5), "2026-10-01T11:00:00Z"),
    ("notes.pdf", "a04@uni.example", "%PDF-1.4", "2026-10-01T11:00:00Z"),
    ("extra.ipynb", "stranger@gmail.com", notebook(7), "2026-10-01T11:00:00Z"),
    ("first.ipynb", "ghopper@uni.example", notebook(8), "2026-10-01T11:00:00Z"),
    ("second.ipynb", "ghopper@uni.example", notebook(9), "2026-10-01T12:00:00Z"),
]
#: What Drive's zip calls them: one name kept, the others `` (1)``, `` (2)``.
ZIP_NAMES = [
    f"{LAB1} (1).ipynb",
    f"{LAB1} (2).ipynb",
    NOTEBOOK,
    *(name for name, *_ in DRIVE[3:]),
]


def listing(path: Path, *, md5: bool = True, pages: int = 1) -> Path:
    """A ``files.list`` answer (or several pages of it) for ``DRIVE``."""
    files = []
    for i, (name, owner, text, when) in enumerate(DRIVE):
        entry = {
            "id": f"1AbC{i}",
            "name": name,
            "owners": [{"emailAddress": owner, "displayName": owner.split("@")[0].title()}],
            "modifiedTime": when,
        }
        if md5:
            entry["md5Checksum"] = hashlib.md5(text.encode()).hexdigest()
        files.append(entry)
    if pages == 1:
        data: object = {"kind": "drive#fileList", "files": files}
    else:
        half = len(files) // 2
        data = [{"files": files[:half], "nextPageToken": "x"}, {"files": files[half:]}]
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def drive_zip(path: Path, extra: list[tuple[str, str]] = ()) -> Path:
    """The folder ``Lab 1`` as Drive's "Download" zips it (duplicates renamed, ``(1)``...)."""
    order = [2, 0, 1, 3, 4, 5, 6, 7]  # Drive's zip order is its own: not the listing's
    members = [(f"Lab 1/{ZIP_NAMES[i]}", DRIVE[j][2], T1) for i, j in enumerate(order)]
    members += [(f"Lab 1/{name}", text, T1) for name, text in extra]
    return write_zip(path, members)


def _by_file(done) -> dict[str, object]:
    return {f.file: f for f in done.files}


def test_files_are_placed_by_their_drive_owner(tmp_path: Path) -> None:
    archive = drive_zip(
        tmp_path / "Lab 1-20261005T101010Z-001.zip", extra=[("late.ipynb", notebook(11))]
    )
    r = Roster.read(roster(tmp_path / "roster.csv"))
    course = tmp_path / "course"
    done = collect(
        archive, lms="classroom", lab=LAB1, course=course, repo=REPO, roster=r,
        drive_listing=listing(tmp_path / "listing.json"),
    )  # fmt: skip
    files = _by_file(done)
    placed = {f.file: f.student for f in done.placed}
    # drive_zip wrote a01's copy as "(1)", a02's as "(2)", a03's under the name itself.
    assert placed == {
        f"Lab 1/{LAB1} (1).ipynb": "a01",
        f"Lab 1/{LAB1} (2).ipynb": "a02",
        f"Lab 1/{NOTEBOOK}": "a03",
        "Lab 1/Ada Lovelace - my lab.ipynb": "a05",
    }, done.table()
    # Each student's own copy, by content (the md5 Drive lists), at the time Drive lists.
    for sid, variant in (("a01", 1), ("a02", 2), ("a03", 3), ("a05", 5)):
        assert (course / "submitted" / sid / LAB1 / NOTEBOOK).read_text() == notebook(variant)
    assert files[f"Lab 1/{LAB1} (1).ipynb"].submitted == "2026-10-01T08:00:00+00:00"
    assert files[f"Lab 1/{LAB1} (1).ipynb"].time_source == "Drive listing"
    assert (course / "submitted" / "a01" / LAB1 / "timestamp.txt").read_text().strip() == (
        "2026-10-01 08:00:00"
    )
    # Every other file: one line, with whose it is and why it was left out.
    pdf = files["Lab 1/notes.pdf"]
    assert (pdf.student, pdf.kind) == ("a04", "not a notebook")
    stranger = files["Lab 1/extra.ipynb"]
    assert stranger.kind == "unknown student" and not stranger.student
    assert "owned in Drive by stranger@gmail.com (Stranger), who is not on the roster" in (
        stranger.reason
    )
    for name in ("first.ipynb", "second.ipynb"):
        item = files[f"Lab 1/{name}"]
        assert (item.student, item.kind) == ("a06", "ambiguous"), done.table()
        assert "all are owned by ghopper@uni.example in Drive" in item.reason
    late = files["Lab 1/late.ipynb"]
    assert late.kind == "not listed" and "not in the Drive listing listing.json" in late.reason
    assert len(done.skipped) == 5
    assert done.table().count("stranger@gmail.com") == 1


def test_without_md5_same_named_files_of_several_owners_are_nobodys(tmp_path: Path) -> None:
    archive = drive_zip(tmp_path / "drive.zip")
    r = Roster.read(roster(tmp_path / "roster.csv"))
    done = collect(
        archive, lms="classroom", lab=LAB1, course=tmp_path / "course", repo=REPO, roster=r,
        drive_listing=listing(tmp_path / "listing.json", md5=False, pages=2),
    )  # fmt: skip
    files = _by_file(done)
    for name in (NOTEBOOK, f"{LAB1} (1).ipynb", f"{LAB1} (2).ipynb"):
        item = files[f"Lab 1/{name}"]
        assert item.action == "skipped" and item.kind == "ambiguous" and not item.student
        assert "a01@uni.example, a02@uni.example, a03@uni.example" in item.reason
        assert "md5Checksum" in item.reason
    assert {f.student for f in done.placed} == {"a05"}


def test_cli_with_the_listing_in_the_downloaded_folder_and_without_it(
    tmp_path: Path, capsys
) -> None:
    folder = tmp_path / "Lab 1"
    folder.mkdir()
    mine = [(n, o, t) for n, o, t, _ in DRIVE if n not in (NOTEBOOK, "extra.ipynb", "notes.pdf")]
    for name, _, text in mine:
        (folder / name).write_text(text, encoding="utf-8")
    inside = listing(folder / "drive-listing.json")
    roster_csv = roster(tmp_path / "roster.csv")
    args = ["collect", str(folder), "--lms", "classroom", "--lab", "01", "--roster",
            str(roster_csv)]  # fmt: skip
    code = main([*args, "--course", str(tmp_path / "c1"), "--drive-listing", str(inside)])
    out = capsys.readouterr().out
    assert code == 1, out  # a06's two notebooks
    assert "drive-listing.json" not in out.split("\n", 1)[1], "the listing is no submission"
    assert "placed    a05 (Mallory Evil)" in out
    # Without the listing: today's name rule (the name says Ada; nobody else names her).
    code = main([*args, "--course", str(tmp_path / "c2")])
    out = capsys.readouterr().out
    assert "placed    a01 (Ada Lovelace)" in out and "Ada Lovelace - my lab.ipynb" in out


def test_a_bad_listing_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "Lab 1"
    folder.mkdir()
    kwargs = {"lab": LAB1, "course": tmp_path / "c", "repo": REPO}
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(GradingError, match=r"--drive-listing .*bad\.json is not JSON"):
        collect(folder, lms="classroom", drive_listing=bad, **kwargs)
    bad.write_text(json.dumps({"files": [{"id": "1", "name": "x.ipynb"}]}))
    with pytest.raises(GradingError, match=r"no owners\[\]\.emailAddress: list with fields="):
        collect(folder, lms="classroom", drive_listing=bad, **kwargs)
    with pytest.raises(GradingError, match="is for --lms classroom, not moodle"):
        collect(folder, lms="moodle", drive_listing=listing(tmp_path / "l.json"), **kwargs)
    with pytest.raises(GradingError, match="does not exist"):
        collect(folder, lms="classroom", drive_listing=tmp_path / "none.json", **kwargs)

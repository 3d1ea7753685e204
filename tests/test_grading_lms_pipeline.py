"""LMS to LMS through the real grader: a Moodle download, ``labs grade``, a manual grade, export.

Two lab-01 submissions (the solution and one with sin and cos swapped) come from a Moodle
"download all submissions" zip, are graded for real (one kernel each), a written answer is
graded by hand through nbgrader's Gradebook API (what formgrader writes), the submission is
re-graded, and the manual grade must survive and reach both LMS exports. The rest of a class
is covered without kernels in ``test_grading_lms.py``.
"""

from __future__ import annotations

import csv
import datetime as dt
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from conftest import GRADING_SANDBOX, NEEDS, chromium_path
from filelock import FileLock
from lms_support import (
    LAB1,
    LAB2,
    MOODLE_IDS,
    REPO,
    STUDENTS,
    full_name,
    release_text,
    tree_hashes,
    write_roster,
    write_zip,
)
from nbgrader.api import Gradebook

from transformer_lab.grading.cli import main
from transformer_lab.grading.course import grading_env
from transformer_lab.grading.export import export_grades
from transformer_lab.grading.grade import GradingOptions, grade_course
from transformer_lab.grading.lms import Roster
from transformer_lab.grading.report import write_report
from transformer_lab.grading.results import course_outcomes
from transformer_lab.grading.rubrics import add_rubrics

pytestmark = [pytest.mark.slow]
TIMEOUT = 20
STUB = "# YOUR CODE HERE\n    raise NotImplementedError()"
ENC_SWAPPED = """two_i = torch.arange(0, d_model, 2, dtype=torch.float32)
    angles = torch.arange(seq_len, dtype=torch.float32)[:, None] / base ** (two_i / d_model)
    return torch.stack([angles.cos(), angles.sin()], dim=-1).flatten(1)"""


def _swapped() -> str:
    nb = nbformat.read(str(REPO / "labs" / LAB1 / f"{LAB1}.ipynb"), as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "sinusoidal_encoding":
            cell.source = cell.source.replace(STUB, ENC_SWAPPED)
    return nbformat.writes(nb)


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    home = shared / "lms_pipeline"
    with FileLock(str(shared / "lms_pipeline.lock")):
        if not (home / "done").exists():
            _build(home)
            (home / "done").write_text("ok")
    return {"course": home / "course", "home": home}


def _options() -> GradingOptions:
    """Every grading of this file alike (re-grading skips only what was graded with the same)."""
    return GradingOptions(sandbox=GRADING_SANDBOX)


def _build(home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    solution = (REPO / "solutions" / LAB1 / f"{LAB1}.ipynb").read_text()
    when = (2026, 10, 2, 9, 0, 0)
    archive = write_zip(
        home / "moodle.zip",
        [
            (f"{full_name(s)}_{MOODLE_IDS[s]}_assignsubmission_file_/{name}", text, when)
            for s, name, text in (
                ("s01", f"{LAB1}.ipynb", solution),
                ("s02", "lab1 final.ipynb", _swapped()),
                ("s03", "report.pdf", "%PDF-1.4"),  # a PDF only
                ("s04", f"{LAB1}.ipynb", solution[: len(solution) // 2]),  # truncated
                ("s05", f"{LAB2}.ipynb", release_text(LAB2)),  # another lab's notebook
            )
        ]
        + [(f"Mallory Unknown_999_assignsubmission_file/{LAB1}.ipynb", solution, when)],
    )
    (home / "archive.sha").write_text(repr(tree_hashes(archive)))
    course = home / "course"
    # A roster of 20 for 6 files: collect keeps it, and grade, report and export list them all.
    assert main(["collect", str(archive), "--lms", "moodle", "--lab", LAB1, "--course",
                 str(course), "--roster", str(write_roster(home / "roster.csv"))]) == 1  # fmt: skip
    (home / "submitted.sha").write_text(repr(tree_hashes(course / "submitted")))
    grade_course(course, REPO, [LAB1], timeout=TIMEOUT, options=_options())
    with grading_env(), Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        grade = gb.find_grade("written_small_base", LAB1, LAB1, "s01")
        grade.manual_score = 1.5
        grade.needs_manual_grade = False
        comment = gb.find_comment("written_small_base", LAB1, LAB1, "s01")
        comment.manual_comment = "Right idea; the wavelengths repeat sooner."
        gb.db.commit()
    # Unchanged, s01 would be skipped: forced, the manual grade must survive grading again.
    grade_course(
        course, REPO, [LAB1], students=["s01"], timeout=TIMEOUT, options=_options(), force=True
    )


def test_the_collected_submission_time_reaches_the_gradebook(graded: dict) -> None:
    """collect's timestamp.txt is graded with the submission, so nbgrader can judge lateness."""
    from transformer_lab.grading.results import course_deadlines

    with grading_env(), Gradebook(f"sqlite:///{graded['course'] / 'gradebook.db'}") as gb:
        submission = gb.find_submission(LAB1, "s01")
        assert submission.timestamp == dt.datetime(2026, 10, 2, 9, 0, 0)
        due = course_deadlines(REPO).get(LAB1)
        if due is not None:
            assert gb.find_assignment(LAB1).duedate == due.replace(tzinfo=None)
            assert (submission.total_seconds_late > 0) == (
                submission.timestamp > gb.find_assignment(LAB1).duedate
            )


def test_manual_grade_survives_regrading_and_reaches_both_exports(graded: dict) -> None:
    course, home = graded["course"], graded["home"]
    with grading_env(), Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        grade = gb.find_grade("written_small_base", LAB1, LAB1, "s01")
        assert grade.manual_score == 1.5 and not grade.needs_manual_grade
        total = float(gb.find_submission(LAB1, "s01").score)
    assert total == 13.5  # 12 autograded points + 1.5 by hand
    roster = Roster.read(home / "roster.csv")
    export_grades(course, "moodle", home / "out", roster=roster)
    export_grades(course, "canvas", home / "out", roster=roster)
    moodle = (home / "out" / f"moodle-{LAB1}-grades.csv").read_text()
    assert f"Participant {MOODLE_IDS['s01']},{full_name('s01')},s01@uni.example," in moodle
    assert ",13.5,18,Yes," in moodle and "written answers 1.5/6" in moodle
    canvas = (home / "out" / f"canvas-{LAB1}-grades.csv").read_text()
    assert ",40001,,,,13.5" in canvas
    # sin and cos swapped: row 0 is wrong, so every encoding check fails; the feedback says why.
    (s02,) = [o for o in course_outcomes(course) if o.student == "s02"]
    assert (s02.status, s02.score, s02.needs_manual) == ("graded", 0.0, 3)
    assert "Your sin and cos are swapped" in s02.feedback.read_text()
    assert s02.submitted == dt.datetime(2026, 10, 2, 9, tzinfo=dt.timezone.utc)
    page = write_report(course, out=home / "report")[0].read_text().replace("<wbr>", "")
    assert "test_sinusoidal_encoding_values" in page


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_one_view_of_the_whole_class(graded: dict) -> None:
    """Every roster student and every file handed in, with what happened to it, by name."""
    course, home = graded["course"], graded["home"]
    want = {
        "s01": "graded",
        "s02": "graded",
        "s03": "not a notebook",
        "s04": "unmatched",
        "s05": "wrong lab",
    }
    # grades.csv (written by labs grade): all 20 students, names beside ids, and the file.
    rows = _rows(course / "grades.csv")
    by_id = {r["student_id"]: r for r in rows if r["student_id"]}
    assert len(by_id) == len(STUDENTS) == 20
    assert {s: by_id[s]["status"] for s in want} == want
    assert by_id["s20"]["status"] == "missing" and by_id["s20"]["note"] == "nothing handed in"
    assert by_id["s03"]["note"].endswith("not a notebook (.pdf): only .ipynb is graded")
    assert (by_id["s03"]["first_name"], by_id["s03"]["last_name"]) == ("José", "Núñez")
    (lost,) = [r for r in rows if not r["student_id"]]
    assert lost["status"] == "unknown student" and "Mallory Unknown" in lost["file"]
    # The report: the same, on the page and in its tables.
    files = write_report(course, out=home / "one-view")
    page = files[0].read_text()
    assert "20 students (15 handed in nothing for some lab), 1 file(s) placed for no student" in (
        page
    )
    attention = {r["student"]: r for r in _rows(home / "one-view" / "attention.csv")}
    assert {s: attention[s]["status"] for s in ("s03", "s04", "s05")} == {
        s: want[s] for s in ("s03", "s04", "s05")
    }
    assert attention["s03"]["name"] == "José Núñez"
    assert "not a readable notebook" in attention["s04"]["reasons"]
    (row,) = _rows(home / "one-view" / "not_placed.csv")
    assert row["kind"] == "unknown student" and row["lms_id"] == "999"
    progress = {r["student"]: r for r in _rows(home / "one-view" / "progress.csv")}
    assert len(progress) == 20 and progress["s20"]["name"] == full_name("s20")
    assert progress["s05"][f"{LAB1} status"] == "wrong lab"
    # The exports: a status for everyone with an LMS id; the others and the file named.
    done = export_grades(course, "canvas", home / "one-view-out")
    status = {r["ID"]: r for r in _rows(home / "one-view-out" / "canvas-status.csv")}
    assert len(status) == 20
    assert status["40003"]["status"] == "not a notebook" and status["40003"]["points"] == ""
    assert "report.pdf" in status["40003"]["comment"]
    assert status["40020"]["comment"].startswith("Status: nothing handed in.")
    assert any("Mallory Unknown" in line and "LMS id 999" in line for line in done.left_out)


def test_regrading_grades_only_what_changed(graded: dict, tmp_path: Path) -> None:
    course = tmp_path / "course"
    shutil.copytree(graded["course"], course, symlinks=True)
    before = (course / "gradebook.db").read_bytes()
    again = grade_course(course, REPO, [LAB1], timeout=TIMEOUT, options=_options())
    assert again.results == [] and again.skipped == [f"s01/{LAB1}", f"s02/{LAB1}", f"s04/{LAB1}"]
    assert "skipped 3 unchanged submission(s)" in again.table()
    assert (course / "gradebook.db").read_bytes() == before
    # s02 hands in the solution: only s02 is graded, and gets its points.
    solution = (REPO / "solutions" / LAB1 / f"{LAB1}.ipynb").read_text()
    (course / "submitted" / "s02" / LAB1 / f"{LAB1}.ipynb").write_text(solution)
    seen: list[tuple[str, int, int]] = []
    changed = grade_course(
        course,
        REPO,
        [LAB1],
        timeout=TIMEOUT,
        options=_options(),
        progress=lambda n, of, r: seen.append((r.student, n, of)),
    )
    assert seen == [("s02", 1, 1)], "one progress call per submission graded"
    assert [(r.student, r.status, r.auto_score) for r in changed.results] == [
        ("s02", "graded", 12.0)
    ]
    assert changed.skipped == [f"s01/{LAB1}", f"s04/{LAB1}"]
    forced = grade_course(course, REPO, [LAB1], students=["s04"], force=True, options=_options())
    assert [(r.student, r.status) for r in forced.results] == [("s04", "unmatched")]
    # A course whose gradebook was deleted has nothing graded to keep: it is graded again.
    (course / "gradebook.db").unlink()
    lost = grade_course(course, REPO, [LAB1], students=["s04"], options=_options())
    assert [(r.student, r.status) for r in lost.results] == [("s04", "unmatched")]
    assert lost.skipped == []


def test_nothing_handed_in_was_modified(graded: dict) -> None:
    home, course = graded["home"], graded["course"]
    assert repr(tree_hashes(home / "moodle.zip")) == (home / "archive.sha").read_text()
    assert repr(tree_hashes(course / "submitted")) == (home / "submitted.sha").read_text()


def _formgrader(course: Path, port: int, token: str) -> subprocess.Popen:
    """nbgrader's formgrader (a Jupyter server with its extension) on 127.0.0.1."""
    (course / "nbgrader_config.py").write_text(
        f"c = get_config()\nc.CourseDirectory.root = {str(course)!r}\n"
    )
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    extensions = "{'nbgrader.server_extensions.formgrader': True}"
    command = [
        str(bin_dir / "jupyter"), "server", "--no-browser", "--allow-root",
        "--ServerApp.ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
        f"--ServerApp.jpserver_extensions={extensions}", "--ServerApp.open_browser=False",
    ]  # fmt: skip
    log = open(course / "formgrader.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(command, cwd=course, env=env, stdout=log, stderr=subprocess.STDOUT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_formgrader_in_chromium(graded: dict, tmp_path: Path) -> None:
    """A written answer graded in formgrader (Chromium) survives re-grading and is exported."""
    chromium = chromium_path()
    if chromium is None:
        pytest.skip(NEEDS["chromium"])
    from playwright.sync_api import sync_playwright

    course = tmp_path / "course"
    shutil.copytree(graded["course"], course)
    assert add_rubrics(course, REPO, [LAB1])  # what `labs grade` does after grading
    port, token = _free_port(), "t" + os.urandom(8).hex()
    server = _formgrader(course, port, token)
    try:
        base = f"http://127.0.0.1:{port}/formgrader"
        with grading_env(), Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
            notebook_id = gb.find_submission_notebook(LAB1, LAB1, "s02").id
        with sync_playwright() as play:
            browser = play.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            # The token as a header on every request (formgrader's API calls included).
            context = browser.new_context(extra_http_headers={"Authorization": f"token {token}"})
            page = context.new_page()
            url = f"{base}/submissions/{notebook_id}/"
            for _ in range(120):  # the server takes a few seconds to start
                try:
                    if page.goto(url).ok:
                        break
                except Exception:
                    pass
                time.sleep(0.5)
            page.wait_for_selector("#written_extrapolation")
            text = page.inner_text("body")
            assert "Rubric (shown to graders only" in text
            assert "1 point: names the effect" in text  # written_small_base's rubric
            # formgrader binds its score inputs only once its grades have loaded (an API call);
            # typing before that is never saved, which a busy machine shows.
            page.wait_for_function("() => formgrader.grades && formgrader.grades.loaded",
                                   timeout=120_000)  # fmt: skip
            with page.expect_response(lambda r: "/api/grade/" in r.url and r.ok, timeout=120_000):
                page.fill("#written_extrapolation", "2")
                page.press("#written_extrapolation", "Tab")
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert main(["grade", "--course", str(course), "01", "--student", "s02", "--force",
                 "--timeout", str(TIMEOUT), "--sandbox", GRADING_SANDBOX]) in (0, 1)  # fmt: skip
    with grading_env(), Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        grade = gb.find_grade("written_extrapolation", LAB1, LAB1, "s02")
        assert grade.manual_score == 2.0 and not grade.needs_manual_grade
    roster = Roster.read(graded["home"] / "roster.csv")
    export_grades(course, "moodle", tmp_path / "out", roster=roster)
    export_grades(course, "canvas", tmp_path / "out", roster=roster)
    moodle = (tmp_path / "out" / f"moodle-{LAB1}-grades.csv").read_text()
    assert f"Participant {MOODLE_IDS['s02']},{full_name('s02')},s02@uni.example," in moodle
    assert ",2,18,Yes," in moodle and "written answers 2/6" in moodle
    assert ",40002,,,,2" in (tmp_path / "out" / f"canvas-{LAB1}-grades.csv").read_text()

"""Grading on Dask distributed (``labs grade --cluster``) and resuming a stopped run.

A class of lab 01 (the solution and the untouched release) is graded once here and once through
a ``LocalCluster`` of two worker processes: the gradebook, ``grades.csv``, the feedback and
the report's verdicts must be the same. Another class is graded while one worker is killed
mid-submission: every submission is graded once, none lost, none doubled. A run stopped after
its first submission and resumed grades only the other one. Small on purpose (a few lab-01
submissions): each costs a kernel.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import GRADING_SANDBOX, needs_bwrap
from nbgrader.api import Gradebook

from transformer_lab.grading.cli import main
from transformer_lab.grading.course import GradingError, grading_env
from transformer_lab.grading.grade import GradingOptions, SubmissionResult, grade_course

distributed = pytest.importorskip("distributed", reason="pip install 'transformer-lab[cluster]'")

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"
TIMEOUT = 40

pytestmark = pytest.mark.slow


def _class(course: Path, students: dict[str, str]) -> Path:
    """``students``: id -> ``solution`` or ``release`` (lab 01's notebook they hand in)."""
    for student, kind in students.items():
        folder = course / "submitted" / student / LAB
        folder.mkdir(parents=True)
        source = REPO / ("solutions" if kind == "solution" else "labs") / LAB / f"{LAB}.ipynb"
        shutil.copyfile(source, folder / f"{LAB}.ipynb")
    return course


def _grade(course: Path, stop=None, **kwargs) -> tuple[list[SubmissionResult], list[str]]:
    """Grade ``course``; the report's results and the progress lines, in the order seen.
    ``stop``: called on each progress line (it may raise, as Ctrl-C would)."""
    seen: list[str] = []

    def progress(done: int, total: int, result: SubmissionResult) -> None:
        seen.append(f"{done}/{total} {result.student}")
        if stop is not None:
            stop(result)

    unsandboxed = pytest.warns(RuntimeWarning, match="UNSANDBOXED")
    with unsandboxed if GRADING_SANDBOX == "off" else contextlib.nullcontext():
        report = grade_course(
            course,
            REPO,
            [LAB],
            timeout=TIMEOUT,
            options=GradingOptions(sandbox=GRADING_SANDBOX),
            progress=progress,
            **kwargs,
        )
    return report.results, seen


def _gradebook(course: Path) -> dict[tuple[str, str], tuple]:
    """(student, grade) -> (auto, manual, needs manual, max) for every grade in the gradebook."""
    rows = {}
    with grading_env(), Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for submission in gb.assignment_submissions(LAB):
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    rows[(submission.student.id, grade.name)] = (
                        grade.auto_score,
                        grade.manual_score,
                        grade.needs_manual_grade,
                        grade.max_score,
                    )
    return rows


def _csv(course: Path) -> list[dict[str, str]]:
    with open(course / "grades.csv", newline="") as handle:
        return sorted(csv.DictReader(handle), key=lambda row: row["student_id"])


def _verdicts(course: Path) -> dict[str, tuple]:
    report = json.loads((course / "grading_report.json").read_text())
    return {
        r["student"]: (r["status"], r["auto_score"], r["verdicts"], r["flags"], r["sandbox"])
        for r in report["runs"][-1]["results"]
    }


class _StopError(Exception):
    """Stands for Ctrl-C after the first submission was accepted."""


def _stop(result: SubmissionResult) -> None:
    raise _StopError(result.student)


def test_a_class_graded_on_two_dask_workers_matches_a_local_run(tmp_path: Path) -> None:
    """The local run is stopped after its first submission and resumed: the resumed run
    grades only the other one, and the outcome is still the same as on the cluster."""
    students = {"ada": "solution", "bob": "release"}
    here = _class(tmp_path / "here", students)
    there = _class(tmp_path / "there", students)
    with pytest.raises(_StopError) as stopped:
        _grade(here, stop=_stop)
    assert not (here / "grading_report.json").exists()  # stopped before its report
    local, resumed = _grade(here, resume=True)
    assert resumed == [f"2/2 {({'ada', 'bob'} - {str(stopped.value)}).pop()}"]  # only that one
    assert not (here / ".grading" / "journal.jsonl").exists()  # the run ended: no journal
    remote, progress = _grade(there, cluster="local:2")
    assert sorted(progress) == ["1/2 ada", "2/2 bob"] or sorted(progress) == ["1/2 bob", "2/2 ada"]
    assert {(r.student, r.status, r.auto_score) for r in remote} == {
        ("ada", "graded", 12.0),
        ("bob", "graded", 0.0),
    }
    assert [(r.student, r.auto_score) for r in local] == [(r.student, r.auto_score) for r in remote]
    assert _gradebook(there) == _gradebook(here)
    assert _csv(there) == _csv(here)
    assert _verdicts(there) == _verdicts(here)
    for student in students:
        name = Path(student) / LAB / f"{LAB}.html"
        mine = (there / "feedback" / name).read_text(encoding="utf-8")
        assert mine == (here / "feedback" / name).read_text(encoding="utf-8"), student
        assert (there / "autograded" / student / LAB / f"{LAB}.ipynb").is_file()
    assert "12 / 12" in (there / "feedback" / "ada" / LAB / f"{LAB}.html").read_text() or (
        "12.0 / 12.0" in (there / "feedback" / "ada" / LAB / f"{LAB}.html").read_text()
    )
    # The coordinator's working folder holds nothing a worker made.
    assert list((there / ".grading" / "work").iterdir()) == []
    report = json.loads((there / "grading_report.json").read_text())
    assert report["runs"][-1]["cluster"] == "local:2"


def _kill_a_busy_worker(address: str, killed: list[str], stop: threading.Event) -> None:
    """Kill (SIGKILL) the first worker seen grading a submission for 3 s: mid-task."""
    from distributed import Client

    def busy(dask_worker) -> list[str]:
        return [str(key) for key in dask_worker.state.executing]

    with Client(address, timeout="30s") as client:
        since: dict[str, float] = {}
        while not stop.is_set() and not killed:
            for worker, keys in client.run(busy).items():
                if keys and time.monotonic() - since.setdefault(worker, time.monotonic()) > 3:
                    pid = client.run(os.getpid, workers=[worker])[worker]
                    killed.append(keys[0])
                    os.kill(pid, signal.SIGKILL)
                    return
                if not keys:
                    since.pop(worker, None)
            time.sleep(0.5)


@needs_bwrap  # unsandboxed, a killed worker's kernel would outlive it (bubblewrap ends it)
def test_a_worker_killed_mid_submission_loses_and_doubles_nothing(tmp_path: Path) -> None:
    from distributed import LocalCluster

    course = _class(tmp_path / "course", {"ada": "solution", "bob": "release", "cy": "solution"})
    killed: list[str] = []
    stop = threading.Event()
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        killer = threading.Thread(
            target=_kill_a_busy_worker, args=(cluster.scheduler_address, killed, stop)
        )
        killer.start()
        try:
            results, progress = _grade(course, cluster=cluster.scheduler_address)
        finally:
            stop.set()
            killer.join(timeout=60)
    assert killed, "no worker was seen grading a submission: nothing was killed"
    assert len(progress) == 3 and {line.split()[1] for line in progress} == {"ada", "bob", "cy"}
    assert sorted((r.student, r.status, r.auto_score) for r in results) == [
        ("ada", "graded", 12.0),
        ("bob", "graded", 0.0),
        ("cy", "graded", 12.0),
    ]
    rows = _csv(course)
    assert [(r["student_id"], float(r["score"])) for r in rows] == [
        ("ada", 12.0),
        ("bob", 0.0),
        ("cy", 12.0),
    ]
    with grading_env(), Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        assert sorted(s.student.id for s in gb.assignment_submissions(LAB)) == ["ada", "bob", "cy"]


def test_the_journal_keeps_only_what_a_stopped_run_accepted(tmp_path: Path) -> None:
    from transformer_lab.grading.journal import Journal, notebook_digest

    notebook = _class(tmp_path / "course", {"ada": "solution"}) / "submitted" / "ada" / LAB
    digest = notebook_digest(notebook / f"{LAB}.ipynb")
    journal = Journal(tmp_path / "work", resume=False)
    entry = {"student": "ada", "lab": LAB, "status": "graded"}
    journal.add(entry, digest)
    with open(journal.path, "a") as handle:
        handle.write('{"digest": "cut sh')  # the line being written when the run stopped
    resumed = Journal(tmp_path / "work", resume=True)
    assert resumed.finished("ada", LAB, digest) == {
        "student": "ada",
        "lab": LAB,
        "status": "graded",
    }
    assert resumed.finished("bob", LAB, digest) is None
    (notebook / "timestamp.txt").write_text("2026-10-02 09:00:00")  # handed in again
    assert resumed.finished("ada", LAB, notebook_digest(notebook / f"{LAB}.ipynb")) is None
    assert Journal(tmp_path / "work", resume=False).finished("ada", LAB, digest) is None
    assert not resumed.path.exists()  # a run without --resume starts afresh
    resumed.close()


def test_cluster_addresses_that_mean_nothing_are_refused_by_name(tmp_path: Path, capsys) -> None:
    course = _class(tmp_path / "course", {"ada": "solution"})
    args = ["--repo", str(REPO), "grade", "--course", str(course), "--unsandboxed"]
    assert main([*args, "--cluster", "scheduler:8786"]) == 2
    assert "--cluster 'scheduler:8786' is not local:N" in capsys.readouterr().err
    assert main([*args, "--cluster", "local:2", "--jobs", "2"]) == 2
    assert "jobs=2 with cluster='local:2'" in capsys.readouterr().err
    assert main([*args, "--cluster", str(tmp_path / "nowhere.json")]) == 2
    assert "no such scheduler file" in capsys.readouterr().err


def test_a_worker_on_another_commit_refuses_by_name() -> None:
    from transformer_lab.grading.cluster import LabBundle, _check_worker, kit_digest

    bundle = LabBundle(LAB, b"", b"", b"", "", "not the solution's digest", kit_digest())
    with pytest.raises(GradingError, match=r"solutions/01_positional_encoding differs"):
        _check_worker(bundle, REPO, use_bwrap=False)
    other = LabBundle(LAB, b"", b"", b"", "", "", "another kit")
    with pytest.raises(GradingError, match="transformer_lab differs from the coordinator's"):
        _check_worker(other, REPO, use_bwrap=False)


def test_each_finished_submission_prints_one_progress_line(capsys) -> None:
    from transformer_lab.grading.cli import _progress

    _progress(12, 300, SubmissionResult("alice", LAB, "graded", auto_score=12.0, auto_max=12.0))
    _progress(13, 300, SubmissionResult("bob", LAB, "failed", error="KilledWorker", seconds=3.4))
    assert capsys.readouterr().err.splitlines() == [
        f"[12/300] alice {LAB}: graded 12/12 (0 s)",
        f"[13/300] bob {LAB}: failed (3 s)",
    ]


def test_a_worker_with_two_threads_refuses_by_name() -> None:
    """Each submission ends every process it started: two at once on one worker must not be."""
    from distributed import Client, LocalCluster

    from transformer_lab.grading.cluster import (
        LabBundle,
        RemoteTask,
        _solution_digest,
        grade_task,
        kit_digest,
    )
    from transformer_lab.grading.grade import CLUSTER_GRADER, Job

    bundle = LabBundle(LAB, b"", b"", b"", "", _solution_digest(REPO, LAB), kit_digest())
    job = Job(str(REPO), "", "ada", LAB, "", [], "", "", "", "", "", {}, use_bwrap=False)
    task = RemoteTask(job, b"{}", f"{LAB}.ipynb", None)
    refused = pytest.raises(GradingError, match=r"runs 2 threads: .*dask worker --nthreads 1")
    with (
        LocalCluster(n_workers=1, threads_per_worker=2, processes=False) as cluster,
        Client(cluster) as client,
        refused,
    ):
        client.submit(grade_task, task, bundle, CLUSTER_GRADER, pure=False).result()

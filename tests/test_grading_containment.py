"""Bombs cost only their own submission: graded by the real ``labs grade``, sandboxed or not.

A bounded fork bomb, a memory bomb that also fills ``/tmp`` and ``/dev/shm``, and a
``setsid`` daemon are each one student's submission (lab 01's release plus one cell); an
honest solution and the untouched release are graded after them in the same run, one at a
time. The honest student keeps full marks and the untouched release zero, and no process the
bombs started is left when the run ends (:mod:`transformer_lab.grading.contain`). Without the
sandbox (``--unsandboxed``) a submission also gets its own package view (poisoning it changes
nothing for the next student) and a working directory outside the course. In the same
sandboxed run, a student's hostile HTML output reaches feedback inert, and the notebook's
history printed after the hidden checks does not reach it at all.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest
from conftest import needs_bwrap

from transformer_lab.grading.cli import main

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"
MARK = "612.34567"  # the bombs' children sleep this long: how the test finds leftovers
pytestmark = pytest.mark.slow

FORK_BOMB = f"""
import subprocess
kids = []
try:
    for _ in range(400):  # bounded: the limit stops it first
        kids.append(subprocess.Popen(["sleep", "{MARK}"]))
except OSError as exc:
    print("fork bomb stopped at", len(kids), type(exc).__name__)
"""
MEMORY_BOMB = """
filled = {}
for name in ("/tmp/fill", "/dev/shm/fill"):
    with open(name, "wb") as handle:
        try:
            for _ in range(128):  # bounded: 2 GiB each at most
                handle.write(b"x" * 2**24)
        except OSError as exc:
            filled[name] = type(exc).__name__
chunks = []
try:
    for _ in range(64):  # bounded: 8 GiB at most
        chunks.append(bytearray(2**27))
except MemoryError:
    print("memory bomb stopped at", len(chunks), "chunks, files:", filled)
del chunks
"""
PAYLOAD = f"""
import os, pathlib, subprocess, transformer_lab
print("CWD", os.getcwd())
if os.fork() == 0:  # a double fork: the grandchild is nobody's child but init's
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "{MARK}"])
    os._exit(0)
subprocess.Popen(["setsid", "sleep", "{MARK}"], start_new_session=True)
view = pathlib.Path(transformer_lab.__file__).parent
with open(view / "__init__.py", "a") as handle:  # poison what the next student imports
    handle.write("\\nraise SystemExit('poisoned')\\n")
"""
# Run in a thread, compiled under a library's file name: the in-kernel guard (a fence only
# without the sandbox) does not stop it, so containment itself is what is tested.
DAEMON = f"""
import threading
code = compile({PAYLOAD!r}, "/usr/lib/python3/dist-packages/tl_payload.py", "exec")
worker = threading.Thread(target=exec, args=(code, {{}}))
worker.start()
worker.join()
"""


FAKE_BADGE = '<span class="tl-points tl-pass">12 / 12 points: passed</span>'
ACTIVE = f"<script>document.title='pwned'</script>{FAKE_BADGE}<img src=x onerror=alert(1)>"
HOSTILE_HTML = f"""
from IPython.display import HTML, display
display(HTML({ACTIVE!r}))
"""


def _leftovers() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and MARK in (entry / "cmdline").read_text():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _submit(course: Path, student: str, extra: str | None) -> None:
    """The solution (``extra`` None), or the release with ``extra`` as its third cell."""
    folder = course / "submitted" / student / LAB
    folder.mkdir(parents=True, exist_ok=True)
    if extra is None:
        nb = nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)
    else:
        nb = nbformat.read(str(REPO / "labs" / LAB / f"{LAB}.ipynb"), as_version=4)
        nb.cells.insert(2, nbformat.v4.new_code_cell(extra))
        if extra == HOSTILE_HTML:  # and, after every test cell, the notebook's history
            nb.cells.append(nbformat.v4.new_code_cell(f"print(In)\n{HOSTILE_HTML}"))
    nbformat.write(nb, str(folder / f"{LAB}.ipynb"))


def _grade(course: Path, submissions: dict[str, str | None], *extra: str) -> dict[str, dict]:
    for student, cell in submissions.items():
        _submit(course, student, cell)
    args = ["--repo", str(REPO), "grade", "--course", str(course), "--jobs", "1"]
    limits = ["--memory-gb", "2.5", "--tmp-gb", "0.25", "--max-tasks", "128"]
    main([*args, "--timeout", "60", "--budget", "200", *limits, *extra])
    report = json.loads((course / "grading_report.json").read_text())
    return {r["student"]: r for r in report["runs"][-1]["results"]}


def _outputs(course: Path, student: str) -> str:
    executed = course / "autograded" / student / LAB / f"{LAB}.ipynb"
    nb = nbformat.read(str(executed), as_version=4)
    return "".join(str(o.get("text", "")) for c in nb.cells for o in c.get("outputs", []))


def _ended(result: dict) -> int:
    """How many of a submission's processes the grader had to end (its report says)."""
    return int(result["containment"].split(", ")[1].split()[0])


def _honest_and_untouched_unharmed(results: dict[str, dict]) -> None:
    assert results["honest"]["status"] == "graded", results["honest"]
    assert results["honest"]["auto_score"] == 12.0
    assert results["untouched"]["auto_score"] == 0.0
    assert _leftovers() == []


@needs_bwrap
def test_bombs_in_the_sandbox_cost_only_their_own_submission(tmp_path: Path) -> None:
    course = tmp_path / "course"
    bombs = {"bomb_fork": FORK_BOMB, "bomb_memory": MEMORY_BOMB, "bomb_tmp_daemon": DAEMON}
    results = _grade(course, {**bombs, "html": HOSTILE_HTML, "honest": None, "untouched": ""})
    _honest_and_untouched_unharmed(results)
    for student in bombs:
        assert results[student]["sandbox"] == "bubblewrap"
        assert results[student]["auto_score"] == 0.0, results[student]
        assert results[student]["containment"], results[student]
    bounded = "cgroup" in results["bomb_fork"]["containment"] or os.geteuid() != 0
    if bounded:  # RLIMIT_NPROC does not bind root: there the cgroup's pids.max does
        assert "fork bomb stopped at" in _outputs(course, "bomb_fork")
    memory = _outputs(course, "bomb_memory")
    if results["bomb_memory"]["status"] != "crashed":  # else the cgroup's OOM killer ended it
        assert "memory bomb stopped at" in memory and "/tmp/fill" in memory
    assert "/dev/shm/fill" in memory or results["bomb_memory"]["status"] == "crashed"
    # Feedback: the student's HTML is inert, and nothing after the first hidden cell shows.
    feedback = (course / "feedback" / "html" / LAB / f"{LAB}.html").read_text()
    # (The cells' code is shown, escaped: what must not be there is the live HTML.)
    assert "<script>document" not in feedback and "<img src=x" not in feedback
    assert '<img src="x"' not in feedback and FAKE_BADGE not in feedback
    assert "outputs after the first hidden check" in feedback
    assert "<span>12 / 12 points: passed</span>" in feedback  # inert text, as the student wrote
    assert "BEGIN HIDDEN TESTS" not in feedback and "hidden_check_" not in feedback


def test_unsandboxed_each_submission_is_contained(tmp_path: Path) -> None:
    course = tmp_path / "course"
    with pytest.warns(RuntimeWarning, match="UNSANDBOXED"):
        results = _grade(
            course, {"daemon": DAEMON, "honest": None, "untouched": ""}, "--unsandboxed"
        )
    _honest_and_untouched_unharmed(results)  # the poisoned view was the daemon's own
    assert results["daemon"]["sandbox"] == "none"
    assert "subreaper" in results["daemon"]["containment"]
    assert _ended(results["daemon"]) >= 2  # the setsid daemon and the double-forked one
    cwd = next(line for line in _outputs(course, "daemon").splitlines() if "CWD" in line)
    assert str(course.resolve()) not in cwd and str(REPO) not in cwd

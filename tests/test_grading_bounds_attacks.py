"""Stalling or killing the grader costs only the attacker: replayed through the real ``labs grade``.

One sandboxed run of lab 01, one submission at a time, the attacks first and the controls last:

* ``a_slow``: every call the judge makes in the hidden check's cell of ``sinusoidal_encoding``
  sleeps 4 s (the notebook's own calls and the other judged cells' do not), under the 15 s cell
  timeout each, so that cell's calls (more than 3) would each return if the timeout were per call:
  the judged cell's one deadline ends it, only that cell loses its points, and the cells judged
  after it (in the same kernel) keep theirs;
* ``a_deep``: the solution with its metadata lost and 20 cells of 8 KB before its first
  answer (160 KB: what made the repair's similarity quadratic): repaired and graded in full;
* ``a_many``: more cells than the repair matches: unmatched, with the reason, unread;
* ``b_replies``: a kernel whose first reply is larger than the wire accepts (its bound lowered
  to 16 MiB for the run) and every later one millions of nested empty lists (3 characters for
  an object): the first refused by its size, the others before JSON builds them; every cell 0;
* ``c_killed``, ``c_oom``: the grader's own work on the submission killed (what the system's
  out-of-memory killer does) or out of its memory (a stand-in for what no reply can do any
  more, patched into the grader): that submission fails, says so, and the batch goes on;
* ``z_honest`` and ``z_untouched``, after all of them: full marks and zero.

The bounds themselves are measured by counts in ``tests/test_grading_bounds.py``.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import nbformat
import pytest
from conftest import GRADING_SANDBOX

from transformer_lab.grading import grade, repair
from transformer_lab.grading.cli import main
from transformer_lab.judge import wire

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"
TIMEOUT = 15  # seconds per cell: lab 01's training cell takes over 10 s on a loaded machine
SLEEP = 4  # seconds each of a_slow's judged calls takes
SLOW_CELL = "test_sinusoidal_encoding_hidden"  # the one judged cell whose calls a_slow stalls
MAX_BYTES = 16 * 2**20  # the wire's size bound in this run (256 MiB would cost the machine)
pytestmark = pytest.mark.slow

# Each judged cell's calls come from a serving loop of its own (one ``serve_loop`` frame), the
# cells in the notebook's order: the ``{ordinal}``-th loop is the slow cell's.
SLOW = f"""\
    import sys, time
    frame = sys._getframe()
    while frame is not None and frame.f_code.co_name != "serve_loop":
        frame = frame.f_back
    if frame is not None:  # only when the judge calls: the notebook's own cells are fast
        loops = globals().setdefault("_judged_cells", [])  # kept: no frame id is reused
        if not any(seen is frame for seen in loops):
            loops.append(frame)
        if len(loops) == {{ordinal}}:  # the slow cell's loop (the latest one)
            time.sleep({SLEEP})
"""
# The kernel's serving loop rewritten: its first reply is larger than the wire accepts, every
# later one is millions of nested empty lists.
REPLIES = f"""
import builtins
import transformer_lab.judge.kernel as _k
_sent = []

def _bombs():
    nested = '{{"ok":true,"value":[' + "[]," * {3 * 2**20} + "[]]}}"
    text = builtins.input(_k.REQUEST_PROMPT)
    while text != _k.END:
        reply = nested
        if not _sent:  # the first reply of all
            _sent.append(1)
            reply = '{{"ok":true,"value":"' + "x" * {MAX_BYTES} + '"}}'
        text = builtins.input(_k.REPLY_PREFIX + reply)

_k.serve_loop = _bombs
"""


def _notebook(folder: str) -> nbformat.NotebookNode:
    return nbformat.read(str(REPO / folder / LAB / f"{LAB}.ipynb"), as_version=4)


def _cell(nb: Any, grade_id: str) -> Any:
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _slow() -> Any:
    nb = _notebook("solutions")
    # Every judged cell up to the slow one calls sinusoidal_encoding (they are its checks).
    judged = list(grade.judge_plan(nb))
    assert judged[: judged.index(SLOW_CELL)] == [
        f"test_sinusoidal_encoding_{part}" for part in ("shape", "values")
    ], judged
    cell = _cell(nb, "sinusoidal_encoding")
    head, marker, body = cell.source.partition("    ### BEGIN SOLUTION\n")
    assert marker, "the answer cell's solution marker moved"
    slow = SLOW.format(ordinal=judged.index(SLOW_CELL) + 1)
    cell.source = head + marker + slow + body
    return nb


def _deep() -> Any:
    nb = _notebook("solutions")
    first = nb.cells.index(_cell(nb, "sinusoidal_encoding"))
    for cell in nb.cells:
        cell.metadata.pop("nbgrader", None)  # lost in a round trip: matched by similarity
    filler = ("#      " + "       x" * 19 + "\n") * 50  # 8 KB of comments, quick to run
    nb.cells[first:first] = [nbformat.v4.new_code_cell(filler) for _ in range(20)]
    return nb


def _many() -> Any:
    nb = _notebook("solutions")
    nb.cells += [nbformat.v4.new_markdown_cell("x") for _ in range(repair.MAX_CELLS)]
    return nb


def _with_cell(source: str) -> Any:
    nb = _notebook("solutions")
    nb.cells.insert(2, nbformat.v4.new_code_cell(source))
    return nb


def _graders_failure(job: grade.Job) -> Any:
    """The grader's own work on ``c_killed`` and ``c_oom`` failing as a reply once made it."""
    if job.student == "c_killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if job.student == "c_oom":
        return bytearray(16 * 2**30)  # more than the grader's 6 GiB: refused, never touched
    return _real_grade_quietly(job)


_real_grade_quietly = grade._grade_quietly


def _grade(course: Path, submissions: dict[str, Any]) -> dict[str, dict]:
    for student, nb in submissions.items():
        folder = course / "submitted" / student / LAB
        folder.mkdir(parents=True)
        nbformat.write(nb, str(folder / f"{LAB}.ipynb"))
    sandbox = [] if GRADING_SANDBOX == "required" else ["--unsandboxed"]
    args = ["--repo", str(REPO), "grade", "--course", str(course), "--jobs", "1"]
    limits = ["--memory-gb", "2.5", "--tmp-gb", "0.25", "--budget", "200"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grade, "_grade_quietly", _graders_failure)
        patch.setattr(wire, "MAX_BYTES", MAX_BYTES)
        if sandbox:
            with pytest.warns(RuntimeWarning, match="UNSANDBOXED"):
                main([*args, "--timeout", str(TIMEOUT), *limits, *sandbox])
        else:
            main([*args, "--timeout", str(TIMEOUT), *limits])
    report = json.loads((course / "grading_report.json").read_text())
    return {r["student"]: r for r in report["runs"][-1]["results"]}


def _message(result: dict, grade_id: str) -> str:
    return result["verdicts"][grade_id]["message"]


def test_stalling_or_killing_the_grader_costs_only_the_attacker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    course = tmp_path / "course"
    results = _grade(
        course,
        {
            "a_slow": _slow(),
            "a_deep": _deep(),
            "a_many": _many(),
            "b_replies": _with_cell(REPLIES),
            "c_killed": _notebook("solutions"),
            "c_oom": _notebook("solutions"),
            "z_honest": _notebook("solutions"),
            "z_untouched": _notebook("labs"),
        },
    )
    err = capsys.readouterr().err
    # The controls, graded after every attack.
    assert results["z_honest"]["status"] == "graded", results["z_honest"]
    assert results["z_honest"]["auto_score"] == 12.0
    assert results["z_untouched"]["auto_score"] == 0.0

    # Many slow calls: the judged cell's one deadline, not one per call; every other cell
    # (before it, after it in the same kernel, the other answer's) keeps its points, and
    # nothing ran out of the submission's budget.
    slow = results["a_slow"]
    within = f"did not return within {TIMEOUT} s (the time of the whole judged cell"
    assert within in _message(slow, SLOW_CELL), slow
    assert slow["verdicts"][SLOW_CELL]["score"] == 0.0
    for part in ("shape", "values", "properties"):
        assert slow["verdicts"][f"test_sinusoidal_encoding_{part}"]["score"] > 0, slow
    for part in ("shape", "values", "hidden", "properties"):
        assert slow["verdicts"][f"test_relative_shift_matrix_{part}"]["score"] > 0, slow
    assert not any("TimeBudgetExceeded" in p for p in slow["problems"]), slow

    # The repair: a deep notebook repaired and graded in full; too many cells, unmatched.
    deep = results["a_deep"]
    assert deep["status"] == "graded" and deep["auto_score"] == 12.0, (deep["flags"], deep)
    assert any("restored the lost metadata" in line for line in deep["repairs"])
    many = results["a_many"]
    assert many["status"] == "unmatched" and many["auto_score"] is None
    assert f"more than the {repair.MAX_CELLS} the grader matches" in many["error"]

    # Replies: an oversized one refused by its size; nested empty lists before they are built.
    replies = results["b_replies"]
    assert replies["raw_auto_score"] == 0.0 and replies["auto_score"] == 0.0, replies
    assert "too much data" in _message(replies, "test_sinusoidal_encoding_shape")
    assert f"holds more than {wire.MAX_ITEMS}" in _message(
        replies, "test_sinusoidal_encoding_values"
    ), replies
    # a hidden cell says it in fixed words (the wire's own text is not shown there)
    hidden = _message(replies, "test_relative_shift_matrix_hidden")
    assert "got no usable answer from your notebook" in hidden, replies

    # The grader's own failures: the submission's record says what happened, one line each.
    killed, oom = results["c_killed"], results["c_oom"]
    assert killed["status"] == oom["status"] == "failed"
    assert "was killed (SIGKILL: most likely" in killed["error"], killed
    assert "ran out of memory (its limit: 6 GiB)" in oom["error"], oom
    for student in ("c_killed", "c_oom"):
        lines = [line for line in err.splitlines() if f"labs grade: {student}/{LAB}" in line]
        assert len(lines) == 1 and lines[0].endswith("the batch goes on"), err

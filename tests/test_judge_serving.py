"""The kernel's serving loop through the real grader: a call that never returns costs its cell.

For each judged cell the kernel serves the judge's requests in one loop (replies travel as the
prompts of the ``input()`` that fetches the next request, ``judge.kernel.serve_loop``). An
answer that hangs only when the judge calls it must cost that cell alone: the judge gives up
after the cell's timeout, interrupts the kernel, ends its loop, and the next cells are judged in
a fresh loop with their points. Through ``labs grade`` in the sandbox (lab 01).
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from judge_support import grade_one, with_code_first_in_answer
from nbgrader.api import Gradebook

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"
TIMEOUT = 15  # seconds per cell: lab 01's slowest cell takes ~4 s on a loaded 2-core machine

# The first call made by the judge (its module is then in the notebook's namespace) never
# returns; the kernel's own calls, and every later call, are correct.
# (Found without globals() or sys.modules, which the grader flags for review.)
STALLED = "_STALLED = []\n"
STALL_ONCE = """\
    import traceback
    judged = any(frame.name == "serve_loop" for frame in traceback.extract_stack())
    if judged and not _STALLED:
        _STALLED.append(True)
        while True:
            pass
"""

pytestmark = pytest.mark.slow


def _submission() -> nbformat.NotebookNode:
    return with_code_first_in_answer(LAB, "sinusoidal_encoding", STALL_ONCE, before=STALLED)


def test_a_call_that_never_returns_costs_only_its_cell(tmp_path: Path) -> None:
    course = tmp_path / "course"
    result = grade_one(course, "stall", LAB, _submission(), "--timeout", str(TIMEOUT))
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        notebook = gb.find_submission_notebook(LAB, LAB, "stall")
        grades = {g.name: (g.score, g.max_score) for g in notebook.grades}
    assert result["status"] == "graded" and not result["flags"], json.dumps(result)[:3000]
    assert grades["test_sinusoidal_encoding_shape"] == (0.0, 1.0), json.dumps(result)[:3000]
    assert result["auto_score"] == result["auto_max"] - 1.0, json.dumps(result)[:3000]
    html = (course / "feedback" / "stall" / LAB / f"{LAB}.html").read_text()
    assert f"did not return within {TIMEOUT} s" in html

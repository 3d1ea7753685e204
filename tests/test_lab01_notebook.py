"""Structure of the lab 01 source notebook (fast, no kernel): metadata, points, conventions.

The checks every lab shares (metadata and markers, the locked setup cell, the checks the test
cells call, the solution against its own test cells, a clean release) come from
``tests/notebook_support.py``; the rest is particular to lab 01. Its nbgrader round trip runs in
``tests/test_grading_pipeline.py``.
"""

from __future__ import annotations

import ast
from typing import Any

import nbformat
import notebook_support as nbs
import pytest
from notebook_support import meta

from transformer_lab.checks import lab01

LAB = "01_positional_encoding"
EXPECTED_POINTS = {"sinusoidal_encoding": 6, "relative_shift_matrix": 6, "written": 4}
ANSWERS = ("setup", "sinusoidal_encoding", "relative_shift_matrix")


@pytest.fixture(scope="module")
def source() -> nbformat.NotebookNode:
    return nbs.read_source(LAB)


def test_committed_without_outputs(source: Any) -> None:
    for notebook in (source, nbformat.read(str(nbs.release_path(LAB)), 4)):
        for cell in notebook.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None


def test_metadata_ids_points_and_markers(source: Any) -> None:
    nbs.assert_metadata(source, EXPECTED_POINTS)
    nbs.assert_points_table(source, (("sinusoidal_encoding", 6), ("relative_shift_matrix", 6)))


def test_setup_cell_first_and_locked(source: Any) -> None:
    first = nbs.assert_locked_setup_first(source)
    assert meta(first) == {
        "schema_version": 3,
        "grade_id": "setup",
        "grade": False,
        "solution": False,
        "locked": True,
    }
    for needle in ("KIT_SOURCE = ", "torch.manual_seed", "cuda", "current_profile()", "print("):
        assert needle in first.source


def test_graded_cells_points_and_names(source: Any) -> None:
    graded = [c for c in source.cells if meta(c).get("grade_id")]
    ids = [meta(c)["grade_id"] for c in graded]
    assert len(ids) == len(set(ids))
    auto = sum(meta(c)["points"] for c in graded if meta(c)["grade"] and c.cell_type == "code")
    manual = sum(meta(c)["points"] for c in graded if meta(c)["grade"] and meta(c)["solution"])
    assert (auto, manual) == (12, 4)
    # The graded functions are defined at top level, under the curriculum's names and signatures.
    answers = {meta(c)["grade_id"]: c.source for c in graded if meta(c)["solution"]}
    for name, args in (
        ("sinusoidal_encoding", ["seq_len", "d_model", "base"]),
        ("relative_shift_matrix", ["offset", "d_model", "base"]),
    ):
        tree = ast.parse(answers[name])
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
        assert fn.name == name and [a.arg for a in fn.args.args] == args
        assert ast.literal_eval(fn.args.defaults[0]) == 10000.0
        assert "### BEGIN SOLUTION" in answers[name] and "positional." not in answers[name]


def test_test_cells_call_existing_checks_visible_before_hidden(source: Any) -> None:
    nbs.assert_checks_exist_and_are_called(source, lab01)
    tests = [c for c in source.cells if meta(c).get("grade") and c.cell_type == "code"]
    for cell in tests:
        assert meta(cell)["locked"]
        called = [w.split("(")[0] for w in cell.source.split("lab01.")[1:]]
        assert called and all(callable(getattr(lab01, name)) for name in called)
        hidden = "### BEGIN HIDDEN TESTS" in cell.source
        assert hidden == all(name.startswith("hidden_check_") for name in called)
    # Per function: visible cells come before hidden ones.
    for fn in ("sinusoidal_encoding", "relative_shift_matrix"):
        kinds = ["HIDDEN" in c.source for c in tests if fn in c.source]
        assert kinds == sorted(kinds) and kinds.count(False) == 2 and kinds.count(True) == 2


def test_solution_passes_its_own_test_cells(source: Any) -> None:
    assert nbs.run_test_cells(source, ANSWERS) == 8


def test_written_answers_have_a_rubric(source: Any) -> None:
    written = [c for c in source.cells if c.cell_type == "markdown" and meta(c).get("grade")]
    assert len(written) == 2
    for cell in written:
        assert meta(cell)["solution"] and "rubric" in cell.source.lower()
        assert "1 point" in cell.source


def test_release_is_generated_and_holds_no_solution() -> None:
    # A line of the model answer to sinusoidal_encoding.
    nbs.assert_release_clean(LAB, "pe[:, 0::2] = torch.sin(angles)")

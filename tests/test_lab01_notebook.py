"""Structure of the lab 01 source notebook (fast, no kernel): metadata, points, conventions."""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

from transformer_lab.checks import lab01

REPO = Path(__file__).resolve().parents[1]
LAB = "01_positional_encoding"


@pytest.fixture(scope="module")
def source() -> nbformat.NotebookNode:
    return nbformat.read(str(REPO / "solutions" / LAB / f"{LAB}.ipynb"), as_version=4)


def _meta(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def test_committed_without_outputs(source) -> None:
    for notebook in (source, nbformat.read(str(REPO / "labs" / LAB / f"{LAB}.ipynb"), 4)):
        for cell in notebook.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None


def test_setup_cell_first_and_locked(source) -> None:
    first = next(c for c in source.cells if c.cell_type == "code")
    assert _meta(first) == {
        "schema_version": 3,
        "grade_id": "setup",
        "grade": False,
        "solution": False,
        "locked": True,
    }
    for needle in ("KIT_SOURCE = ", "torch.manual_seed", "cuda", "current_profile()", "print("):
        assert needle in first.source


def test_graded_cells_points_and_names(source) -> None:
    graded = [c for c in source.cells if _meta(c).get("grade_id")]
    ids = [_meta(c)["grade_id"] for c in graded]
    assert len(ids) == len(set(ids))
    auto = sum(_meta(c)["points"] for c in graded if _meta(c)["grade"] and c.cell_type == "code")
    manual = sum(_meta(c)["points"] for c in graded if _meta(c)["grade"] and _meta(c)["solution"])
    assert (auto, manual) == (12, 4)
    # The graded functions are defined at top level, under the curriculum's names and signatures.
    answers = {_meta(c)["grade_id"]: c.source for c in graded if _meta(c)["solution"]}
    for name, args in (
        ("sinusoidal_encoding", ["seq_len", "d_model", "base"]),
        ("relative_shift_matrix", ["offset", "d_model", "base"]),
    ):
        tree = ast.parse(answers[name])
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
        assert fn.name == name and [a.arg for a in fn.args.args] == args
        assert ast.literal_eval(fn.args.defaults[0]) == 10000.0
        assert "### BEGIN SOLUTION" in answers[name] and "positional." not in answers[name]


def test_test_cells_call_existing_checks_visible_before_hidden(source) -> None:
    tests = [c for c in source.cells if _meta(c).get("grade") and c.cell_type == "code"]
    for cell in tests:
        assert _meta(cell)["locked"]
        called = [w.split("(")[0] for w in cell.source.split("lab01.")[1:]]
        assert called and all(callable(getattr(lab01, name)) for name in called)
        hidden = "### BEGIN HIDDEN TESTS" in cell.source
        assert hidden == all(name.startswith("hidden_check_") for name in called)
    # Per function: visible cells come before hidden ones.
    for fn in ("sinusoidal_encoding", "relative_shift_matrix"):
        kinds = ["HIDDEN" in c.source for c in tests if fn in c.source]
        assert kinds == sorted(kinds) and kinds.count(False) == 2 and kinds.count(True) == 2


def test_written_answers_have_a_rubric(source) -> None:
    written = [c for c in source.cells if c.cell_type == "markdown" and _meta(c).get("grade")]
    assert len(written) == 2
    for cell in written:
        assert _meta(cell)["solution"] and "rubric" in cell.source.lower()
        assert "1 point" in cell.source

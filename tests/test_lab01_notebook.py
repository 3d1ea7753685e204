"""Structure of the lab 01 source notebook (fast, no kernel): metadata, points, conventions.

The checks every lab shares (metadata and markers, the locked setup cell, the checks the test
cells call, the solution against its own test cells, a clean release) are inherited from
:class:`notebook_support.LabNotebookTests`; the methods here are particular to lab 01. Its
nbgrader round trip runs in ``tests/test_grading_pipeline.py``.
"""

from __future__ import annotations

import ast
from typing import Any, ClassVar

import nbformat
from notebook_support import LabNotebookTests, meta, release_path

from transformer_lab.checks import lab01


class TestLab01(LabNotebookTests):
    LAB = "01_positional_encoding"
    CHECKS = lab01
    POINTS: ClassVar[dict[str, int]] = {
        "sinusoidal_encoding": 6,
        "relative_shift_matrix": 6,
        "written": 4,
    }
    TABLE = (("sinusoidal_encoding", 6), ("relative_shift_matrix", 6))
    ANSWERS = ("setup", "sinusoidal_encoding", "relative_shift_matrix")
    TEST_CELLS = 8
    LEAK = "pe[:, 0::2] = torch.sin(angles)"  # a line of the model answer
    ROUND_TRIP = False  # test_grading_pipeline.py grades the lab 01 course once per run

    def test_committed_without_outputs(self, notebook: Any) -> None:
        for nb in (notebook, nbformat.read(str(release_path(self.LAB)), 4)):
            for cell in nb.cells:
                if cell.cell_type == "code":
                    assert cell.outputs == [] and cell.execution_count is None

    def test_setup_cell_first_and_locked(self, notebook: Any) -> None:
        first = next(c for c in notebook.cells if c.cell_type == "code")
        assert meta(first) == {
            "schema_version": 3,
            "grade_id": "setup",
            "grade": False,
            "solution": False,
            "locked": True,
        }
        for needle in ("KIT_SOURCE = ", "torch.manual_seed", "cuda", "current_profile()", "print("):
            assert needle in first.source

    def test_graded_cells_points_and_names(self, notebook: Any) -> None:
        graded = [c for c in notebook.cells if meta(c).get("grade_id")]
        auto = sum(meta(c)["points"] for c in graded if meta(c)["grade"] and c.cell_type == "code")
        manual = sum(meta(c)["points"] for c in graded if meta(c)["grade"] and meta(c)["solution"])
        assert (auto, manual) == (12, 4)
        # The graded functions are defined at top level, under the curriculum's names and
        # signatures.
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

    def test_test_cells_call_existing_checks_visible_before_hidden(self, notebook: Any) -> None:
        tests = [c for c in notebook.cells if meta(c).get("grade") and c.cell_type == "code"]
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

    def test_written_answers_have_a_rubric(self, notebook: Any) -> None:
        written = [c for c in notebook.cells if c.cell_type == "markdown" and meta(c).get("grade")]
        assert len(written) == 2
        for cell in written:
            assert meta(cell)["solution"] and "rubric" in cell.source.lower()
            assert "1 point" in cell.source

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
from transformer_lab.grading.hidden import lab01 as hidden01
from transformer_lab.pysource import parse_python


class TestLab01(LabNotebookTests):
    LAB = "01_positional_encoding"
    CHECKS = lab01
    HIDDEN = hidden01
    POINTS: ClassVar[dict[str, int]] = {
        "sinusoidal_encoding": 6,
        "relative_shift_matrix": 6,
        "written": 6,
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

    def test_graded_cells_points_and_names(self, notebook: Any) -> None:
        graded = [c for c in notebook.cells if meta(c).get("grade_id")]
        auto = sum(meta(c)["points"] for c in graded if meta(c)["grade"] and c.cell_type == "code")
        manual = sum(meta(c)["points"] for c in graded if meta(c)["grade"] and meta(c)["solution"])
        assert (auto, manual) == (12, 6)
        # The graded functions are defined at top level, under the curriculum's names and
        # signatures.
        answers = {meta(c)["grade_id"]: c.source for c in graded if meta(c)["solution"]}
        for name, args in (
            ("sinusoidal_encoding", ["seq_len", "d_model", "base"]),
            ("relative_shift_matrix", ["offset", "d_model", "base"]),
        ):
            tree = parse_python(answers[name])
            fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
            assert fn.name == name and [a.arg for a in fn.args.args] == args
            assert ast.literal_eval(fn.args.defaults[0]) == 10000.0
            assert "### BEGIN SOLUTION" in answers[name] and "positional." not in answers[name]

    def test_written_answers_have_a_rubric(self, notebook: Any) -> None:
        written = [c for c in notebook.cells if c.cell_type == "markdown" and meta(c).get("grade")]
        assert len(written) == 3
        for cell in written:
            assert meta(cell)["solution"] and "rubric" in cell.source.lower()
            assert "1 point" in cell.source

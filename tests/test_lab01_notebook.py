"""Structure of the lab 01 source notebook (fast, no kernel): metadata, points, conventions.

The checks every lab shares (metadata and markers, the locked setup cell, the checks the test
cells call, the solution against its own test cells, a clean release) are inherited from
:class:`notebook_support.LabNotebookTests`; the methods here are particular to lab 01. Its
nbgrader round trip runs in ``tests/test_grading_pipeline.py``.
"""

from __future__ import annotations

from typing import Any

import nbformat
from notebook_support import LabNotebookTests, meta, release_path

from transformer_lab.checks import lab01
from transformer_lab.grading.hidden import lab01 as hidden01


class TestLab01(LabNotebookTests):
    LAB = "01_positional_encoding"
    CHECKS = lab01
    HIDDEN = hidden01
    TEST_CELLS = 8
    LEAK = "pe[:, 0::2] = torch.sin(angles)"  # a line of the model answer
    ROUND_TRIP = False  # test_grading_pipeline.py grades the lab 01 course once per run

    def test_committed_without_outputs(self, notebook: Any) -> None:
        for nb in (notebook, nbformat.read(str(release_path(self.LAB)), 4)):
            for cell in nb.cells:
                if cell.cell_type == "code":
                    assert cell.outputs == [] and cell.execution_count is None

    def test_answers_are_the_students_own(self, notebook: Any) -> None:
        # names, signatures and points: the spec's (test_agrees_with_its_spec)
        answers = {meta(c)["grade_id"]: c.source for c in notebook.cells if meta(c).get("solution")}
        for name in self.spec.parts:
            assert "### BEGIN SOLUTION" in answers[name] and "positional." not in answers[name]

    def test_written_answers_have_a_rubric(self, notebook: Any) -> None:
        written = [c for c in notebook.cells if c.cell_type == "markdown" and meta(c).get("grade")]
        assert len(written) == 3
        for cell in written:
            assert meta(cell)["solution"] and "rubric" in cell.source.lower()
            assert "1 point" in cell.source

"""Structure of the lab 04 source notebook (fast, no kernel): metadata, points, conventions.

The checks every lab shares (metadata and markers, the locked setup cell, the checks the test
cells call, the solution against its own test cells, a clean release, the nbgrader round trip)
are inherited from :class:`notebook_support.LabNotebookTests`; the methods here are particular to
lab 04. The training cell is left out of the fast run of the test cells (the round trip grades
it).
"""

from __future__ import annotations

from typing import Any

from notebook_support import LabNotebookTests, meta

from transformer_lab.checks import lab04
from transformer_lab.grading.hidden import lab04 as hidden04


class TestLab04(LabNotebookTests):
    LAB = "04_transformer_block"
    CHECKS = lab04
    HIDDEN = hidden04
    TEST_CELLS = 15  # every test cell but the trained encoder's
    SKIP = "trained_encoder"
    LEAK = "var = (centred**2).mean(dim=-1, keepdim=True)  # (..., 1), the biased variance"

    def test_the_lightning_exercise_gives_init_and_forward(self, notebook: Any) -> None:
        # names, signatures and points: the spec's (test_agrees_with_its_spec)
        answers = {meta(c)["grade_id"]: c.source for c in notebook.cells if meta(c).get("solution")}
        # The Lightning exercise leaves __init__ and forward to the student as given code.
        module = answers["tagging_module"]
        assert module.count("### BEGIN SOLUTION") == 2
        assert module.index("def training_step") < module.index("### BEGIN SOLUTION")

    def test_training_cells_use_the_session_and_no_kit_answer(self, notebook: Any) -> None:
        code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
        assert "tempfile" not in code and "mkdtemp" not in code
        assert "CSVLogger(session.runs" in code
        assert "session.device" in code and "session.precision" in code
        assert "session.grading" in code
        # The kit's answers of this lab are locked while it is graded: none is used.
        assert "ClassifierModule" not in code and "blocks.EncoderBlock(" not in code
        assert "nn.LayerNorm(D_MODEL)" in code  # the pre-norm stack's final norm is torch's

    def test_written_answers_have_a_rubric(self, notebook: Any) -> None:
        written = [c for c in notebook.cells if c.cell_type == "markdown" and meta(c).get("grade")]
        assert [meta(c)["points"] for c in written] == [2, 2, 3, 3]
        for cell in written:
            assert meta(cell)["solution"] and "rubric" in cell.source.lower()
            assert "1 point" in cell.source

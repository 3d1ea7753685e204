"""Structure of the lab 07 source notebook (fast, no kernel): metadata, points, conventions.

The checks every lab shares (metadata and markers, the locked setup cell, the checks the test
cells call, the solution against its own test cells, a clean release, the nbgrader round trip)
are inherited from :class:`notebook_support.LabNotebookTests`; the methods here are particular
to lab 07: the graded signatures, the written answers, the optional library comparison, and
what the demos may use in a kernel where lab 07 and later labs are locked.
"""

from __future__ import annotations

from typing import Any

from notebook_support import LabNotebookTests, meta

from transformer_lab.checks import lab07
from transformer_lab.grading.hidden import lab07 as hidden07


class TestLab07(LabNotebookTests):
    LAB = "07_nlp_pipeline"
    CHECKS = lab07
    HIDDEN = hidden07
    TEST_CELLS = 22
    LEAK = "best = min(pairs, key=lambda pair: (-pairs[pair], pair))"  # a line of the model answer

    def test_every_answer_is_a_solution_region(self, notebook: Any) -> None:
        # names, signatures and points: the spec's (test_agrees_with_its_spec)
        answers = {meta(c)["grade_id"]: c.source for c in notebook.cells if meta(c).get("solution")}
        for name in self.spec.parts:
            assert "### BEGIN SOLUTION" in answers[name]
        assert answers["CharTokenizer"].count("### BEGIN SOLUTION") == 5

    def test_written_answers_have_a_rubric(self, notebook: Any) -> None:
        written = [c for c in notebook.cells if c.cell_type == "markdown" and meta(c).get("grade")]
        assert [meta(c)["grade_id"] for c in written] == [
            "written_merges",
            "written_temperature",
            "written_strategies",
        ]
        for cell in written:
            assert meta(cell)["solution"] and "rubric" in cell.source.lower()
            assert "1 point" in cell.source

    def test_the_library_comparison_is_optional_and_ungraded(self, notebook: Any) -> None:
        # Hugging Face `tokenizers` is an optional extra: only one demo imports it, inside a
        # try/except ImportError that prints one line; no graded cell depends on it.
        users = [c for c in notebook.cells if "tokenizers import" in c.source]
        assert len(users) == 1
        cell = users[0]
        assert not meta(cell).get("grade") and meta(cell).get("locked")
        assert "except ImportError:" in cell.source and "is not installed" in cell.source
        setup = next(c for c in notebook.cells if meta(c).get("grade_id") == "setup")
        assert "from tokenizers" not in setup.source

    def test_demos_use_no_answer_of_this_or_a_later_lab(self, notebook: Any) -> None:
        # In the grading kernel the kit's answers of lab 07 and later are locked: the demos run
        # the student's functions (lab.yours_or_kit) and earlier labs' kit pieces only.
        source = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
        for locked in (
            "transformer_lab.models",
            "import GPT",
            "generation import",
            "BPETokenizer",
            "tokenizers.CharTokenizer(",
            "sample_next",
        ):
            assert locked not in source, locked
        assert "from transformer_lab.blocks import EncoderBlock" in source  # lab 04
        assert "from transformer_lab.masks import causal_mask" in source  # lab 05

    def test_training_cells_follow_the_session(self, notebook: Any) -> None:
        source = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
        assert "session.precision" in source and "session.runs" in source
        assert "session.grading" in source and ".to(device)" in source  # device: session.device
        assert "tempfile" not in source

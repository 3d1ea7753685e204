"""Structure of the lab 04 source notebook (fast, no kernel): metadata, points, conventions.

The checks every lab shares (metadata and markers, the locked setup cell, the checks the test
cells call, the solution against its own test cells, a clean release, the nbgrader round trip)
are inherited from :class:`notebook_support.LabNotebookTests`; the methods here are particular to
lab 04. The training cell is left out of the fast run of the test cells (the round trip grades
it).
"""

from __future__ import annotations

import ast
from typing import Any, ClassVar

from notebook_support import LabNotebookTests, meta

from transformer_lab.checks import lab04
from transformer_lab.grading.hidden import lab04 as hidden04
from transformer_lab.pysource import parse_python


class TestLab04(LabNotebookTests):
    LAB = "04_transformer_block"
    CHECKS = lab04
    HIDDEN = hidden04
    POINTS: ClassVar[dict[str, int]] = {
        "layer_norm": 6,
        "feed_forward": 4,
        "encoder_block": 10,
        "tagging_module": 8,
        "trained_encoder": 2,
        "written": 10,
    }
    TABLE = (
        ("layer_norm", 6),
        ("FeedForward", 4),
        ("EncoderBlock", 10),
        ("TaggingModule", 8),
    )
    ANSWERS = ("setup", "layer_norm", "feed_forward", "encoder_block", "tagging_module")
    TEST_CELLS = 15  # every test cell but the trained encoder's
    SKIP = "trained_encoder"
    LEAK = "var = (centred**2).mean(dim=-1, keepdim=True)  # (..., 1), the biased variance"

    def test_graded_names_and_signatures_follow_the_curriculum(self, notebook: Any) -> None:
        answers = {meta(c)["grade_id"]: c.source for c in notebook.cells if meta(c).get("solution")}
        tree = parse_python(answers["layer_norm"])
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
        assert fn.name == "layer_norm"
        assert [a.arg for a in fn.args.args] == ["x", "weight", "bias", "eps"]
        for grade_id, name, args in (
            ("feed_forward", "FeedForward", ["self", "d_model", "d_ff", "dropout"]),
            (
                "encoder_block",
                "EncoderBlock",
                ["self", "d_model", "n_heads", "d_ff", "dropout", "norm_first"],
            ),
            (
                "tagging_module",
                "TaggingModule",
                ["self", "model", "lr", "weight_decay", "warmup_steps", "total_steps"],
            ),
        ):
            cls = next(
                n for n in parse_python(answers[grade_id]).body if isinstance(n, ast.ClassDef)
            )
            init = next(n for n in cls.body if getattr(n, "name", "") == "__init__")
            assert cls.name == name and [a.arg for a in init.args.args] == args
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

"""Structure of the lab 02 source notebook (fast, no kernel): metadata, points, demos.

The checks every lab shares (metadata and markers, the locked setup cell, the checks the test
cells call, the solution against its own test cells, a clean release, the nbgrader round trip)
are inherited from :class:`notebook_support.LabNotebookTests`; the methods here are particular
to lab 02: the graded signatures, the written questions, and demos that run the student's own
functions (never the kit's answers of this lab, which the grader's kit holds locked).
"""

from __future__ import annotations

import re
from typing import Any

from notebook_support import LabNotebookTests, meta

from transformer_lab.checks import lab02
from transformer_lab.grading.hidden import lab02 as hidden02


class TestLab02(LabNotebookTests):
    LAB = "02_self_attention"
    CHECKS = lab02
    HIDDEN = hidden02
    TEST_CELLS = 13
    LEAK = "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)"

    def test_demos_run_the_students_code_not_the_kits_answers(self, notebook: Any) -> None:
        code = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
        # The kit's answers of this lab (and later labs) are locked while the lab is graded: a
        # demo names them only as the fallback of lab.yours_or_kit (kit="...").
        calls = re.sub(r'kit="[^"]*"', "", code)
        assert not re.search(r"\battention\.\w|MultiHeadAttention|masked_attention", calls)
        for name in ("softmax", "self_attention_matrix", "scaled_dot_product_attention"):
            assert f"lab.yours_or_kit(\n    {name}," in code or f"lab.yours_or_kit({name}," in code

    def test_written_answers_have_a_rubric(self, notebook: Any) -> None:
        written = [c for c in notebook.cells if c.cell_type == "markdown" and meta(c).get("grade")]
        assert len(written) == 4
        assert sum(meta(c)["points"] for c in written) == 9
        for cell in written:
            assert meta(cell)["solution"] and "rubric" in cell.source.lower()
            assert "1 point" in cell.source


def test_the_lab_02_diagrams_draw_and_validate() -> None:
    import pytest
    import torch
    from matplotlib.figure import Figure

    from transformer_lab import diagrams

    assert isinstance(diagrams.attention_shapes(n=4, d=3, d_k=2, d_v=5, token=3), Figure)
    words = ["the", "restaurant", "said", "their"]
    fig = diagrams.attention_to_text(words, torch.tensor([0.1, 0.7, 0.1, 0.1]), 3, per_line=3)
    assert isinstance(fig, Figure)
    with pytest.raises(ValueError, match="token=5"):
        diagrams.attention_shapes(n=5, token=5)
    with pytest.raises(ValueError, match="3 weights for 4 tokens"):
        diagrams.attention_to_text(words, [0.2, 0.3, 0.5], 0)

"""Lab 03 (multi-head attention): the shared notebook tests with this lab's numbers.

The tests are :class:`notebook_support.LabNotebookTests`; the methods here are particular to
lab 03: the graded names and signatures of the curriculum, the written questions and their
rubrics, and demos that run the student's own classes (never the kit's lab-03 answers, which
are locked while the lab is graded).
"""

from __future__ import annotations

from typing import Any

from notebook_support import LabNotebookTests, meta

from transformer_lab.checks import lab03
from transformer_lab.grading.hidden import lab03 as hidden03


class TestLab03(LabNotebookTests):
    LAB = "03_multi_head_attention"
    CHECKS = lab03
    HIDDEN = hidden03
    TEST_CELLS = 13
    LEAK = "in_proj_weight.split(D)"  # a line of the model answer to load_torch_weights

    def test_written_answers_have_a_rubric(self, notebook: Any) -> None:
        written = [c for c in notebook.cells if c.cell_type == "markdown" and meta(c).get("grade")]
        assert [meta(c)["points"] for c in written] == [2, 2, 3]
        for cell in written:
            assert meta(cell)["solution"] and "rubric" in cell.source.lower()
            assert "1 point" in cell.source

    def test_demos_run_the_students_classes_not_the_kits_answers(self, notebook: Any) -> None:
        demos = [
            c.source for c in notebook.cells if meta(c).get("grade_id", "").startswith("demo_")
        ]
        assert len(demos) >= 6
        text = "\n".join(demos)
        for kit_answer in ("attention.MultiHeadAttention(", "attention.split_heads(",
                           "attention.merge_heads(", "attention.load_torch_weights("):  # fmt: skip
            assert kit_answer not in text
        for name in ("MultiHeadAttention", "split_heads", "merge_heads", "load_torch_weights"):
            assert f"lab.yours_or_kit({name}," in text


def test_the_lab_03_diagrams_draw_what_they_are_given() -> None:
    import pytest
    import torch
    from matplotlib.figure import Figure

    from transformer_lab import diagrams

    assert isinstance(diagrams.head_split_diagram(4, 8, 2), Figure)
    assert isinstance(diagrams.head_split_diagram(3, 12, 4), Figure)
    with pytest.raises(ValueError, match="n_heads=5"):
        diagrams.head_split_diagram(4, 8, 5)
    ids = torch.arange(32.0).reshape(1, 4, 8)  # (B, T, D): entry t * D + d
    heads = torch.stack(ids[0].chunk(2, dim=-1))[None]  # (1, H, T, Dh)
    fig = diagrams.split_merge_figure(ids, heads, ids)
    labels = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert {"0:0", "3:7", "2:5"} <= labels
    with pytest.raises(ValueError, match="do not make d_model"):
        diagrams.split_merge_figure(ids, heads[:, :, :, :3], ids)
    weights = torch.softmax(torch.randn(2, 4, 11, 11), dim=-1)  # (N, H, T, S)
    words = [
        "the",
        "animal",
        "didn't",
        "cross",
        "the",
        "street",
        "because",
        "it",
        "was",
        "too",
        "tired",
    ]
    fig = diagrams.query_rows_by_head([weights[0], weights[1]], [words, words], 7, ["a", "b"])
    assert len(fig.axes) == 3  # two heat maps and the colour bar
    with pytest.raises(ValueError, match="one weight tensor"):
        diagrams.query_rows_by_head([weights[0]], [words, words], 7)

"""Structure of the lab 05 source notebook, and what its experiments show (no nbgrader).

The checks every lab shares (metadata and markers, the locked setup cell, the checks the test
cells call, the solution against its own test cells, a clean release, the nbgrader round trip)
are inherited from :class:`notebook_support.LabNotebookTests`; the methods here are particular
to lab 05: the curriculum's signatures, the demos on the student's own functions, and a run of
every code cell in the grading profile whose printed results must tell the lab's story (the
detector finds the leak in the mystery model's second block; its training loss is far below the
honest model's, and far above it once the future is cut off).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from notebook_support import LabNotebookTests, meta, run_all_cells

from transformer_lab.checks import lab05
from transformer_lab.grading.hidden import lab05 as hidden05


class TestLab05(LabNotebookTests):
    LAB = "05_masking"
    CHECKS = lab05
    HIDDEN = hidden05
    TEST_CELLS = 13
    LEAK = "return keys & causal  # (B, 1, T, T): both must allow"

    def test_answers_call_no_kit_function(self, notebook: Any) -> None:
        # names, signatures and points: the spec's (test_agrees_with_its_spec)
        answers = {meta(c)["grade_id"]: c.source for c in notebook.cells if meta(c).get("solution")}
        for name in self.spec.parts:
            assert not re.search(r"\b(masks|attention|F)\.\w+\(", answers[name])  # no kit call

    def test_every_graded_function_has_a_demo_on_the_students_own_code(self, notebook: Any) -> None:
        demos = "\n".join(
            c.source for c in notebook.cells if meta(c).get("grade_id", "").startswith("demo_")
        )
        for part in self.spec.parts.values():  # the check it is saved on, its kit answer
            assert re.search(
                rf"yours_or_kit\(\s*{part.name},\s*check=lab05\.{part.check},\s*"
                rf'kit="{re.escape(part.kit_answer or "")}"',
                demos,
            ), part.name

    def test_written_answers_have_a_rubric(self, notebook: Any) -> None:
        written = [c for c in notebook.cells if c.cell_type == "markdown" and meta(c).get("grade")]
        assert [meta(c)["points"] for c in written] == [2, 2, 3]
        for cell in written:
            assert meta(cell)["solution"] and "rubric" in cell.source.lower()
            assert "1 point" in cell.source

    def test_the_intro_states_measured_times(self, notebook: Any) -> None:
        intro = notebook.cells[0].source
        assert re.search(r"\*\*Time:\*\* about \d+ minutes", intro)
        assert "grading profile" in intro and "full profile" in intro
        # its GPU time: measured (an H200, where lab.CPU_LABS runs it on the CPU all the same)
        assert "NVIDIA H200" in intro and "runs on the CPU" in intro

    @pytest.mark.slow
    def test_the_experiments_tell_the_story(self, notebook: Any, tmp_path: Path) -> None:
        """Every code cell, in order, in the grading profile: the printed results."""
        text = run_all_cells(notebook, tmp_path)
        assert "honest: the whole model depends on the future? False" in text
        assert "mystery: the whole model depends on the future? True" in text
        assert "mystery, block 1 alone: depends on the future? False" in text
        assert "mystery, block 2 alone: depends on the future? True" in text
        assert (tmp_path / "runs" / "05_masking" / "losses.csv").is_file()
        losses = {
            name: (float(forced), float(generating))
            for name, forced, generating in re.findall(
                r"(honest|mystery): teacher-forced loss ([\d.]+), at generation time ([\d.]+)", text
            )
        }
        honest, mystery = losses["honest"], losses["mystery"]
        assert mystery[0] < 0.2 < 1.5 < honest[0] < 2.0  # the too-good training loss
        assert abs(honest[1] - honest[0]) < 1e-3  # a causal model: the same loss both ways
        assert mystery[1] > 3.0  # no better than guessing once the future is gone
        # The float16 experiment: -1e9 fails or gives NaN, the student's version does not.
        assert re.search(r"\bfloat16\s+masked_fill\(-1e9\): RuntimeError", text)
        assert re.search(r"\bfloat16\s+where\(-1e9\):\s+\d+ NaN", text)
        assert not re.search(r"\bfloat16\s+where\(-1e9\):\s+0 NaN", text)
        assert re.search(r"\bfloat16\s+yours:\s+0 NaN .* summing to 0.00", text)


def test_the_lab05_diagrams_draw_masks_weights_and_losses() -> None:
    import torch
    from matplotlib.figure import Figure

    from transformer_lab import diagrams

    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    words = ["<bos>", "the", "man", "ate"]
    fig = diagrams.mask_grid({"causal": causal, "padding": causal[:2]}, row_labels=[words, None])
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    weights = torch.softmax(torch.randn(4, 4).masked_fill(~causal, -torch.inf), dim=-1)
    fig = diagrams.weight_grid({"weights": weights}, row_labels=[words])
    assert "row sums 1.00..1.00" in fig.axes[0].get_title()
    fig = diagrams.loss_race({"honest": [3.0, 2.0, 1.7]}, levels={"at generation": 1.7})
    assert len(fig.axes[0].lines) == 2
    with pytest.raises(ValueError, match="2-D table"):
        diagrams.mask_grid({"3-D": causal[None]})
    with pytest.raises(ValueError, match="nothing to draw"):
        diagrams.loss_race({})

"""Structure of the lab 06 source notebook (fast, no kernel): metadata, points, conventions.

The checks every lab shares (metadata and markers, the locked setup cell, the checks the test
cells call, the solution against its own test cells, a clean release, the nbgrader round trip)
are inherited from :class:`notebook_support.LabNotebookTests`; the methods here are particular
to lab 06. The two test cells that train the translator are left out of the fast run of the test
cells (the round trip runs them).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from notebook_support import LabNotebookTests, meta

from transformer_lab.checks import lab06
from transformer_lab.grading.hidden import lab06 as hidden06


class TestLab06(LabNotebookTests):
    LAB = "06_decoder_training"
    CHECKS = lab06
    HIDDEN = hidden06
    SETUP = ("setup", "demo_data")  # the demo data the answers train on
    TEST_CELLS = 18
    SKIP = "trained"
    LEAK = "next_token = next_token.masked_fill(done, pad_id)"  # a line of the model answer

    @pytest.fixture(autouse=True)
    def _runs_in_tmp(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        # The test cells train under session.runs (runs/ beside the notebook): keep them out
        # of the repository.
        monkeypatch.chdir(tmp_path)

    def test_the_lightning_exercise_leaves_three_methods(self, notebook: Any) -> None:
        # names, signatures and points: the spec's (test_agrees_with_its_spec)
        answers = {meta(c)["grade_id"]: c.source for c in notebook.cells if meta(c).get("solution")}
        assert answers["TranslationModule"].count("### BEGIN SOLUTION") == 3

    def test_written_answers_have_a_rubric(self, notebook: Any) -> None:
        written = [c for c in notebook.cells if c.cell_type == "markdown" and meta(c).get("grade")]
        assert [meta(c)["grade_id"] for c in written] == [
            "written_warmup",
            "written_parallel",
            "written_no_shift",
        ]
        for cell in written:
            assert meta(cell)["solution"] and "rubric" in cell.source.lower()
            assert "1 point" in cell.source

    def test_training_cells_follow_the_session(self, notebook: Any) -> None:
        source = "\n".join(c.source for c in notebook.cells if c.cell_type == "code")
        assert "session.precision" in source and "session.runs" in source
        assert "session.grading" in source and "tempfile" not in source


_NO_SHIFT_CELLS = (
    "setup", "demo_data", "DecoderBlock", "demo_decoder_block", "demo_build_translator",
    "shift_right", "sequence_loss", "TranslationModule", "demo_schedule", "train_translator",
    "demo_train_translator", "greedy_decode", "demo_translate", "demo_no_shift",
)  # fmt: skip
_NO_SHIFT_LINE = re.compile(
    r"^ *(?P<name>shifted \(yours\)|unshifted): training loss at step (?P<step>\d+): "
    r"(?P<loss>[\d.]+); validation exact match \(teacher forcing\) (?P<forced>[\d.]+)%; "
    r"decoded greedily (?P<greedy>[\d.]+)%$"
)


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["grading", "full"])
def test_the_no_shift_experiment_makes_its_point_in_every_profile(
    profile: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Question 3 relies on the unshifted model's training loss falling much faster than the
    real translator's, and on its teacher-forced exact match being high while its greedy
    translations fail. The demo's cell runs as written; the translator trains only the steps
    the comparison reads (its own schedule), which give the same curve up to there."""
    import contextlib
    import io
    import linecache

    from notebook_support import read_source

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRANSFORMER_LAB_PROFILE", profile)
    monkeypatch.setenv("TRANSFORMER_LAB_ANSWERS", str(tmp_path / "my_answers"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    cells = {meta(c).get("grade_id"): c.source for c in read_source("06_decoder_training").cells}
    space: dict[str, Any] = {"display": lambda *a, **k: None, "In": [""]}
    printed = io.StringIO()
    for gid in _NO_SHIFT_CELLS:
        source = re.sub(r"\s*### (BEGIN|END) SOLUTION", "", cells[gid])
        if gid == "demo_train_translator":  # only the steps the comparison reads
            source = source.replace("max_steps=TRAIN_STEPS", "max_steps=50")
        filename = f"<cell {gid}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        space["In"].append(source)
        with contextlib.redirect_stdout(printed):
            exec(compile(source, filename, "exec"), space)
    lines = printed.getvalue().splitlines()
    rows = {m["name"]: m for line in lines if (m := _NO_SHIFT_LINE.match(line))}
    yours, unshifted = rows["shifted (yours)"], rows["unshifted"]
    assert yours["step"] == unshifted["step"] == "49", printed.getvalue()[-2000:]
    assert float(unshifted["loss"]) < float(yours["loss"]) / 2, (yours, unshifted)
    assert float(unshifted["forced"]) >= 80 and float(unshifted["greedy"]) <= 20, unshifted
